// Every CUDA kernel against the CPU backend (itself checked against finite differences in
// kernels_test.cpp) on the same random inputs, forward and backward, in both storage types:
// - fp32: the results agree to 1e-4 relative (summation order and expf differ);
// - bf16 (mixed precision): against the CPU's bf16 emulation, which rounds at the same places;
//   one bf16 step is 2^-8 relative, and a rounding that falls differently propagates through
//   the kernels after it, so the bound is 2e-2 of the output's scale.
// bf16 tensor-core GEMMs over fp32 tensors (bf16-gemm) are held to 2e-2 of the fp32 result.
// Outputs start as NaN on both backends (poisoned), so an element a kernel fails to write cannot
// pass. Parameter gradients, statistics and optimizer state are fp32 in both modes. Skipped
// without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>

#include "sextant/exec/cpu_backend.hpp"
#include "sextant/exec/cuda_backend.hpp"

namespace sextant::exec {

// How gtest names the parameter in test listings.
void PrintTo(Precision p, std::ostream* os) {
  *os << precision_name(p);
}

namespace {

// Runs the same computation on both backends and compares chosen outputs.
class CudaVsCpu : public ::testing::TestWithParam<Precision> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda_unavailable_reason();
    cpu = make_cpu_backend(GetParam());
    gpu = make_cuda_backend(0, GetParam());
    tol = GetParam() == Precision::kBf16 ? 2e-2 : 1e-4;
  }

  std::unique_ptr<Backend> cpu;
  std::unique_ptr<Backend> gpu;
  double tol = 1e-4;
  std::mt19937 rng{7};

  std::vector<float> random(int64_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = d(rng);
    return v;
  }
  // A tensor of `shape` with `values` on backend `be`: of the activation type, or fp32 (put32:
  // statistics, optimizer state).
  static Tensor put(Backend& be, std::vector<int64_t> shape, const std::vector<float>& values) {
    Tensor t = be.empty(std::move(shape), be.activation_dtype());
    be.from_host(values, t);
    return t;
  }
  static Tensor put32(Backend& be, std::vector<int64_t> shape, const std::vector<float>& values) {
    Tensor t = be.empty(std::move(shape));
    be.from_host(values, t);
    return t;
  }
  // An output tensor filled with NaN, so that an element a kernel forgets to write fails the check.
  static Tensor poisoned(Backend& be, std::vector<int64_t> shape, bool fp32 = false) {
    Tensor t = be.empty(std::move(shape), fp32 ? DType::kF32 : be.activation_dtype());
    be.fill(t, std::nanf(""));
    return t;
  }
  static std::vector<float> get(Backend& be, const Tensor& t) {
    std::vector<float> v;
    be.to_host(t, v);
    return v;
  }
  // |gpu - cpu| <= rel * max(|cpu|) elementwise, with the worst element named.
  static void expect_close(const std::vector<float>& want, const std::vector<float>& got,
                           double rel, const char* what) {
    ASSERT_EQ(want.size(), got.size()) << what;
    double scale = 1e-6;
    for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      double e = std::fabs(static_cast<double>(want[i]) - got[i]);
      if (std::isnan(e)) e = INFINITY;  // a NaN (an unwritten, poisoned element) always fails
      if (e > worst) {
        worst = e;
        at = i;
      }
    }
    EXPECT_LE(worst, rel * scale) << what << ": element " << at << " cpu " << want[at] << " cuda "
                                  << got[at] << " (scale " << scale << ")";
  }
};

const float kPoison = std::nanf("");

