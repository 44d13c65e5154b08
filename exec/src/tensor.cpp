// Tensor views and buffer release.
#include "sextant/exec/tensor.hpp"

#include "sextant/exec/backend.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {

Buffer::~Buffer() {
  if (backend_ != nullptr && data_ != nullptr) backend_->release(data_);
}

float* Tensor::data() const {
  SEXTANT_CHECK(dtype_ == DType::kF32, "fp32 access to a {} tensor", dtype_name(dtype_));
  return static_cast<float*>(raw());
}

Tensor Tensor::view(std::vector<int64_t> shape) const {
  Tensor t(buffer_, std::move(shape), dtype_, offset_);
  SEXTANT_CHECK(t.numel() == numel(), "view of {} elements as {}", numel(), t.numel());
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  SEXTANT_CHECK(!shape_.empty() && begin >= 0 && begin + count <= shape_[0], "rows out of range");
  int64_t row = numel() / shape_[0];
  std::vector<int64_t> s = shape_;
  s[0] = count;
  return Tensor(buffer_, s, dtype_, offset_ + begin * row);
}

Tensor Backend::empty(std::vector<int64_t> shape, DType dtype) {
  int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  const int64_t bytes = std::max<int64_t>(n, 1) * element_size(dtype);
  auto buffer = std::make_shared<Buffer>(this, allocate(bytes), bytes);
  return Tensor(std::move(buffer), std::move(shape), dtype);
}

Tensor Backend::zeros(std::vector<int64_t> shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  fill(t, 0.0f);
  return t;
}

}  // namespace sextant::exec
