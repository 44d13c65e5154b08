// Tensor views and buffer release.
#include "sextant/exec/tensor.hpp"

#include "sextant/exec/backend.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {

Buffer::~Buffer() {
  if (backend_ != nullptr && data_ != nullptr) backend_->release(data_);
}

Tensor Tensor::view(std::vector<int64_t> shape) const {
  Tensor t(buffer_, std::move(shape), offset_);
  SEXTANT_CHECK(t.numel() == numel(), "view of {} elements as {}", numel(), t.numel());
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  SEXTANT_CHECK(!shape_.empty() && begin >= 0 && begin + count <= shape_[0], "rows out of range");
  int64_t row = numel() / shape_[0];
  std::vector<int64_t> s = shape_;
  s[0] = count;
  return Tensor(buffer_, s, offset_ + begin * row);
}

Tensor Backend::empty(std::vector<int64_t> shape) {
  int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  auto buffer = std::make_shared<Buffer>(this, allocate(std::max<int64_t>(n, 1)), n);
  return Tensor(std::move(buffer), std::move(shape));
}

Tensor Backend::zeros(std::vector<int64_t> shape) {
  Tensor t = empty(std::move(shape));
  fill(t, 0.0f);
  return t;
}

}  // namespace sextant::exec
