// The CUDA backend's CNN kernels (exec/src/cuda/convolution.cu) against the CPU backend's (checked
// against finite differences in kernels_test.cpp and against PyTorch end to end) on the same random
// inputs, forward and backward, over the shapes the zoo's CNNs use: 2D and 3D windows of 1, 2, 3
// and 7 at strides 1 and 2, the transposed convolution of U-Net, max pooling with ties, adaptive
// pooling of whole maps and of a rank's block. fp32 on both (CNNs run in fp32): the results agree
// to 1e-4 of the output's scale (summation order differs; the sums of batch normalisation are
// doubles on both). Outputs start as NaN (poisoned), so an element a kernel fails to write fails;
// accumulating gradients start from the same random values on both. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "sextant/exec/conv_kernels.hpp"
#include "sextant/exec/cpu_backend.hpp"
#include "sextant/exec/cuda_backend.hpp"
#include "sextant/spec/spatial_split.hpp"

namespace sextant::exec {
namespace {

constexpr double kConvTol = 1e-4;

class CnnCudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda_unavailable_reason();
    cpu = make_cpu_backend(Precision::kFp32);
    gpu = make_cuda_backend(0, Precision::kFp32);
  }

  std::unique_ptr<Backend> cpu, gpu;
  std::mt19937 rng{11};

  std::vector<float> random(int64_t n) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = d(rng);
    return v;
  }
  // A pair of tensors holding the same values, one per backend.
  struct Pair {
    Tensor c, g;
  };
  Pair put(const std::vector<int64_t>& shape, const std::vector<float>& v) {
    Pair p{cpu->empty(shape), gpu->empty(shape)};
    cpu->from_host(v, p.c);
    gpu->from_host(v, p.g);
    return p;
  }
  Pair random_pair(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return put(shape, random(n));
  }
  Pair poisoned(const std::vector<int64_t>& shape) {
    Pair p{cpu->empty(shape), gpu->empty(shape)};
    cpu->fill(p.c, std::nanf(""));
    gpu->fill(p.g, std::nanf(""));
    return p;
  }
  // |gpu - cpu| <= kConvTol * max |cpu| elementwise, the worst element named.
  void expect_close(const Pair& p, const std::string& what) {
    std::vector<float> want, got;
    cpu->to_host(p.c, want);
    gpu->to_host(p.g, got);
    ASSERT_EQ(want.size(), got.size()) << what;
    double scale = 1e-6, worst = 0;
    size_t at = 0;
    for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
    for (size_t i = 0; i < want.size(); ++i) {
      double e = std::fabs(static_cast<double>(want[i]) - got[i]);
      if (std::isnan(e)) e = INFINITY;
      if (e > worst) {
        worst = e;
        at = i;
      }
    }
    EXPECT_LE(worst, kConvTol * scale) << what << ": element " << at << " cpu " << want[at]
                                       << " cuda " << got[at] << " (scale " << scale << ")";
  }
  static void expect_close(const std::vector<double>& want, const std::vector<double>& got,
                           const std::string& what) {
    ASSERT_EQ(want.size(), got.size()) << what;
    double scale = 1e-9;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_LE(std::fabs(want[i] - got[i]), 1e-9 * scale) << what << " [" << i << "]";
  }
};

// A map's shape: [B, C, H, W], or [B, C, D, H, W] when d > 0.
std::vector<int64_t> map(int64_t b, int64_t c, int64_t d, int64_t h, int64_t w) {
  if (d == 0) return {b, c, h, w};
  return {b, c, d, h, w};
}
int64_t out_of(int64_t n, int64_t k, int64_t s) {
  return (n - k) / s + 1;
}

