// Tensors of the executor: a shape over a buffer owned by a backend (host memory for the CPU
// backend, device memory for CUDA). Elements are fp32 on the CPU backend.
#pragma once

#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

namespace sextant::exec {

class Backend;

// Memory from a backend, freed by it.
class Buffer {
 public:
  Buffer(Backend* backend, float* data, int64_t elements)
      : backend_(backend), data_(data), elements_(elements) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();
  float* data() const { return data_; }
  int64_t elements() const { return elements_; }

 private:
  Backend* backend_;
  float* data_;
  int64_t elements_;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Buffer> buffer, std::vector<int64_t> shape, int64_t offset = 0)
      : buffer_(std::move(buffer)), shape_(std::move(shape)), offset_(offset) {}

  float* data() const { return buffer_->data() + offset_; }
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
  std::shared_ptr<Buffer> buffer_;
  std::vector<int64_t> shape_;
  int64_t offset_ = 0;
};

}  // namespace sextant::exec
