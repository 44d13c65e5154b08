// Tensor views and buffer release.
#include "sextant/exec/tensor.hpp"

#include <cstdlib>

#include "sextant/exec/kernels/memory.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {

Buffer::~Buffer() {
  if (backend_ != nullptr && data_ != nullptr) backend_->release(data_);
}

void Tensor::throw_not_fp32() const {
  SEXTANT_CHECK(false, "fp32 access to a {} tensor", dtype_name(dtype_));
  std::abort();  // not reached: the check throws
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

}  // namespace sextant::exec