TEST_F(CnnCudaVsCpu, ConvolutionsForwardAndBackward) {
  struct Case {
    int64_t d, k, s;  // d: input depth (0: a 2D map)
  };
  // 3x3 (ResNet, U-Net), 3x3/2, 1x1 (bottlenecks: the input is its own column matrix), 1x1/2
  // (ResNet's downsample), 7x7/2 (ResNet's stem) and the same over volumes.
  for (const Case cs : {Case{0, 3, 1}, Case{0, 3, 2}, Case{0, 1, 1}, Case{0, 1, 2}, Case{0, 7, 2},
                        Case{6, 3, 1}, Case{7, 3, 2}, Case{5, 1, 1}}) {
    const int64_t b = 3, ci = 5, co = 4, h = 13, w = 11;
    const int64_t od = cs.d == 0 ? 0 : out_of(cs.d, cs.k, cs.s);
    const std::string what =
        "conv k" + std::to_string(cs.k) + "/" + std::to_string(cs.s) + (cs.d == 0 ? " 2D" : " 3D");
    std::vector<int64_t> wshape = {co, ci, cs.k, cs.k};
    if (cs.d > 0) wshape.push_back(cs.k);
    Pair x = random_pair(map(b, ci, cs.d, h, w)), wt = random_pair(wshape),
         bias = random_pair({co});
    const std::vector<int64_t> yshape =
        map(b, co, od, out_of(h, cs.k, cs.s), out_of(w, cs.k, cs.s));
    Pair y = poisoned(yshape);
    cpu->convolution(x.c, wt.c, &bias.c, cs.s, y.c);
    gpu->convolution(x.g, wt.g, &bias.g, cs.s, y.g);
    expect_close(y, what + " y");
    Pair dy = random_pair(yshape), dx = poisoned(x.c.shape()), dw = random_pair(wshape),
         db = random_pair({co});
    cpu->convolution_backward(x.c, wt.c, dy.c, cs.s, &dx.c, dw.c, &db.c);
    gpu->convolution_backward(x.g, wt.g, dy.g, cs.s, &dx.g, dw.g, &db.g);
    expect_close(dx, what + " dx");
    expect_close(dw, what + " dw");
    expect_close(db, what + " db");
  }
}

TEST_F(CnnCudaVsCpu, TransposedConvolutions) {
  // U-Net's 2x2/2 up-convolution in 2D and 3D, and a 3x3/1 one (windows that overlap).
  struct Case {
    int64_t d, k, s;
  };
  for (const Case cs : {Case{0, 2, 2}, Case{3, 2, 2}, Case{0, 3, 1}}) {
    const int64_t b = 2, ci = 6, co = 3, h = 5, w = 4;
    const std::string what = "up-conv k" + std::to_string(cs.k) + (cs.d == 0 ? " 2D" : " 3D");
    auto grow = [&](int64_t n) { return (n - 1) * cs.s + cs.k; };
    std::vector<int64_t> wshape = {ci, co, cs.k, cs.k};
    if (cs.d > 0) wshape.push_back(cs.k);
    Pair x = random_pair(map(b, ci, cs.d, h, w)), wt = random_pair(wshape);
    const std::vector<int64_t> yshape = map(b, co, cs.d == 0 ? 0 : grow(cs.d), grow(h), grow(w));
    Pair y = poisoned(yshape);
    cpu->transposed_convolution(x.c, wt.c, cs.s, y.c);
    gpu->transposed_convolution(x.g, wt.g, cs.s, y.g);
    expect_close(y, what + " y");
    Pair dy = random_pair(yshape), dx = poisoned(x.c.shape()), dw = random_pair(wshape);
    cpu->transposed_convolution_backward(x.c, wt.c, dy.c, cs.s, &dx.c, dw.c);
    gpu->transposed_convolution_backward(x.g, wt.g, dy.g, cs.s, &dx.g, dw.g);
    expect_close(dx, what + " dx");
    expect_close(dw, what + " dw");
  }
}

