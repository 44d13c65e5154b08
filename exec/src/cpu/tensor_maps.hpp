// A host fp32 tensor seen as a row-major matrix: its last dimension is the columns, everything
// before it the rows. The CPU kernels' one way to hand a Tensor to Eigen.
#pragma once

#include <cstdint>

#include "core/eigen_maps.hpp"
#include "sextant/exec/tensor.hpp"

namespace sextant::exec::cpu {

using namespace eigen;  // NOLINT(google-build-using-namespace): the kernels' Eigen vocabulary

inline int64_t rows_of(const Tensor& t) {
  return t.numel() / t.shape().back();
}
inline int64_t cols_of(const Tensor& t) {
  return t.shape().back();
}
inline ConstMap cmat(const Tensor& t) {
  return ConstMap(t.data(), rows_of(t), cols_of(t));
}
inline Map mat(Tensor& t) {
  return Map(t.data(), rows_of(t), cols_of(t));
}

}  // namespace sextant::exec::cpu
