// GEMMs and bias terms on Eigen's row-major maps (Eigen picks its blocked kernels for the ISA the
// build targets).
#include "cpu_backend.hpp"
#include "sextant/spec/error.hpp"
#include "tensor_maps.hpp"

namespace sextant::exec::cpu {

void CpuBackend::matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y,
                        bool accumulate) {
  auto X = cmat(x);
  auto W = cmat(w);
  auto Y = mat(y);
  SEXTANT_CHECK(X.cols() == W.rows() && Y.rows() == X.rows() && Y.cols() == W.cols(),
                "matmul shapes [{}x{}] @ [{}x{}] -> [{}x{}]", X.rows(), X.cols(), W.rows(),
                W.cols(), Y.rows(), Y.cols());
  if (accumulate) {
    Y.noalias() += X * W;
  } else {
    Y.noalias() = X * W;
  }
  if (bias != nullptr) Y.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(bias->data(), W.cols());
}

void CpuBackend::matmul_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                                 Tensor& dw, Tensor* db, bool accumulate_dx) {
  auto X = cmat(x);
  auto W = cmat(w);
  auto DY = cmat(dy);
  if (dx != nullptr) {
    auto DX = mat(*dx);
    if (accumulate_dx) {
      DX.noalias() += DY * W.transpose();
    } else {
      DX.noalias() = DY * W.transpose();
    }
  }
  mat(dw).noalias() += X.transpose() * DY;
  if (db != nullptr) Eigen::Map<Eigen::RowVectorXf>(db->data(), DY.cols()) += DY.colwise().sum();
}

void CpuBackend::matmul_nt(const Tensor& x, const Tensor& w, Tensor& y) {
  mat(y).noalias() = cmat(x) * cmat(w).transpose();
}

void CpuBackend::matmul_nt_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                                    Tensor& dw) {
  mat(dx).noalias() = cmat(dy) * cmat(w);
  mat(dw).noalias() += cmat(dy).transpose() * cmat(x);
}

void CpuBackend::bias_add(Tensor& y, const Tensor& b) {
  mat(y).rowwise() += Eigen::Map<const Eigen::RowVectorXf>(b.data(), b.numel());
}

void CpuBackend::bias_backward(const Tensor& dy, Tensor& db) {
  Eigen::Map<Eigen::RowVectorXf>(db.data(), db.numel()) += cmat(dy).colwise().sum();
}

}  // namespace sextant::exec::cpu