TEST_F(CnnCudaVsCpu, BatchNormalisationAndChannelBias) {
  for (const int64_t d : {int64_t{0}, int64_t{4}}) {
    const std::vector<int64_t> shape = map(3, 6, d, 9, 7);
    const std::string what = d == 0 ? "2D" : "3D";
    const int64_t count = 3 * (d == 0 ? 1 : d) * 9 * 7;
    Pair x = random_pair(shape), gamma = random_pair({6}), beta = random_pair({6});
    std::vector<double> sc, sg;
    cpu->channel_sums(x.c, sc);
    gpu->channel_sums(x.g, sg);
    expect_close(sc, sg, what + " channel sums");
    std::vector<double> mean, rstd;
    conv::batch_statistics(sc, count, mean, rstd);
    Pair y = poisoned(shape);
    cpu->batch_norm(x.c, gamma.c, beta.c, mean, rstd, y.c);
    gpu->batch_norm(x.g, gamma.g, beta.g, mean, rstd, y.g);
    expect_close(y, what + " batch norm y");
    Pair dy = random_pair(shape);
    std::vector<double> bc, bg;
    cpu->batch_norm_backward_sums(x.c, dy.c, mean, rstd, bc);
    gpu->batch_norm_backward_sums(x.g, dy.g, mean, rstd, bg);
    expect_close(bc, bg, what + " backward sums");
    Pair dx = poisoned(shape);
    cpu->batch_norm_backward(x.c, dy.c, gamma.c, mean, rstd, bc, count, dx.c);
    gpu->batch_norm_backward(x.g, dy.g, gamma.g, mean, rstd, bc, count, dx.g);
    expect_close(dx, what + " batch norm dx");
    // Whole maps: the statistics kept by the backend, the same numbers.
    Pair stats{cpu->empty({4 * 6}), gpu->empty({4 * 6})},
        yw = poisoned(shape), dxw = poisoned(shape), dgamma = random_pair({6}),
        dbeta = random_pair({6});
    cpu->batch_norm_whole(x.c, gamma.c, beta.c, yw.c, stats.c);
    gpu->batch_norm_whole(x.g, gamma.g, beta.g, yw.g, stats.g);
    expect_close(yw, what + " whole-map batch norm y");
    cpu->batch_norm_whole_backward(x.c, dy.c, gamma.c, stats.c, dxw.c, dgamma.c, dbeta.c);
    gpu->batch_norm_whole_backward(x.g, dy.g, gamma.g, stats.g, dxw.g, dgamma.g, dbeta.g);
    expect_close(dxw, what + " whole-map batch norm dx");
    expect_close(dgamma, what + " whole-map dgamma");
    expect_close(dbeta, what + " whole-map dbeta");
    cpu->add_channel_bias(x.c, beta.c);
    gpu->add_channel_bias(x.g, beta.g);
    expect_close(x, what + " channel bias");
    Pair db = random_pair({6});
    cpu->channel_bias_backward(dy.c, db.c);
    gpu->channel_bias_backward(dy.g, db.g);
    expect_close(db, what + " bias gradient");
  }
}

TEST_F(CnnCudaVsCpu, Pooling) {
  struct Case {
    int64_t d, k, s;
  };
  for (const Case cs : {Case{0, 3, 2}, Case{0, 2, 2}, Case{5, 3, 2}, Case{4, 2, 2}}) {
    const std::string what = "pool k" + std::to_string(cs.k) + (cs.d == 0 ? " 2D" : " 3D");
    const std::vector<int64_t> in = map(2, 3, cs.d, 9, 8);
    const std::vector<int64_t> out = map(2, 3, cs.d == 0 ? 0 : out_of(cs.d, cs.k, cs.s),
                                         out_of(9, cs.k, cs.s), out_of(8, cs.k, cs.s));
    // Integers in [-2, 2]: many windows hold their maximum twice, and the gradient must go to
    // the first (the CPU's rule) on both.
    std::vector<float> v = random(2 * 3 * (cs.d == 0 ? 1 : cs.d) * 9 * 8);
    for (float& e : v) e = std::round(std::fmax(-2.0f, std::fmin(2.0f, e * 1.5f)));
    Pair x = put(in, v), y = poisoned(out), dy = random_pair(out), dx = poisoned(in);
    cpu->max_pool(x.c, cs.k, cs.s, y.c);
    gpu->max_pool(x.g, cs.k, cs.s, y.g);
    expect_close(y, what + " max y");
    cpu->max_pool_backward(x.c, y.c, dy.c, cs.k, cs.s, dx.c);
    gpu->max_pool_backward(x.g, y.g, dy.g, cs.k, cs.s, dx.g);
    expect_close(dx, what + " max dx");
    Pair ya = poisoned(out), dxa = poisoned(in);
    cpu->avg_pool(x.c, cs.k, cs.s, ya.c);
    gpu->avg_pool(x.g, cs.k, cs.s, ya.g);
    expect_close(ya, what + " avg y");
    cpu->avg_pool_backward(dy.c, cs.k, cs.s, dxa.c);
    gpu->avg_pool_backward(dy.g, cs.k, cs.s, dxa.g);
    expect_close(dxa, what + " avg dx");
  }
}

