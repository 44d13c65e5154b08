// Mixture-of-experts blocks as the lowering gives them: parameters of the zoo's MoE models against
// their configurations and published sizes, and one rank's expert ops counted by hand.
#include <gtest/gtest.h>

#include "lowered_ops.hpp"
#include "sextant/models/counts.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::models {
namespace {

using test::find_op;

TEST(MoeParameters, MixtralAndDeepSeekV2LiteAgainstTheirConfigsAndPapers) {
  // Mixtral 8x7B (config.json: h 4096, 32 layers, 32 heads over 8 kv heads of 128, 8 experts of
  // 14336 with SwiGLU, top-2, vocab 32000, untied): per layer attention 4096 (4096 + 2 x 1024) +
  // 4096^2 = 41,943,040, two norms 8,192, router 4096 x 8 = 32,768, experts 8 x 3 x 4096 x 14336
  // = 1,409,286,144; 32 layers, embedding and output 32000 x 4096 each, final norm 4096.
  const int64_t layer = 41'943'040 + 8'192 + 32'768 + 1'409'286'144;
  const int64_t mixtral = 32 * layer + 2 * 131'072'000 + 4'096;
  EXPECT_EQ(parameter_count(zoo_model("mixtral-8x7b")), mixtral);
  // Jiang et al. 2024: 47B parameters (46.7B), 13B active (12.9B): a token uses 2 of 8 experts.
  EXPECT_NEAR(static_cast<double>(mixtral) / 1e9, 46.7, 0.05);
  const int64_t active = mixtral - int64_t{32} * 6 * 176'160'768;
  EXPECT_EQ(active_parameter_count(zoo_model("mixtral-8x7b")), active);
  EXPECT_NEAR(static_cast<double>(active) / 1e9, 12.9, 0.05);
  // DeepSeek-V2-Lite: 15.7B published; with multi-head attention of its width in place of
  // multi-head latent attention the model here is 0.6% larger.
  const double deepseek = static_cast<double>(parameter_count(zoo_model("deepseek-v2-lite")));
  EXPECT_NEAR(deepseek / 15.7e9, 1.0, 0.01);
  // A dense model's active parameters are all of them.
  EXPECT_EQ(active_parameter_count(zoo_model("llama2-7b")),
            parameter_count(zoo_model("llama2-7b")));
}

// A small MoE: h 64, 4 heads, 8 experts of 32 (SwiGLU), top-2, 1 shared expert, the first of 3
// layers dense (ffn 128), 16 tokens a sequence, 2 sequences, bf16.
spec::ModelSpec small_moe(double capacity_factor) {
  spec::ModelSpec m = zoo_model("llama-tiny");
  spec::TransformerSpec& t = m.transformer();
  t.layers = 3;
  t.kv_heads = 4;
  t.seq_len = 16;
  spec::MoeSpec moe;
  moe.experts = 8;
  moe.top_k = 2;
  moe.expert_ffn_hidden = 32;
  moe.shared_experts = 1;
  moe.capacity_factor = capacity_factor;
  moe.dense_layers = 1;
  t.moe = moe;
  return m;
}

LoweredModel lower_moe(double capacity_factor, int64_t tp) {
  LoweringOptions o;
  o.micro_batch = 2;
  o.dtype = spec::Dtype::kBf16;
  o.tp = tp;
  return lower(small_moe(capacity_factor), o);
}

TEST(MoeLowering, TheExpertsComputeEachTokensTopKCopies) {
  const LoweredModel m = lower_moe(0, 2);
  const Layer& dense = m.layers[1];
  const Layer& moe = m.layers[2];
  EXPECT_NE(find_op(dense.forward, "mlp.fc1"), nullptr);
  EXPECT_EQ(find_op(dense.forward, "moe.fc1"), nullptr);
  EXPECT_EQ(find_op(moe.forward, "mlp.fc1"), nullptr);
  // 32 tokens, each to 2 experts: 64 rows through the experts' GEMMs, each expert's 32 columns
  // (x2 for SwiGLU's gate) split over tp 2; one product per expert of 64 / 8 rows.
  const Op* fc1 = find_op(moe.forward, "moe.fc1");
  ASSERT_NE(fc1, nullptr);
  EXPECT_DOUBLE_EQ(fc1->flops, 2.0 * 64 * (2 * 16) * 64);
  EXPECT_DOUBLE_EQ(fc1->executed_flops(), fc1->flops);  // dropless: no padding
  EXPECT_EQ(fc1->matmuls, (std::vector<MatmulShape>{{8, 8, 32, 64}}));
  const Op* fc2 = find_op(moe.forward, "moe.fc2");
  EXPECT_DOUBLE_EQ(fc2->flops, 2.0 * 64 * 64 * 16);
  // The router over all 32 tokens and 8 experts, whole on every tp rank.
  const Op* router = find_op(moe.forward, "moe.router");
  EXPECT_DOUBLE_EQ(router->flops, 2.0 * 32 * 8 * 64);
  // The shared expert as a dense MLP of 32 over every token.
  EXPECT_DOUBLE_EQ(find_op(moe.forward, "moe.shared_fc1")->flops, 2.0 * 32 * (2 * 16) * 64);
  // The tp all-reduce of the MLP's partial output stays where the dense MLP has it.
  EXPECT_NE(find_op(moe.forward, "mlp.all_reduce"), nullptr);
  // Backward: twice each GEMM's FLOPs.
  EXPECT_DOUBLE_EQ(find_op(moe.backward, "moe.fc1")->flops, 2 * fc1->flops);
  // Parameters on a tp rank: attention 64 (64 + 128) / 2 + 64^2 / 2 = 8192, norms 128, router
  // 64 x 8 = 512, 9 experts of 3 x 64 x 32 / 2 = 3072 each.
  EXPECT_EQ(moe.params, 8192 + 128 + 512 + 9 * 3072);
  EXPECT_EQ(moe.params_total, 2 * 8192 + 128 + 512 + 9 * 6144);
  EXPECT_EQ(moe.routed_expert_params_total, 8 * 6144);
}

TEST(MoeLowering, ACapacityFactorPadsTheExpertsInput) {
  // Capacity 1.25: each expert computes 1.25 x its even share, 80 rows for the 64 routed copies;
  // the model FLOPs stay the routed copies'.
  const LoweredModel lowered = lower_moe(1.25, 1);
  const Layer& moe = lowered.layers[2];
  const Op* fc1 = find_op(moe.forward, "moe.fc1");
  EXPECT_DOUBLE_EQ(fc1->flops, 2.0 * 64 * (2 * 32) * 64);
  EXPECT_DOUBLE_EQ(fc1->executed_flops(), 2.0 * 80 * (2 * 32) * 64);
  EXPECT_DOUBLE_EQ(find_op(moe.backward, "moe.fc1")->executed_flops(), 2 * fc1->executed_flops());
  // tp must divide the experts' width as it does the dense MLP's.
  EXPECT_THROW(lower_moe(0, 3), InputError);
}

}  // namespace
}  // namespace sextant::models
