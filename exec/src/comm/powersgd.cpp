// PowerSGD's bucket exchange (Vogels et al. 2019) with Eigen on host memory.
#include "sextant/exec/powersgd.hpp"

#include <algorithm>
#include <cmath>

#include "core/eigen_maps.hpp"
#include "sextant/exec/parameters.hpp"

namespace sextant::exec {

void powersgd_multiply(const float* m, int64_t rows, int64_t cols, const float* q, int64_t rank,
                       float* p) {
  eigen::Map(p, rows, rank).noalias() =
      eigen::ConstMap(m, rows, cols) * eigen::ConstMap(q, cols, rank);
}

void powersgd_multiply_transposed(const float* m, int64_t rows, int64_t cols, const float* p,
                                  int64_t rank, float* q) {
  eigen::Map(q, cols, rank).noalias() =
      eigen::ConstMap(m, rows, cols).transpose() * eigen::ConstMap(p, rows, rank);
}

void orthonormalise_columns(float* p, int64_t rows, int64_t rank) {
  eigen::Map P(p, rows, rank);
  for (int64_t i = 0; i < rank; ++i) {
    P.col(i) /= P.col(i).norm() + 1e-8f;
    for (int64_t j = i + 1; j < rank; ++j) P.col(j) -= P.col(i).dot(P.col(j)) * P.col(i);
  }
}

PowerSgdExchange::PowerSgdExchange(int64_t rank, std::vector<PowerSgdMatrix> matrices,
                                   std::vector<std::pair<int64_t, int64_t>> uncompressed,
                                   uint64_t seed)
    : rank_(rank), matrices_(std::move(matrices)), uncompressed_(std::move(uncompressed)) {
  int64_t p = 0, q = 0;
  for (const PowerSgdMatrix& m : matrices_) {
    p_at_.push_back(p);
    q_at_.push_back(q);
    p += rank_ * m.rows;
    q += rank_ * m.cols;
  }
  p_.resize(static_cast<size_t>(p));
  q_local_.resize(static_cast<size_t>(q));
  q_sum_.resize(static_cast<size_t>(q));
  packed_.resize(static_cast<size_t>(uncompressed_elements()));
  for (size_t j = 0; j < matrices_.size(); ++j)
    for (int64_t i = 0; i < rank_ * matrices_[j].cols; ++i)
      q_sum_[static_cast<size_t>(q_at_[j] + i)] =
          init_normal(seed, "powersgd.q." + matrices_[j].name, i);
}

int64_t PowerSgdExchange::uncompressed_elements() const {
  int64_t n = 0;
  for (auto [b, e] : uncompressed_) n += e - b;
  return n;
}

const float* PowerSgdExchange::m_of(size_t j, const float* grads, const float* residual) const {
  return (residual != nullptr ? residual : grads) + matrices_[j].offset;
}

void PowerSgdExchange::all_reduce_uncompressed(float* grads, const AllReduceFn& all_reduce) {
  // Packed into one message, as a bucket's tensors are (PyTorch's hook all-reduces them as one).
  float* at = packed_.data();
  for (auto [b, e] : uncompressed_) at = std::copy(grads + b, grads + e, at);
  all_reduce(packed_.data(), std::ssize(packed_));
  const float* from = packed_.data();
  for (auto [b, e] : uncompressed_) {
    std::copy(from, from + (e - b), grads + b);
    from += e - b;
  }
}

void PowerSgdExchange::compress(const float* grads, float* residual) {
  for (size_t j = 0; j < matrices_.size(); ++j) {
    const PowerSgdMatrix& m = matrices_[j];
    if (residual != nullptr) {
      const int64_t n = m.rows * m.cols;
      for (int64_t i = 0; i < n; ++i) residual[m.offset + i] += grads[m.offset + i];
    }
    // The warm start: the last step's summed Q (its scale does not matter: P is normalised).
    powersgd_multiply(m_of(j, grads, residual), m.rows, m.cols, q_sum_.data() + q_at_[j], rank_,
                      p_.data() + p_at_[j]);
  }
}

void PowerSgdExchange::all_reduce_p(const AllReduceFn& all_reduce) {
  all_reduce(p_.data(), std::ssize(p_));
}

void PowerSgdExchange::project(const float* grads, const float* residual) {
  for (size_t j = 0; j < matrices_.size(); ++j) {
    const PowerSgdMatrix& m = matrices_[j];
    orthonormalise_columns(p_.data() + p_at_[j], m.rows, rank_);
    powersgd_multiply_transposed(m_of(j, grads, residual), m.rows, m.cols, p_.data() + p_at_[j],
                                 rank_, q_local_.data() + q_at_[j]);
  }
}

void PowerSgdExchange::all_reduce_q(const AllReduceFn& all_reduce) {
  q_sum_ = q_local_;
  all_reduce(q_sum_.data(), std::ssize(q_sum_));
}

void PowerSgdExchange::decompress(float* grads, float* residual) {
  for (size_t j = 0; j < matrices_.size(); ++j) {
    const PowerSgdMatrix& m = matrices_[j];
    eigen::ConstMap P(p_.data() + p_at_[j], m.rows, rank_);
    // What this rank's own gradients lost: M - P P^T M = M - P Q_local^T (Vogels et al.'s
    // e <- Delta - decompress(C(Delta)); summed over the ranks it is what the sum lost).
    if (residual != nullptr)
      eigen::Map(residual + m.offset, m.rows, m.cols).noalias() -=
          P * eigen::ConstMap(q_local_.data() + q_at_[j], m.cols, rank_).transpose();
    eigen::Map(grads + m.offset, m.rows, m.cols).noalias() =
        P * eigen::ConstMap(q_sum_.data() + q_at_[j], m.cols, rank_).transpose();
  }
}

void PowerSgdExchange::save_q(std::vector<float>& stage_buffer) const {
  for (size_t j = 0; j < matrices_.size(); ++j)
    std::copy_n(q_sum_.begin() + q_at_[j], rank_ * matrices_[j].cols,
                stage_buffer.begin() + matrices_[j].offset);
}

void PowerSgdExchange::load_q(const std::vector<float>& stage_buffer) {
  for (size_t j = 0; j < matrices_.size(); ++j)
    std::copy_n(stage_buffer.begin() + matrices_[j].offset, rank_ * matrices_[j].cols,
                q_sum_.begin() + q_at_[j]);
}

}  // namespace sextant::exec
