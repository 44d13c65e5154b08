// The codecs of compressed gradient exchanges (QSGD, top-k, 1-bit) on host memory: what the CPU
// executor runs for plans with "compression". The wire format -- how many 32-bit words a bucket
// takes and what they hold -- is models/gradient_compression.hpp's; this is its implementation.
#pragma once

#include <cstdint>

#include "sextant/spec/plan.hpp"

namespace sextant::exec {

// Encodes the `n` values of `v` into `out` (models::encoded_words(c, n) words). `seed` drives
// QSGD's stochastic rounding: a counter-based hash of (seed, element), so the encoding depends on
// nothing but its arguments.
void encode_gradients(const spec::GradientCompression& c, const float* v, int64_t n, uint32_t* out,
                      uint64_t seed);
// Adds `weight` times the `n` values `in` encodes to `acc`.
void add_decoded(const spec::GradientCompression& c, const uint32_t* in, int64_t n, float* acc,
                 float weight = 1.0f);

}  // namespace sextant::exec