TEST_F(CnnCudaVsCpu, AdaptivePoolingOfMapsAndBlocks) {
  // A 7x7 map pooled to 1x1 (ResNet) and to 3x3 (bins of 3 that overlap), whole and as the block
  // of rows [2, 5) and columns [4, 7) a spatial rank holds; a 5x7x6 volume's block of planes
  // [1, 4) to 2x2x2.
  struct Case {
    spec::MapExtent map;
    spec::MapBlock block;
    int64_t out;
  };
  const spec::Rows all7{0, 7};
  for (const Case& cs :
       {Case{{7, 7}, {all7, all7}, 1}, Case{{7, 7}, {all7, all7}, 3},
        Case{{7, 7}, {{2, 5}, {4, 7}}, 3}, Case{{7, 6, 5}, {{0, 7}, {0, 6}, {1, 4}}, 2}}) {
    const bool volume = cs.map.volume();
    const std::vector<int64_t> in =
        map(2, 3, volume ? cs.block.planes.size() : 0, cs.block.rows.size(), cs.block.cols.size());
    const std::vector<int64_t> out = map(2, 3, volume ? cs.out : 0, cs.out, cs.out);
    const std::string what = "adaptive pool to " + std::to_string(cs.out);
    Pair x = random_pair(in), y = poisoned(out), dy = random_pair(out), dx = poisoned(in);
    cpu->adaptive_avg_pool(x.c, cs.block, cs.map, y.c);
    gpu->adaptive_avg_pool(x.g, cs.block, cs.map, y.g);
    expect_close(y, what + " y");
    cpu->adaptive_avg_pool_backward(dy.c, cs.block, cs.map, dx.c);
    gpu->adaptive_avg_pool_backward(dy.g, cs.block, cs.map, dx.g);
    expect_close(dx, what + " dx");
  }
}

TEST_F(CnnCudaVsCpu, CroppedConcatAndPixelLoss) {
  for (const int64_t d : {int64_t{0}, int64_t{4}}) {
    const std::string what = d == 0 ? "2D" : "3D";
    // A kept 2 x 9 x 8 (x 6) map cropped to 5 x 4 (x 4) beside 3 channels of x.
    Pair kept = random_pair(map(2, 2, d == 0 ? 0 : 6, 9, 8)), x = random_pair(map(2, 3, d, 5, 4));
    Pair y = poisoned(map(2, 5, d, 5, 4));
    cpu->crop_concat(kept.c, x.c, y.c);
    gpu->crop_concat(kept.g, x.g, y.g);
    expect_close(y, what + " concat y");
    Pair dy = random_pair(y.c.shape()), dkept = random_pair(kept.c.shape()),
         dx = poisoned(x.c.shape());
    cpu->crop_concat_backward(dy.c, dkept.c, dx.c);
    gpu->crop_concat_backward(dy.g, dkept.g, dx.g);
    expect_close(dkept, what + " concat dkept");
    expect_close(dx, what + " concat dx");
    // The per-pixel loss of 4 classes, as a block of a map of 3x its pixels.
    const int64_t pixels = 2 * (d == 0 ? 1 : d) * 5 * 4;
    std::vector<int32_t> labels(static_cast<size_t>(pixels));
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>((i * 7) % 4);
    Pair logits = random_pair(map(2, 4, d, 5, 4)), dl = poisoned(logits.c.shape());
    const int64_t map_pixels = 3 * pixels / 2;
    const double lc = cpu->pixel_cross_entropy(logits.c, labels, 0.25f, &dl.c, map_pixels);
    const double lg = gpu->pixel_cross_entropy(logits.g, labels, 0.25f, &dl.g, map_pixels);
    EXPECT_NEAR(lg, lc, 1e-9 * std::fabs(lc)) << what << " loss";
    expect_close(dl, what + " dlogits");
    labels[3] = 4;  // a class the logits do not have: refused, as on the CPU
    EXPECT_THROW(gpu->pixel_cross_entropy(logits.g, labels, 1.0f, nullptr, 0), std::exception);
  }
}

}  // namespace
}  // namespace sextant::exec
