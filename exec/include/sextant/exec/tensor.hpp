// Tensors of the executor: a shape and an element type over a buffer owned by a backend (host
// memory for the CPU backend, device memory for CUDA). Parameters' master values, gradients and
// optimizer state are fp32; activations and the compute copy of the parameters are fp32 or, in
// mixed precision, bf16 (see Backend::activation_dtype).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

namespace sextant::exec {

class DeviceMemory;

enum class DType { kF32, kBF16 };

inline int64_t element_size(DType d) {
  return d == DType::kF32 ? 4 : 2;
}
inline const char* dtype_name(DType d) {
  return d == DType::kF32 ? "fp32" : "bf16";
}

// bf16 as its bit pattern: the upper half of an fp32, rounded to nearest even (NaN stays NaN).
inline uint16_t to_bf16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f = 0;
  std::memcpy(&f, &u, 4);
  return f;
}

// Memory from a backend, freed by it.
class Buffer {
 public:
  Buffer(DeviceMemory* backend, void* data, int64_t bytes)
      : backend_(backend), data_(data), bytes_(bytes) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();
  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  DeviceMemory* backend_;
  void* data_;
  int64_t bytes_;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Buffer> buffer, std::vector<int64_t> shape, DType dtype = DType::kF32,
         int64_t offset = 0)
      : buffer_(std::move(buffer)), shape_(std::move(shape)), dtype_(dtype), offset_(offset) {}

  // The elements of an fp32 tensor; a logic error on bf16 (a mixed-precision path that forgot to
  // convert is caught here, on the CPU tests, instead of reading garbage). Inline: kernels call it
  // in loops.
  float* data() const {
    if (dtype_ != DType::kF32) [[unlikely]]
      throw_not_fp32();
    return static_cast<float*>(raw());
  }
  // The first element, of either type.
  void* raw() const { return static_cast<char*>(buffer_->data()) + offset_ * element_size(dtype_); }
  DType dtype() const { return dtype_; }
  int64_t bytes() const { return numel() * element_size(dtype_); }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  int64_t numel() const {
    return std::accumulate(shape_.begin(), shape_.end(), int64_t{1}, std::multiplies<>());
  }
  bool empty() const { return buffer_ == nullptr; }
  // The same memory with another shape of equal size.
  Tensor view(std::vector<int64_t> shape) const;
  // A contiguous slice along the first dimension: rows [begin, begin + count).
  Tensor rows(int64_t begin, int64_t count) const;

 private:
  [[noreturn]] void throw_not_fp32() const;

  std::shared_ptr<Buffer> buffer_;
  std::vector<int64_t> shape_;
  DType dtype_ = DType::kF32;
  int64_t offset_ = 0;  // in elements
};

}  // namespace sextant::exec
