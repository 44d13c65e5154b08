// Activation memory per transformer block against Korthikanti et al. 2022 (Reducing Activation
// Recomputation in Large Transformer Models), Table 2, computed in the test from the formulas.
#include <gtest/gtest.h>

#include "sextant/models/counts.hpp"
#include "sextant/models/zoo.hpp"

namespace sextant::models {
namespace {

struct Shape {
  double s, b, h, a;
};

// Table 2 of the paper, bytes per layer with 16-bit activations.
double no_parallelism(Shape x) {
  return x.s * x.b * x.h * (34 + 5 * x.a * x.s / x.h);
}
double tensor_parallel(Shape x, double t) {
  return x.s * x.b * x.h * (10 + 24 / t + 5 * x.a * x.s / (x.h * t));
}
double tensor_sequence_parallel(Shape x, double t) {
  return x.s * x.b * x.h * (34 / t + 5 * x.a * x.s / (x.h * t));
}
double tensor_parallel_selective(Shape x, double t) {
  return x.s * x.b * x.h * (10 + 24 / t);
}
double tensor_sequence_parallel_selective(Shape x, double t) {
  return x.s * x.b * x.h * 34 / t;
}
double full_recompute(Shape x) {
  return 2 * x.s * x.b * x.h;
}

int64_t ours(const char* model, int64_t b, int64_t t, bool sp, spec::Recompute r) {
  spec::ModelSpec m = zoo_model(model);
  return block_activation_bytes(m, b, m.transformer().seq_len, t, sp, r, spec::Dtype::kBf16);
}

TEST(ActivationMemory, KorthikantiFormsForGpt3) {
  for (int64_t b : {1, 4}) {
    Shape x{2048, static_cast<double>(b), 12288, 96};
    using R = spec::Recompute;
    EXPECT_DOUBLE_EQ(ours("gpt3-175b", b, 1, false, R::kNone), no_parallelism(x));
    for (int64_t t : {2, 4, 8}) {
      double td = static_cast<double>(t);
      EXPECT_DOUBLE_EQ(ours("gpt3-175b", b, t, false, R::kNone), tensor_parallel(x, td)) << t;
      EXPECT_DOUBLE_EQ(ours("gpt3-175b", b, t, true, R::kNone), tensor_sequence_parallel(x, td));
      EXPECT_DOUBLE_EQ(ours("gpt3-175b", b, t, false, R::kSelective),
                       tensor_parallel_selective(x, td));
      EXPECT_DOUBLE_EQ(ours("gpt3-175b", b, t, true, R::kSelective),
                       tensor_sequence_parallel_selective(x, td));
    }
    EXPECT_DOUBLE_EQ(ours("gpt3-175b", b, 1, false, R::kFull), full_recompute(x));
    EXPECT_DOUBLE_EQ(ours("gpt3-175b", b, 8, true, R::kFull), full_recompute(x) / 8);
  }
}

TEST(ActivationMemory, WithoutDropoutTheMasksAreNotKept) {
  // Llama has no dropout: 34sbh - 2sbh (two output masks), and the attention core keeps only the
  // softmax output (2as^2b instead of 5as^2b); GQA and SwiGLU change the other terms.
  spec::ModelSpec m = zoo_model("llama2-7b");
  const double s = 4096, b = 1, h = 4096, a = 32, f = 11008;
  // norm inputs and GEMM inputs 4*2sbh; Q, K, V 3*2sbh (kv = a); proj input 2sbh;
  // SwiGLU input 2*2sbf; FC2 input 2sbf; softmax output 2as^2b.
  double expected = 8 * s * b * h + 6 * s * b * h + 2 * s * b * h + 4 * s * b * f + 2 * s * b * f +
                    2 * a * s * s * b;
  EXPECT_DOUBLE_EQ(
      block_activation_bytes(m, 1, 4096, 1, false, spec::Recompute::kNone, spec::Dtype::kBf16),
      expected);
}

TEST(ActivationMemory, Fp32ActivationsDoubleTheTensorsButNotTheMasks) {
  spec::ModelSpec m = zoo_model("gpt3-1.3b");
  const double s = 2048, b = 1, h = 2048, a = 16;
  // fp32: every 2-byte tensor becomes 4 bytes; the two 1-byte sbh masks and the 1-byte as^2b
  // attention mask stay.
  double bf16 = s * b * h * (34 + 5 * a * s / h);
  double fp32 = 2 * bf16 - 2 * s * b * h - a * s * s * b;
  EXPECT_DOUBLE_EQ(
      block_activation_bytes(m, 1, 2048, 1, false, spec::Recompute::kNone, spec::Dtype::kFp32),
      fp32);
}

}  // namespace
}  // namespace sextant::models
