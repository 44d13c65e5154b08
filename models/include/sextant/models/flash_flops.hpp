// The work of a flash attention kernel (Dao et al. 2022; FlashAttention-2, Dao 2023) as its
// benchmarks count it (FA2 §4.1) and as cluster files' attention curves are measured (TFLOP/s of
// this count): forward 4 * b*h * sq * sk * d, of which a causal mask executes half; backward 2.5x
// the forward's executed work (five matmuls against two: it recomputes the scores). The lowering
// prices fused attention with it and `sextant bench attention` measures curves with it.
#pragma once

#include <cstdint>

namespace sextant::models {

inline double flash_attention_executed_flops(int64_t batch_heads, int64_t sq, int64_t sk,
                                             int64_t head_dim, bool causal, bool backward) {
  const double forward = 4.0 * static_cast<double>(batch_heads) * static_cast<double>(sq) *
                         static_cast<double>(sk) * static_cast<double>(head_dim) /
                         (causal ? 2.0 : 1.0);
  return backward ? 2.5 * forward : forward;
}

}  // namespace sextant::models