TEST_P(CudaVsCpu, Matmuls) {
  const int64_t rows = 37, in = 48, out = 29;
  auto x = random(rows * in), w = random(in * out), b = random(out), dy = random(rows * out);
  auto w_nt = random(out * in);
  std::map<std::string, std::vector<float>> results[2];
  Backend* bes[2] = {cpu.get(), gpu.get()};
  for (int k = 0; k < 2; ++k) {
    Backend& be = *bes[k];
    Tensor tx = put(be, {rows, in}, x), tw = put(be, {in, out}, w), tb = put(be, {out}, b);
    Tensor tdy = put(be, {rows, out}, dy), y = poisoned(be, {rows, out});
    be.matmul(tx, tw, &tb, y);
    results[k]["y"] = get(be, y);
    be.matmul(tx, tw, nullptr, y, true);  // accumulate
    results[k]["y_acc"] = get(be, y);
    Tensor dx = poisoned(be, {rows, in}), dw = be.zeros({in, out}), db = be.zeros({out});
    be.matmul_backward(tx, tw, tdy, &dx, dw, &db);
    results[k]["dx"] = get(be, dx);
    results[k]["dw"] = get(be, dw);
    results[k]["db"] = get(be, db);
    Tensor twt = put(be, {out, in}, w_nt), ynt = poisoned(be, {rows, out});
    be.matmul_nt(tx, twt, ynt);
    results[k]["y_nt"] = get(be, ynt);
    Tensor dxn = poisoned(be, {rows, in}), dwn = be.zeros({out, in});
    be.matmul_nt_backward(tx, twt, tdy, dxn, dwn);
    results[k]["dx_nt"] = get(be, dxn);
    results[k]["dw_nt"] = get(be, dwn);
  }
  for (const auto& [name, want] : results[0])
    expect_close(want, results[1][name], tol, name.c_str());
}

// A linear layer's bias in cuBLASLt's epilogue (cuda/lt_gemm.hpp) at sizes it has algorithms for
// (the odd sizes above may take the separate bias pass), alone and added to what y held, and at
// an operand 16 bytes past an aligned start (another algorithm, or the separate pass).
TEST_P(CudaVsCpu, MatmulWithFusedBias) {
  const int64_t rows = 64, in = 128, out = 96;
  auto x = random((rows + 8) * in), w = random(in * out), b = random(out), y0 = random(rows * out);
  std::map<std::string, std::vector<float>> results[2];
  Backend* bes[2] = {cpu.get(), gpu.get()};
  for (int k = 0; k < 2; ++k) {
    Backend& be = *bes[k];
    Tensor tx = put(be, {rows + 8, in}, x), tw = put(be, {in, out}, w), tb = put(be, {out}, b);
    Tensor y = poisoned(be, {rows, out});
    be.matmul(tx.view({rows, in}), tw, &tb, y);
    results[k]["y"] = get(be, y);
    Tensor acc = put(be, {rows, out}, y0);
    be.matmul(tx.view({rows, in}), tw, &tb, acc, true);
    results[k]["y_accumulated"] = get(be, acc);
    Tensor shifted = poisoned(be, {rows, out});
    const int64_t shift = 16 / static_cast<int64_t>(element_size(be.activation_dtype()));
    be.matmul(tx.view({(rows + 8) * in}).rows(shift, rows * in).view({rows, in}), tw, &tb, shifted);
    results[k]["y_rows_later"] = get(be, shifted);
  }
  for (const auto& [name, want] : results[0])
    expect_close(want, results[1][name], tol, name.c_str());
}

TEST_P(CudaVsCpu, Bf16GemmIsWithinBf16RoundingOfFp32) {
  if (GetParam() != Precision::kFp32) GTEST_SKIP() << "compares against fp32";
  std::unique_ptr<Backend> bf16 = make_cuda_backend(0, Precision::kBf16Gemm);
  const int64_t rows = 64, in = 256, out = 96;
  auto x = random(rows * in), w = random(in * out, 0.0625f);
  Tensor cx = put(*cpu, {rows, in}, x), cw = put(*cpu, {in, out}, w),
         cy = poisoned(*cpu, {rows, out});
  cpu->matmul(cx, cw, nullptr, cy);
  Tensor gx = put(*bf16, {rows, in}, x), gw = put(*bf16, {in, out}, w),
         gy = poisoned(*bf16, {rows, out});
  bf16->matmul(gx, gw, nullptr, gy);
  // Two inputs rounded to 2^-9 relative each, summed over 256 terms of random sign.
  expect_close(get(*cpu, cy), get(*bf16, gy), 2e-2, "bf16 gemm");
}

