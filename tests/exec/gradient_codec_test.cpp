// The codecs of compressed gradient exchanges against their definitions, worked by hand.
#include "sextant/exec/gradient_codec.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "sextant/models/gradient_compression.hpp"

namespace sextant::exec {
namespace {

using spec::CompressionKind;

spec::GradientCompression make(CompressionKind kind) {
  spec::GradientCompression c;
  c.kind = kind;
  return c;
}

// Encodes into exactly encoded_words (a guard word after them must survive) and decodes.
std::vector<float> round_trip(const spec::GradientCompression& c, const std::vector<float>& v,
                              uint64_t seed = 1) {
  const auto n = static_cast<int64_t>(v.size());
  const int64_t words = models::encoded_words(c, n);
  std::vector<uint32_t> out(static_cast<size_t>(words) + 1, 0xDEADBEEFu);
  encode_gradients(c, v.data(), n, out.data(), seed);
  EXPECT_EQ(out.back(), 0xDEADBEEFu) << "wrote past " << words << " words";
  std::vector<float> decoded(v.size(), 0.0f);
  add_decoded(c, out.data(), n, decoded.data());
  return decoded;
}

TEST(GradientCodec, QsgdSendsAnElementOnALevelExactly) {
  // v = (0, 3, 0, -4): norm 5. With 4 bits (s = 7 levels) |v_i| / 5 * 7 = 4.2 and 5.6 fall
  // between levels; (0, 5, 0, 0) has 5 / 5 * 7 = 7, level 7 exactly, decoded 5 * 7 / 7 = 5.
  spec::GradientCompression c = make(CompressionKind::kQsgd);
  EXPECT_EQ(round_trip(c, {0, 5, 0, 0}), (std::vector<float>{0, 5, 0, 0}));
  // Between levels: 3 -> 5 * 4/7 or 5 * 5/7; -4 -> -5 * 5/7 or -5 * 6/7, never anything else.
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::vector<float> d = round_trip(c, {0, 3, 0, -4}, seed);
    EXPECT_TRUE(std::fabs(d[1] - 5.0f * 4 / 7) < 1e-6 || std::fabs(d[1] - 5.0f * 5 / 7) < 1e-6)
        << d[1];
    EXPECT_TRUE(std::fabs(d[3] + 5.0f * 5 / 7) < 1e-6 || std::fabs(d[3] + 5.0f * 6 / 7) < 1e-6)
        << d[3];
    EXPECT_EQ(d[0], 0.0f);
  }
}

TEST(GradientCodec, QsgdIsUnbiased) {
  // Alistarh et al., Lemma 3.1: E[Q(v)] = v. Each decoded element is one of two levels norm / s
  // apart, so its standard deviation is at most norm / (2 s); the mean of N draws is within
  // 5 norm / (2 s sqrt(N)) of v (5 sigma).
  spec::GradientCompression c = make(CompressionKind::kQsgd);
  c.bits = 2;  // s = 1: the coarsest, the largest variance
  c.bucket = 16;
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  std::vector<float> v(32);
  for (float& x : v) x = normal(gen);
  const int N = 4000;
  std::vector<double> mean(v.size(), 0.0);
  for (int t = 0; t < N; ++t) {
    std::vector<float> d = round_trip(c, v, static_cast<uint64_t>(t));
    for (size_t i = 0; i < v.size(); ++i) mean[i] += d[i] / N;
  }
  for (size_t b = 0; b < 2; ++b) {
    double sq = 0;
    for (size_t i = 16 * b; i < 16 * b + 16; ++i) sq += double{v[i]} * v[i];
    const double bound = 5 * std::sqrt(sq) / (2 * 1 * std::sqrt(N));
    for (size_t i = 16 * b; i < 16 * b + 16; ++i) EXPECT_NEAR(mean[i], v[i], bound) << i;
  }
}

TEST(GradientCodec, OnebitSendsSignsTimesTheMeanMagnitude) {
  spec::GradientCompression c = make(CompressionKind::kOnebit);
  c.bucket = 2;
  // Buckets (1, -3) and (0.5, -0.5): mean magnitudes 2 and 0.5.
  EXPECT_EQ(round_trip(c, {1, -3, 0.5f, -0.5f}), (std::vector<float>{2, -2, 0.5f, -0.5f}));
  // 40 elements cross a sign word: element 33 is in the second.
  c.bucket = 512;
  std::vector<float> v(40, 1.0f);
  v[33] = -1.0f;
  std::vector<float> d = round_trip(c, v);
  EXPECT_EQ(d[33], -1.0f);
  EXPECT_EQ(d[32], 1.0f);
}

TEST(GradientCodec, TopkSendsTheLargestMagnitudes) {
  spec::GradientCompression c = make(CompressionKind::kTopk);
  c.ratio = 0.5;  // 3 of 6
  // |-5| and 4, then 3 and -3 tie: the lower index (2) wins.
  EXPECT_EQ(round_trip(c, {0.1f, -5, 3, 0.2f, -3, 4}), (std::vector<float>{0, -5, 3, 0, 0, 4}));
  // Pairs in index order: 1, 2, 5, then their values.
  std::vector<uint32_t> out(6);
  const std::vector<float> v{0.1f, -5, 3, 0.2f, -3, 4};
  encode_gradients(c, v.data(), 6, out.data(), 0);
  EXPECT_EQ(out[0], 1u);
  EXPECT_EQ(out[1], 2u);
  EXPECT_EQ(out[2], 5u);
}

TEST(GradientCodec, ErrorFeedbackLosesNothingOverSteps) {
  // Seide et al.'s error feedback: e <- e + g; send C(e); e <- e - D(C(e)). What was sent over
  // T steps plus the residual left is the sum of the T gradients (up to fp32 rounding), however
  // little each step sends.
  for (CompressionKind kind :
       {CompressionKind::kQsgd, CompressionKind::kTopk, CompressionKind::kOnebit}) {
    spec::GradientCompression c = make(kind);
    c.ratio = 0.01;
    c.bucket = 64;
    const int64_t n = 300;
    std::mt19937 gen(3);
    std::normal_distribution<float> normal;
    std::vector<float> residual(n, 0.0f), sent(n, 0.0f);
    std::vector<double> total(n, 0.0);
    std::vector<uint32_t> words(static_cast<size_t>(models::encoded_words(c, n)));
    for (uint64_t step = 0; step < 40; ++step) {
      for (int64_t i = 0; i < n; ++i) {
        const float g = normal(gen);
        total[static_cast<size_t>(i)] += g;
        residual[static_cast<size_t>(i)] += g;
      }
      encode_gradients(c, residual.data(), n, words.data(), step);
      add_decoded(c, words.data(), n, sent.data());
      add_decoded(c, words.data(), n, residual.data(), -1.0f);
    }
    for (size_t i = 0; i < static_cast<size_t>(n); ++i)
      EXPECT_NEAR(sent[i] + residual[i], total[i], 1e-3) << static_cast<int>(kind) << " " << i;
  }
}

}  // namespace
}  // namespace sextant::exec
