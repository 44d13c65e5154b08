// PowerSGD's exchange of one gradient bucket on host memory (Vogels et al., NeurIPS'19,
// Algorithm 1 with error feedback; PyTorch's powerSGD_hook): what the CPU executor runs for plans
// with "compression": {"kind": "powersgd"}. models/gradient_compression.hpp defines the exchange
// and its ops (compressed_exchange_ops); each phase below is one of them, in that order.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace sextant::exec {

// A compressed weight's gradient in the flat buffers: rows x cols, row-major, from `offset`.
struct PowerSgdMatrix {
  std::string name;  // the parameter's (seeds its first Q)
  int64_t offset = 0;
  int64_t rows = 0;
  int64_t cols = 0;
};

// Sums `n` floats in place over the data-parallel group.
using AllReduceFn = std::function<void(float* data, int64_t n)>;

// p (rows x rank) = m (rows x cols) q (cols x rank); all row-major.
void powersgd_multiply(const float* m, int64_t rows, int64_t cols, const float* q, int64_t rank,
                       float* p);
// q (cols x rank) = m^T p.
void powersgd_multiply_transposed(const float* m, int64_t rows, int64_t cols, const float* p,
                                  int64_t rank, float* q);
// Orthonormalises the `rank` columns of p (rows x rank, row-major) in place by modified
// Gram-Schmidt, each column divided by its norm plus 1e-8 (PyTorch's orthogonalization_epsilon:
// a zero gradient gives a zero column, not NaN).
void orthonormalise_columns(float* p, int64_t rows, int64_t rank);

class PowerSgdExchange {
 public:
  // `matrices`: the bucket's compressed weights; `uncompressed`: [begin, end) ranges of the rest.
  // Each matrix's first Q is drawn from N(0, 1) by (seed, its name): alike on every replica.
  PowerSgdExchange(int64_t rank, std::vector<PowerSgdMatrix> matrices,
                   std::vector<std::pair<int64_t, int64_t>> uncompressed, uint64_t seed);

  // The phases, in models::compressed_exchange_ops' order. `grads`, `residual`: the stage's flat
  // buffers (`residual` null: no error feedback).
  // dp.all_reduce: the uncompressed elements summed.
  void all_reduce_uncompressed(float* grads, const AllReduceFn& all_reduce);
  // dp.compress: with error feedback the gradients are added to the residual, which is M; P = M Q.
  void compress(const float* grads, float* residual);
  // dp.powersgd_p_all_reduce.
  void all_reduce_p(const AllReduceFn& all_reduce);
  // dp.powersgd_project: P orthonormalised, this rank's Q = M^T P.
  void project(const float* grads, const float* residual);
  // dp.powersgd_q_all_reduce: the summed Q, kept for the next step's warm start.
  void all_reduce_q(const AllReduceFn& all_reduce);
  // dp.decompress: the gradients become P Q_sum^T; the residual keeps M - P Q_local^T.
  void decompress(float* grads, float* residual);

  // The Q factors (training state a checkpoint keeps): matrix j's rank * cols values at its
  // offset in a buffer of the stage's parameter count (they fit: a compressed matrix has more
  // than twice as many elements).
  void save_q(std::vector<float>& stage_buffer) const;
  void load_q(const std::vector<float>& stage_buffer);

  int64_t uncompressed_elements() const;

 private:
  const float* m_of(size_t j, const float* grads, const float* residual) const;

  int64_t rank_;
  std::vector<PowerSgdMatrix> matrices_;
  std::vector<std::pair<int64_t, int64_t>> uncompressed_;
  std::vector<int64_t> p_at_, q_at_;  // each matrix's offset in p_ and in the q buffers
  std::vector<float> p_, q_local_, q_sum_, packed_;
};

}  // namespace sextant::exec