TEST_P(CudaVsCpu, NormsActivationsAndElementwise) {
  const int64_t rows = 33, h = 40;
  auto x = random(rows * h), g = random(h), b = random(h), dy = random(rows * h);
  auto x2 = random(rows * 2 * h), dy2 = random(rows * h);
  std::map<std::string, std::vector<float>> r[2];
  Backend* bes[2] = {cpu.get(), gpu.get()};
  for (int k = 0; k < 2; ++k) {
    Backend& be = *bes[k];
    Tensor tx = put(be, {rows, h}, x), tg = put(be, {h}, g), tb = put(be, {h}, b);
    Tensor tdy = put(be, {rows, h}, dy), y = poisoned(be, {rows, h}),
           mean = poisoned(be, {rows}, true), rstd = poisoned(be, {rows}, true);
    be.layernorm(tx, tg, tb, y, mean, rstd);
    r[k]["ln"] = get(be, y);
    r[k]["ln_mean"] = get(be, mean);
    r[k]["ln_rstd"] = get(be, rstd);
    Tensor dx = poisoned(be, {rows, h}), dg = be.zeros({h}), db = be.zeros({h});
    be.layernorm_backward(tx, tg, mean, rstd, tdy, dx, dg, db);
    r[k]["ln_dx"] = get(be, dx);
    r[k]["ln_dg"] = get(be, dg);
    r[k]["ln_db"] = get(be, db);
    Tensor dg_rms = be.zeros({h});
    be.fill(y, kPoison);
    be.fill(rstd, kPoison);
    be.rmsnorm(tx, tg, y, rstd);
    r[k]["rms"] = get(be, y);
    r[k]["rms_rstd"] = get(be, rstd);
    be.fill(dx, kPoison);
    be.rmsnorm_backward(tx, tg, rstd, tdy, dx, dg_rms);
    r[k]["rms_dx"] = get(be, dx);
    r[k]["rms_dg"] = get(be, dg_rms);
    be.fill(y, kPoison);
    be.gelu(tx, y);
    r[k]["gelu"] = get(be, y);
    be.fill(dx, kPoison);
    be.gelu_backward(tx, tdy, dx);
    r[k]["gelu_dx"] = get(be, dx);
    be.fill(y, kPoison);
    be.relu(tx, y);
    r[k]["relu"] = get(be, y);
    be.fill(dx, kPoison);
    be.relu_backward(tx, tdy, dx);
    r[k]["relu_dx"] = get(be, dx);
    Tensor tx2 = put(be, {rows, 2 * h}, x2), tdy2 = put(be, {rows, h}, dy2),
           dx2 = poisoned(be, {rows, 2 * h});
    be.fill(y, kPoison);
    be.swiglu(tx2, y);
    r[k]["swiglu"] = get(be, y);
    be.swiglu_backward(tx2, tdy2, dx2);
    r[k]["swiglu_dx"] = get(be, dx2);
    be.fill(y, kPoison);
    be.copy(tx, y);
    be.bias_add(y, tb);
    r[k]["bias_add"] = get(be, y);
    Tensor dbias = be.zeros({h});
    be.bias_backward(tdy, dbias);
    r[k]["bias_dx"] = get(be, dbias);
    be.fill(y, kPoison);
    be.add(tx, tdy, y);
    be.scale(y, 0.5f);
    r[k]["add_scale"] = get(be, y);
    be.fill(y, 3.0f);
    r[k]["fill"] = get(be, y);
    r[k]["sum_squares"] = {static_cast<float>(be.sum_squares(put32(be, {rows, h}, x)))};
    r[k]["sum_squares_spans"] = {static_cast<float>(
        be.sum_squares_spans(put32(be, {rows * h}, x), {{0, 100}, {300, rows * h - 300}}))};
  }
  for (const auto& [name, want] : r[0]) expect_close(want, r[1][name], tol, name.c_str());
}

