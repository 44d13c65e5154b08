// QSGD, top-k and 1-bit codecs.
#include "sextant/exec/gradient_codec.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <vector>

#include "sextant/models/gradient_compression.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {

using spec::CompressionKind;

namespace {

// SplitMix64's finaliser (Steele, Lea & Flood, OOPSLA'14): a counter-based uniform in [0, 1).
double uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int64_t scales_of(int64_t n, int64_t bucket) {
  return (n + bucket - 1) / bucket;
}

// QSGD (Alistarh et al. 2017, section 3.1): per scale bucket the l2 norm; each element's
// |v| / norm * s rounded down or up to a level at random, up with probability of the remainder,
// so the decoded value is unbiased. Code: the sign in the top bit, the level below it.
void encode_qsgd(const spec::GradientCompression& c, const float* v, int64_t n, uint32_t* out,
                 uint64_t seed) {
  const int64_t bits = c.bits, s = models::qsgd_levels(bits);
  const int64_t code_words = (n * bits + 31) / 32;
  std::fill(out, out + code_words, 0u);
  uint32_t* scales = out + code_words;
  for (int64_t b = 0; b < scales_of(n, c.bucket); ++b) {
    const int64_t lo = b * c.bucket, hi = std::min(n, lo + c.bucket);
    double sq = 0;
    for (int64_t i = lo; i < hi; ++i) sq += static_cast<double>(v[i]) * v[i];
    const auto norm = static_cast<float>(std::sqrt(sq));
    scales[b] = std::bit_cast<uint32_t>(norm);
    if (norm == 0.0f) continue;  // every level 0
    for (int64_t i = lo; i < hi; ++i) {
      const double r = std::fabs(static_cast<double>(v[i])) / norm * static_cast<double>(s);
      auto level = static_cast<int64_t>(std::floor(r));
      if (uniform(seed, static_cast<uint64_t>(i)) < r - static_cast<double>(level)) ++level;
      level = std::min(level, s);
      const uint32_t code =
          static_cast<uint32_t>(level) | (v[i] < 0 ? uint32_t{1} << (bits - 1) : 0u);
      const int64_t at = i * bits;
      out[at / 32] |= code << (at % 32);
    }
  }
}

void add_qsgd(const spec::GradientCompression& c, const uint32_t* in, int64_t n, float* acc,
              float weight) {
  const int64_t bits = c.bits;
  const auto s = static_cast<float>(models::qsgd_levels(bits));
  const uint32_t level_mask = (uint32_t{1} << (bits - 1)) - 1, sign = uint32_t{1} << (bits - 1);
  const uint32_t* scales = in + (n * bits + 31) / 32;
  for (int64_t b = 0; b < scales_of(n, c.bucket); ++b) {
    const float unit = weight * std::bit_cast<float>(scales[b]) / s;
    if (unit == 0.0f) continue;
    const int64_t lo = b * c.bucket, hi = std::min(n, lo + c.bucket);
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t at = i * bits;
      const uint32_t code = in[at / 32] >> (at % 32);
      const auto level = static_cast<float>(code & level_mask);
      acc[i] += (code & sign) != 0 ? -unit * level : unit * level;
    }
  }
}

// 1-bit (Seide et al. 2014; the scale of EF-SignSGD, Karimireddy et al. 2019): per scale bucket
// the mean magnitude, and each element's sign (bit set: negative).
void encode_onebit(const spec::GradientCompression& c, const float* v, int64_t n, uint32_t* out) {
  const int64_t sign_words = (n + 31) / 32;
  std::fill(out, out + sign_words, 0u);
  uint32_t* scales = out + sign_words;
  for (int64_t b = 0; b < scales_of(n, c.bucket); ++b) {
    const int64_t lo = b * c.bucket, hi = std::min(n, lo + c.bucket);
    double sum = 0;
    for (int64_t i = lo; i < hi; ++i) sum += std::fabs(static_cast<double>(v[i]));
    scales[b] = std::bit_cast<uint32_t>(static_cast<float>(sum / static_cast<double>(hi - lo)));
    for (int64_t i = lo; i < hi; ++i)
      if (v[i] < 0) out[i / 32] |= uint32_t{1} << (i % 32);
  }
}

void add_onebit(const spec::GradientCompression& c, const uint32_t* in, int64_t n, float* acc,
                float weight) {
  const uint32_t* scales = in + (n + 31) / 32;
  for (int64_t b = 0; b < scales_of(n, c.bucket); ++b) {
    const float scale = weight * std::bit_cast<float>(scales[b]);
    const int64_t lo = b * c.bucket, hi = std::min(n, lo + c.bucket);
    for (int64_t i = lo; i < hi; ++i)
      acc[i] += ((in[i / 32] >> (i % 32)) & 1u) != 0 ? -scale : scale;
  }
}

// Top-k: the k largest magnitudes (ties to the lower index, so the choice is deterministic), sent
// in index order: k indices, then their k values.
void encode_topk(const spec::GradientCompression& c, const float* v, int64_t n, uint32_t* out) {
  const int64_t k = models::topk_count(c.ratio, n);
  SEXTANT_CHECK(n <= int64_t{UINT32_MAX}, "top-k bucket of {} elements: indices are 32-bit", n);
  std::vector<uint32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0u);
  auto larger = [v](uint32_t a, uint32_t b) {
    const float ma = std::fabs(v[a]), mb = std::fabs(v[b]);
    return ma > mb || (ma == mb && a < b);
  };
  std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), larger);
  std::sort(order.begin(), order.begin() + k);
  for (int64_t j = 0; j < k; ++j) {
    out[j] = order[static_cast<size_t>(j)];
    out[k + j] = std::bit_cast<uint32_t>(v[order[static_cast<size_t>(j)]]);
  }
}

void add_topk(const spec::GradientCompression& c, const uint32_t* in, int64_t n, float* acc,
              float weight) {
  const int64_t k = models::topk_count(c.ratio, n);
  for (int64_t j = 0; j < k; ++j) acc[in[j]] += weight * std::bit_cast<float>(in[k + j]);
}

}  // namespace

void encode_gradients(const spec::GradientCompression& c, const float* v, int64_t n, uint32_t* out,
                      uint64_t seed) {
  switch (c.kind) {
    case CompressionKind::kQsgd:
      return encode_qsgd(c, v, n, out, seed);
    case CompressionKind::kOnebit:
      return encode_onebit(c, v, n, out);
    case CompressionKind::kTopk:
    case CompressionKind::kSparcml:
      return encode_topk(c, v, n, out);
    case CompressionKind::kPowersgd:  // not a per-rank encoding: sextant/exec/powersgd.hpp
    case CompressionKind::kNone:
      break;
  }
  std::transform(v, v + n, out, [](float x) { return std::bit_cast<uint32_t>(x); });
}

void add_decoded(const spec::GradientCompression& c, const uint32_t* in, int64_t n, float* acc,
                 float weight) {
  switch (c.kind) {
    case CompressionKind::kQsgd:
      return add_qsgd(c, in, n, acc, weight);
    case CompressionKind::kOnebit:
      return add_onebit(c, in, n, acc, weight);
    case CompressionKind::kTopk:
    case CompressionKind::kSparcml:
      return add_topk(c, in, n, acc, weight);
    case CompressionKind::kPowersgd:
    case CompressionKind::kNone:
      break;
  }
  for (int64_t i = 0; i < n; ++i) acc[i] += weight * std::bit_cast<float>(in[i]);
}

}  // namespace sextant::exec
