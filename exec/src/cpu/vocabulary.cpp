// The vocabulary-parallel embedding and loss: lookups of the rank's shard of the table, learned
// positions, and the cross-entropy's per-row softmax statistics (max, sum of exponentials, target
// logit) and gradient.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu_backend.hpp"
#include "sextant/spec/error.hpp"
#include "tensor_maps.hpp"

namespace sextant::exec::cpu {

void CpuBackend::embedding(const std::vector<int32_t>& tokens, const Tensor& table,
                           int64_t vocab_begin, Tensor& y) {
  const int64_t shard = table.dim(0), h = table.dim(1);
  for (size_t i = 0; i < tokens.size(); ++i) {
    int64_t row = tokens[i] - vocab_begin;
    float* yi = y.data() + static_cast<int64_t>(i) * h;
    if (row >= 0 && row < shard) {
      std::memcpy(yi, table.data() + row * h, static_cast<size_t>(h) * sizeof(float));
    } else {
      std::fill(yi, yi + h, 0.0f);
    }
  }
}

void CpuBackend::embedding_backward(const std::vector<int32_t>& tokens, const Tensor& dy,
                                    int64_t vocab_begin, Tensor& dtable) {
  const int64_t shard = dtable.dim(0), h = dtable.dim(1);
  for (size_t i = 0; i < tokens.size(); ++i) {
    int64_t row = tokens[i] - vocab_begin;
    if (row < 0 || row >= shard) continue;
    const float* dyi = dy.data() + static_cast<int64_t>(i) * h;
    float* dt = dtable.data() + row * h;
    for (int64_t j = 0; j < h; ++j) dt[j] += dyi[j];
  }
}

void CpuBackend::add_positions(const Tensor& pos, int64_t row_begin, int64_t seq, Tensor& y) {
  const int64_t h = cols_of(y), n = rows_of(y);
  for (int64_t i = 0; i < n; ++i) {
    const float* p = pos.data() + ((row_begin + i) % seq) * h;
    float* yi = y.data() + i * h;
    for (int64_t j = 0; j < h; ++j) yi[j] += p[j];
  }
}

void CpuBackend::add_positions_backward(const Tensor& dy, int64_t row_begin, int64_t seq,
                                        Tensor& dpos) {
  const int64_t h = cols_of(dy), n = rows_of(dy);
  for (int64_t i = 0; i < n; ++i) {
    float* p = dpos.data() + ((row_begin + i) % seq) * h;
    const float* d = dy.data() + i * h;
    for (int64_t j = 0; j < h; ++j) p[j] += d[j];
  }
}

void CpuBackend::softmax_stats(const Tensor& logits, const std::vector<int32_t>& targets,
                               int64_t vocab_begin, int64_t valid, std::vector<float>& max,
                               std::vector<float>& sum, std::vector<float>& target) {
  const int64_t n = rows_of(logits), stride = cols_of(logits), v = valid;
  SEXTANT_CHECK(v >= 0 && v <= stride, "softmax_stats: {} valid of {} columns", v, stride);
  max.assign(static_cast<size_t>(n), -INFINITY);
  sum.assign(static_cast<size_t>(n), 0.0f);
  target.assign(static_cast<size_t>(n), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits.data() + i * stride;
    const size_t k = static_cast<size_t>(i);
    for (int64_t j = 0; j < v; ++j) max[k] = std::max(max[k], row[j]);
    double s = 0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(row[j] - max[k]);
    sum[k] = static_cast<float>(s);
    const int64_t col = targets[k] - vocab_begin;
    if (col >= 0 && col < v) target[k] = row[col];
  }
}

void CpuBackend::cross_entropy_backward(const Tensor& logits, const std::vector<int32_t>& targets,
                                        int64_t vocab_begin, int64_t valid,
                                        const std::vector<float>& max,
                                        const std::vector<float>& sum, float scale_factor,
                                        Tensor& dlogits) {
  const int64_t n = rows_of(logits), v = cols_of(logits);
  SEXTANT_CHECK(valid >= 0 && valid <= v, "cross_entropy_backward: {} valid of {} columns", valid,
                v);
  const float* x = logits.data();
  float* dx = dlogits.data();
  for (int64_t i = 0; i < n; ++i) {
    const float m = max[static_cast<size_t>(i)];
    const float inv = 1.0f / sum[static_cast<size_t>(i)];
    const int64_t col = targets[static_cast<size_t>(i)] - vocab_begin;
    for (int64_t j = 0; j < valid; ++j) {
      float p = std::exp(x[i * v + j] - m) * inv;
      dx[i * v + j] = (p - (j == col ? 1.0f : 0.0f)) * scale_factor;
    }
    for (int64_t j = valid; j < v; ++j) dx[i * v + j] = 0.0f;
  }
}

}  // namespace sextant::exec::cpu