// Multi-head (3 kv heads for 3 q heads) and grouped-query attention (2 kv heads for 6 q heads:
// the strided-batched calls per position in the group, and the summed kv-head gradients).
TEST_P(CudaVsCpu, CausalAttentionForwardAndBackward) {
  for (const QkvLayout l : {QkvLayout{2, 7, 3, 3, 8}, QkvLayout{2, 7, 6, 2, 8}}) {
    SCOPED_TRACE(l.kv_heads);
    const int64_t batch = l.batch, seq = l.seq, heads = l.heads, hd = heads * l.head_dim;
    auto qkv = random(batch * seq * l.width()), dout = random(batch * seq * hd);
    std::map<std::string, std::vector<float>> r[2];
    Backend* bes[2] = {cpu.get(), gpu.get()};
    for (int k = 0; k < 2; ++k) {
      Backend& be = *bes[k];
      Tensor tq = put(be, {batch * seq, l.width()}, qkv), tdo = put(be, {batch * seq, hd}, dout);
      Tensor rotated = poisoned(be, {batch * seq, l.width()});
      be.copy(tq, rotated);
      be.rope(rotated, l, 10000.0f, false);
      r[k]["rope"] = get(be, rotated);
      be.rope(rotated, l, 10000.0f, true);
      r[k]["rope_inverse"] = get(be, rotated);
      Tensor att = poisoned(be, {batch, heads, seq, seq}), out = poisoned(be, {batch * seq, hd});
      be.attention_scores(tq, l, att);
      r[k]["scores"] = get(be, att);
      be.causal_softmax(att, seq);
      r[k]["probs"] = get(be, att);
      be.attention_context(att, tq, l, out);
      r[k]["context"] = get(be, out);
      Tensor dqkv = poisoned(be, {batch * seq, l.width()}),
             dprobs = poisoned(be, {batch, heads, seq, seq});
      be.attention_context_backward(att, tq, tdo, l, dprobs, dqkv);
      r[k]["dprobs"] = get(be, dprobs);
      be.causal_softmax_backward(att, dprobs, seq);
      r[k]["dscores"] = get(be, dprobs);
      be.attention_scores_backward(dprobs, tq, l, dqkv);
      r[k]["dqkv"] = get(be, dqkv);
    }
    for (const auto& [name, want] : r[0]) expect_close(want, r[1][name], tol, name.c_str());
  }
}

// The fused kernels (tensor cores in bf16) against the CPU's (FlashAttention-2's algorithm in
// fp32, itself equal to the unfused steps: kernels_test.cpp). Shapes cover several 64-row tiles
// with a ragged last one or whole ones (tiles below the diagonal skip the mask), grouped-query
// attention, head dims padded to 16 (24, 6) and the kernels' limit (128 in bf16; fp32 tiles fit
// up to 112), 16-byte loads and element loads (6).
TEST_P(CudaVsCpu, FlashAttentionForwardAndBackward) {
  for (const QkvLayout l :
       {QkvLayout{2, 70, 3, 3, 24}, QkvLayout{1, 130, 4, 2, 64}, QkvLayout{2, 65, 2, 1, 128},
        QkvLayout{1, 192, 2, 2, 128}, QkvLayout{3, 5, 2, 1, 6}}) {
    if (l.head_dim > 112 && GetParam() != Precision::kBf16) continue;
    SCOPED_TRACE(testing::Message() << "seq " << l.seq << " head_dim " << l.head_dim);
    const int64_t rows = l.batch * l.seq, hd = l.heads * l.head_dim;
    auto qkv = random(rows * l.width()), dout = random(rows * hd);
    std::map<std::string, std::vector<float>> r[2];
    Backend* bes[2] = {cpu.get(), gpu.get()};
    for (int k = 0; k < 2; ++k) {
      Backend& be = *bes[k];
      Tensor tq = put(be, {rows, l.width()}, qkv), tdo = put(be, {rows, hd}, dout);
      Tensor out = poisoned(be, {rows, hd}), lse = poisoned(be, {l.batch, l.heads, l.seq}, true);
      be.flash_attention(tq, l, out, lse);
      r[k]["out"] = get(be, out);
      r[k]["lse"] = get(be, lse);
      Tensor delta = poisoned(be, {l.batch, l.heads, l.seq}, true);
      Tensor dqkv = poisoned(be, {rows, l.width()});
      be.flash_attention_backward_prep(out, tdo, l, delta);
      r[k]["delta"] = get(be, delta);
      be.flash_attention_backward(tq, tdo, lse, delta, l, dqkv);
      r[k]["dqkv"] = get(be, dqkv);
    }
    for (const auto& [name, want] : r[0]) expect_close(want, r[1][name], tol, name.c_str());
  }
}

