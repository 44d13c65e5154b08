// Eigen views of host fp32 tensors as row-major matrices, shared by the CPU kernels (the backend,
// the CNN kernels and context-parallel attention): whole, or with a row stride (one head's
// columns of a fused activation).
#pragma once

#include <Eigen/Dense>

namespace sextant::exec::eigen {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Map = Eigen::Map<RowMat>;
using ConstMap = Eigen::Map<const RowMat>;
using StridedMap = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;
using ConstStridedMap = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;

}  // namespace sextant::exec::eigen