// The 16-byte and the element paths of the memory-bound kernels: rows of 40 columns split into
// whole packs (8 bf16 or 4 floats), 44 columns that bf16 packs do not divide, a valid vocabulary
// (37) ending inside a pack, targets inside and outside the shard; bias adds, layer and RMS norms.
TEST_P(CudaVsCpu, PackedAndElementPaths) {
  const std::vector<int32_t> targets = {2, 5, 38, 0, 20, 39, 11};  // shard [2, 42)
  for (const int64_t cols : {40, 44}) {
    SCOPED_TRACE(cols);
    const int64_t rows = static_cast<int64_t>(targets.size()), valid = 37;
    auto logits = random(rows * cols, 3.0f), y = random(rows * cols), bias = random(cols);
    std::map<std::string, std::vector<float>> r[2];
    Backend* bes[2] = {cpu.get(), gpu.get()};
    for (int k = 0; k < 2; ++k) {
      Backend& be = *bes[k];
      Tensor tl = put(be, {rows, cols}, logits);
      std::vector<float> mx, sum, tgt;
      be.softmax_stats(tl, targets, 2, valid, mx, sum, tgt);
      r[k]["row_max"] = mx;
      r[k]["row_sum_exp"] = sum;
      r[k]["target_logits"] = tgt;
      Tensor dl = poisoned(be, {rows, cols});
      be.cross_entropy_backward(tl, targets, 2, valid, mx, sum, 0.5f, dl);
      r[k]["dlogits"] = get(be, dl);
      Tensor ty = put(be, {rows, cols}, y), tb = put(be, {cols}, bias);
      be.bias_add(ty, tb);
      r[k]["bias_add"] = get(be, ty);
      Tensor ln = poisoned(be, {rows, cols}), mean = poisoned(be, {rows}, true),
             rstd = poisoned(be, {rows}, true);
      be.layernorm(tl, tb, tb, ln, mean, rstd);
      r[k]["layernorm"] = get(be, ln);
      r[k]["layernorm_rstd"] = get(be, rstd);
      Tensor dx = poisoned(be, {rows, cols}), dg = be.zeros({cols}), db = be.zeros({cols});
      be.layernorm_backward(tl, tb, mean, rstd, ty, dx, dg, db);
      r[k]["layernorm_dx"] = get(be, dx);
      r[k]["layernorm_dgamma"] = get(be, dg);
      r[k]["layernorm_dbeta"] = get(be, db);
      Tensor rms = poisoned(be, {rows, cols}), dg_rms = be.zeros({cols});
      be.fill(rstd, kPoison);
      be.fill(dx, kPoison);
      be.rmsnorm(tl, tb, rms, rstd);
      r[k]["rmsnorm"] = get(be, rms);
      be.rmsnorm_backward(tl, tb, rstd, ty, dx, dg_rms);
      r[k]["rmsnorm_dx"] = get(be, dx);
      r[k]["rmsnorm_dgamma"] = get(be, dg_rms);
    }
    for (const auto& [name, want] : r[0]) expect_close(want, r[1][name], tol, name.c_str());
  }
}

// The norms' warp-a-row kernels where one block's warps hold many rows and the grid strides: 3001
// rows (more than the grid's warps on any GPU of up to 187 SMs, and no multiple of 8), packed (768
// columns) and element by element (44); and rows of 12288 columns (GPT-3's width), whose
// shared-memory sums allow fewer warps a block. dgamma and dbeta sum 3001 rows in another order
// than the CPU's, within the same bound of their scale.
TEST_P(CudaVsCpu, NormsOverManyRowsAndWideRows) {
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{3001, 768}, {3001, 44}, {19, 12288}}) {
    SCOPED_TRACE(cols);
    auto x = random(rows * cols), g = random(cols), b = random(cols), dy = random(rows * cols);
    std::map<std::string, std::vector<float>> r[2];
    Backend* bes[2] = {cpu.get(), gpu.get()};
    for (int k = 0; k < 2; ++k) {
      Backend& be = *bes[k];
      Tensor tx = put(be, {rows, cols}, x), tg = put(be, {cols}, g), tb = put(be, {cols}, b);
      Tensor tdy = put(be, {rows, cols}, dy), y = poisoned(be, {rows, cols}),
             dx = poisoned(be, {rows, cols}), mean = poisoned(be, {rows}, true),
             rstd = poisoned(be, {rows}, true);
      be.layernorm(tx, tg, tb, y, mean, rstd);
      r[k]["ln"] = get(be, y);
      r[k]["ln_mean"] = get(be, mean);
      r[k]["ln_rstd"] = get(be, rstd);
      Tensor dg = be.zeros({cols}), db = be.zeros({cols});
      be.layernorm_backward(tx, tg, mean, rstd, tdy, dx, dg, db);
      r[k]["ln_dx"] = get(be, dx);
      r[k]["ln_dg"] = get(be, dg);
      r[k]["ln_db"] = get(be, db);
      be.fill(y, kPoison);
      be.fill(dx, kPoison);
      be.fill(rstd, kPoison);
      Tensor dg_rms = be.zeros({cols});
      be.rmsnorm(tx, tg, y, rstd);
      r[k]["rms"] = get(be, y);
      r[k]["rms_rstd"] = get(be, rstd);
      be.rmsnorm_backward(tx, tg, rstd, tdy, dx, dg_rms);
      r[k]["rms_dx"] = get(be, dx);
      r[k]["rms_dg"] = get(be, dg_rms);
    }
    for (const auto& [name, want] : r[0]) expect_close(want, r[1][name], tol, name.c_str());
  }
}

TEST_P(CudaVsCpu, EmbeddingLossAndOptimizer) {
  const int64_t n = 9, h = 6, shard_begin = 3, shard = 5;  // vocabulary 11, this shard 3..7
  const std::vector<int32_t> tokens = {0, 3, 4, 7, 7, 10, 5, 3, 1};
  auto table = random(shard * h), dy = random(n * h), pos = random(4 * h),
       logits = random(n * shard, 3.0f);
  auto p = random(50), gr = random(50), m = random(50, 0.1f), v = random(50, 0.1f);
  for (float& x : v) x = std::fabs(x);
  std::map<std::string, std::vector<float>> r[2];
  Backend* bes[2] = {cpu.get(), gpu.get()};
  for (int k = 0; k < 2; ++k) {
    Backend& be = *bes[k];
    Tensor tt = put(be, {shard, h}, table), tdy = put(be, {n, h}, dy), y = poisoned(be, {n, h});
    be.embedding(tokens, tt, shard_begin, y);
    r[k]["embedding"] = get(be, y);
    Tensor dt = be.zeros({shard, h});
    be.embedding_backward(tokens, tdy, shard_begin, dt);
    r[k]["embedding_dt"] = get(be, dt);
    Tensor tp = put(be, {4, h}, pos);
    be.add_positions(tp, 2, 4, y);
    r[k]["positions"] = get(be, y);
    Tensor dp = be.zeros({4, h});
    be.add_positions_backward(tdy, 2, 4, dp);
    r[k]["positions_dp"] = get(be, dp);
    Tensor tl = put(be, {n, shard}, logits);
    std::vector<float> mx, sum, tgt;
    be.softmax_stats(tl, tokens, shard_begin, shard - 1, mx, sum, tgt);
    r[k]["row_max"] = mx;
    r[k]["row_sum_exp"] = sum;
    r[k]["target_logits"] = tgt;
    Tensor dl = poisoned(be, {n, shard});
    be.cross_entropy_backward(tl, tokens, shard_begin, shard - 1, mx, sum, 0.25f, dl);
    r[k]["dlogits"] = get(be, dl);
    Tensor tpp = put32(be, {50}, p), tg = put32(be, {50}, gr), tm = put32(be, {50}, m),
           tv = put32(be, {50}, v);
    be.adamw(tpp, tg, tm, tv, 3, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f);
    r[k]["adamw_p"] = get(be, tpp);
    r[k]["adamw_m"] = get(be, tm);
    r[k]["adamw_v"] = get(be, tv);
    // Multi-tensor: two spans with their own decay, and a gap that must stay untouched.
    be.adamw_spans(tpp, tg, tm, tv, {{0, 20, 0.1f}, {30, 20, 0.0f}}, 4, 1e-2f, 0.9f, 0.95f, 1e-8f,
                   0.5f);
    r[k]["adamw_spans_p"] = get(be, tpp);
    r[k]["adamw_spans_m"] = get(be, tm);
  }
  for (const auto& [name, want] : r[0]) expect_close(want, r[1][name], tol, name.c_str());
}

INSTANTIATE_TEST_SUITE_P(Storage, CudaVsCpu, ::testing::Values(Precision::kFp32, Precision::kBf16),
                         [](const auto& param) {
                           return std::string(param.param == Precision::kBf16 ? "bf16" : "fp32");
                         });

TEST(CudaAvailability, ReasonIsGivenWhenThereIsNoDevice) {
  if (cuda_device_count() > 0) {
    EXPECT_EQ(cuda_unavailable_reason(), "");
  } else {
    EXPECT_FALSE(cuda_unavailable_reason().empty());
    EXPECT_THROW(make_cuda_backend(0, Precision::kFp32), std::runtime_error);
  }
}

}  // namespace
}  // namespace sextant::exec
