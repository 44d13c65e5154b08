// Mixture-of-experts blocks as the lowering gives them: parameters of the zoo's MoE models against
// their configurations and published sizes, and one rank's expert ops counted by hand.
#include <gtest/gtest.h>

#include "lowered_ops.hpp"
#include "sextant/models/counts.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/error.hpp"
#include "small_moe.hpp"

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

// test::small_moe over two sequences, bf16 (sequence parallel under tp, as a MoE needs).
LoweredModel lower_moe(double capacity_factor, int64_t tp) {
  LoweringOptions o;
  o.micro_batch = 2;
  o.dtype = spec::Dtype::kBf16;
  o.tp = tp;
  o.sequence_parallel = tp > 1;
  return lower(test::small_moe(capacity_factor), o);
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
  // Each tp rank routes its own 16 tokens over 8 experts (the router whole on every tp rank)
  // and the ranks gather the routing: 32 tokens x 2 copies x (a 4-byte weight and a 4-byte
  // index) = 512 B; in backward the weights' partial gradients are reduce-scattered, 32 x 2 x 4
  // = 256 B. The router's gradient is then a partial sum over tp, as a norm's is.
  const Op* router = find_op(moe.forward, "moe.router");
  EXPECT_DOUBLE_EQ(router->flops, 2.0 * 16 * 8 * 64);
  const Op* route_gather = find_op(moe.forward, "moe.route_all_gather");
  ASSERT_NE(route_gather, nullptr);
  EXPECT_EQ(route_gather->collective, spec::CollectiveKind::kAllGather);
  EXPECT_EQ(route_gather->bytes, 512);
  const Op* route_scatter = find_op(moe.backward, "moe.route_reduce_scatter");
  ASSERT_NE(route_scatter, nullptr);
  EXPECT_EQ(route_scatter->collective, spec::CollectiveKind::kReduceScatter);
  EXPECT_EQ(route_scatter->bytes, 256);
  EXPECT_EQ(moe.sp_partial_params, 2 * 64 + 64 * 8);  // two RMSNorms and the router
  // The shared expert as a dense MLP of 32 over every token.
  EXPECT_DOUBLE_EQ(find_op(moe.forward, "moe.shared_fc1")->flops, 2.0 * 32 * (2 * 16) * 64);
  // The MLP's sequence-parallel gather and reduce-scatter stay where the dense MLP has them.
  EXPECT_NE(find_op(moe.forward, "mlp.all_gather"), nullptr);
  EXPECT_NE(find_op(moe.forward, "mlp.reduce_scatter"), nullptr);
  // Backward: twice each GEMM's FLOPs.
  EXPECT_DOUBLE_EQ(find_op(moe.backward, "moe.fc1")->flops, 2 * fc1->flops);
  // Parameters on a tp rank: attention 64 (64 + 128) / 2 + 64^2 / 2 = 8192, norms 128, router
  // 64 x 8 = 512, 9 experts of 3 x 64 x 32 / 2 = 3072 each.
  EXPECT_EQ(moe.params, 8192 + 128 + 512 + 9 * 3072);
  EXPECT_EQ(moe.params_total, 2 * 8192 + 128 + 512 + 9 * 6144);
  // Its weight matrices as a tp rank holds them (PowerSGD compresses each): QKV [64, 192 / 2],
  // the projection [32, 64], the router [64, 8], each of the 8 experts' FC1 [64, 2 x 16] and FC2
  // [16, 64], the shared expert's the same; their elements are the layer's but for the norms.
  std::vector<WeightMatrix> matrices = {{64, 96}, {32, 64}, {64, 8}};
  for (int e = 0; e < 9; ++e) matrices.insert(matrices.end(), {{64, 32}, {16, 64}});
  EXPECT_EQ(moe.matrices, matrices);
  int64_t elements = 0;
  for (const WeightMatrix& w : moe.matrices) elements += w.rows * w.cols;
  EXPECT_EQ(elements, moe.params - 128);
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
  // The capacity is each expert's: ceil(1.1 x 64 / 8) = ceil(8.8) = 9 rows, 72 for the 8
  // (not ceil(1.1 x 64) = 71: an expert cannot take a fraction of a row).
  const LoweredModel lowered_1p1 = lower_moe(1.1, 1);
  const Op* fc1_1p1 = find_op(lowered_1p1.layers[2].forward, "moe.fc1");
  EXPECT_DOUBLE_EQ(fc1_1p1->executed_flops(), 2.0 * 72 * (2 * 32) * 64);
  // tp must divide the experts' width as it does the dense MLP's.
  EXPECT_THROW(lower_moe(0, 3), InputError);
}

LoweredModel lower_moe_ep(int64_t ep) {
  LoweringOptions o;
  o.micro_batch = 2;
  o.dtype = spec::Dtype::kBf16;
  o.ep = ep;
  return lower(test::small_moe(0), o);
}

// The names of a pass's ops, in order, from `first` on.
std::vector<std::string> names_from(const std::vector<Op>& ops, const std::string& first) {
  std::vector<std::string> out;
  bool on = false;
  for (const Op& op : ops) {
    on = on || op.name == first;
    if (on) out.push_back(op.name);
  }
  return out;
}

TEST(MoeLowering, ExpertParallelRanksHoldTheirExpertsAndExchangeTheTokenCopies) {
  // ep 4 over 8 experts: each rank holds 2 of them. It routes its own 32 tokens, 64 copies of
  // 64 features (bf16: 64 x 64 x 2 = 8192 B), sends them to their experts' ranks and receives as
  // many (balanced routing) for its 2 experts: 32 rows each.
  const LoweredModel m = lower_moe_ep(4);
  const Layer& moe = m.layers[2];
  const Op* fc1 = find_op(moe.forward, "moe.fc1");
  ASSERT_NE(fc1, nullptr);
  EXPECT_DOUBLE_EQ(fc1->flops, 2.0 * 64 * (2 * 32) * 64);  // the same work as without ep
  EXPECT_EQ(fc1->matmuls, (std::vector<MatmulShape>{{2, 32, 64, 64}}));
  // Reads the 64 rows in and the 2 local experts' 64 x 64 weights, writes 64 rows of 64.
  EXPECT_EQ(fc1->bytes, (64 * 64 + 2 * 64 * 64 + 64 * 64) * 2);
  for (const char* name : {"moe.dispatch", "moe.combine"}) {
    const Op* a2a = find_op(moe.forward, name);
    ASSERT_NE(a2a, nullptr) << name;
    EXPECT_EQ(a2a->collective, spec::CollectiveKind::kAllToAll);
    EXPECT_EQ(a2a->group, CommGroup::kExpert);
    EXPECT_EQ(a2a->bytes, 8192);
  }
  // Forward: dispatch after the copies are made, combine after the experts, before the shared
  // expert and the weighted sum; backward: the outputs' gradients back to the experts first, the
  // inputs' gradients back to the tokens' ranks after the experts' backward.
  EXPECT_EQ(names_from(moe.forward, "moe.permute"),
            (std::vector<std::string>{"moe.permute", "moe.dispatch", "moe.fc1", "moe.act",
                                      "moe.fc2", "moe.combine", "moe.shared_fc1", "moe.shared_act",
                                      "moe.shared_fc2", "moe.unpermute", "mlp.residual"}));
  EXPECT_EQ(
      names_from(moe.backward, "moe.combine"),
      (std::vector<std::string>{
          "moe.combine", "moe.fc2", "moe.act", "moe.fc1", "moe.dispatch", "moe.permute",
          "moe.route", "moe.router", "mlp.norm", "mlp.residual", "attn.proj", "attn.context",
          "attn.softmax", "attn.scores", "attn.rope", "attn.qkv", "attn.norm", "attn.residual"}));
  // Parameters: attention 64 (64 + 128) + 64^2 = 16384, norms 128, router 512, the 2 local and
  // the shared expert of 3 x 64 x 32 = 6144 each; the 2 local ones are the expert parameters.
  EXPECT_EQ(moe.params, 16384 + 128 + 512 + 3 * 6144);
  EXPECT_EQ(moe.expert_params, 2 * 6144);
  EXPECT_EQ(moe.params_total, 16384 + 128 + 512 + 9 * 6144);  // the layer's, all ranks
  EXPECT_EQ(moe.routed_expert_params_total, 8 * 6144);
  // The dense layer has none, and without ep nothing is exchanged.
  EXPECT_EQ(m.layers[1].expert_params, 0);
  const LoweredModel whole = lower_moe_ep(1);
  EXPECT_EQ(find_op(whole.layers[2].forward, "moe.dispatch"), nullptr);
  EXPECT_EQ(whole.layers[2].expert_params, 8 * 6144);
}

TEST(MoeLowering, OverTensorParallelismEachRankRoutesItsOwnTokens) {
  // tp 2 with sequence parallelism, ep 2 (Megatron-LM's all-to-all dispatcher): each tp rank
  // routes its 16 of the 32 tokens, exchanges their 32 copies over ep (32 x 64 x 2 = 4096 B),
  // all-gathers the 64 rows of both tp ranks (8192 B) for its 4 experts' column-parallel halves
  // (16 rows each, 2 x 16 columns for SwiGLU), reduce-scatters their output back and returns
  // its rows; the shared expert gathers and scatters the 32 tokens itself (4096 B).
  LoweringOptions o;
  o.micro_batch = 2;
  o.dtype = spec::Dtype::kBf16;
  o.tp = 2;
  o.sequence_parallel = true;
  o.ep = 2;
  const LoweredModel m = lower(test::small_moe(0), o);
  const Layer& moe = m.layers[2];
  EXPECT_EQ(names_from(moe.forward, "mlp.norm"),
            (std::vector<std::string>{
                "mlp.norm", "moe.router", "moe.route", "moe.permute", "moe.dispatch",
                "moe.all_gather", "moe.fc1", "moe.act", "moe.fc2", "moe.reduce_scatter",
                "moe.combine", "moe.shared_all_gather", "moe.shared_fc1", "moe.shared_act",
                "moe.shared_fc2", "moe.shared_reduce_scatter", "moe.unpermute", "mlp.residual"}));
  EXPECT_DOUBLE_EQ(find_op(moe.forward, "moe.router")->flops, 2.0 * 16 * 8 * 64);
  EXPECT_EQ(find_op(moe.forward, "moe.dispatch")->bytes, 4096);
  const Op* gather = find_op(moe.forward, "moe.all_gather");
  EXPECT_EQ(gather->bytes, 8192);
  EXPECT_EQ(gather->collective, spec::CollectiveKind::kAllGather);
  EXPECT_EQ(gather->group, CommGroup::kLayer);
  EXPECT_TRUE(gather->no_tp_overlap);  // beside a grouped GEMM, which TE does not overlap
  EXPECT_EQ(find_op(moe.forward, "moe.reduce_scatter")->bytes, 8192);
  EXPECT_EQ(find_op(moe.forward, "moe.shared_all_gather")->bytes, 4096);
  const Op* fc1 = find_op(moe.forward, "moe.fc1");
  EXPECT_EQ(fc1->matmuls, (std::vector<MatmulShape>{{4, 16, 32, 64}}));
  EXPECT_DOUBLE_EQ(fc1->flops, 2.0 * 64 * 32 * 64);
  // Backward: each collective's conjugate where its forward was.
  EXPECT_EQ(names_from(moe.backward, "moe.unpermute"),
            (std::vector<std::string>{"moe.unpermute",   "moe.shared_all_gather",
                                      "moe.shared_fc2",  "moe.shared_act",
                                      "moe.shared_fc1",  "moe.shared_reduce_scatter",
                                      "moe.combine",     "moe.all_gather",
                                      "moe.fc2",         "moe.act",
                                      "moe.fc1",         "moe.reduce_scatter",
                                      "moe.dispatch",    "moe.permute",
                                      "moe.route",       "moe.router",
                                      "mlp.norm",        "mlp.residual",
                                      "attn.all_gather", "attn.proj",
                                      "attn.context",    "attn.softmax",
                                      "attn.scores",     "attn.rope",
                                      "attn.qkv",        "attn.reduce_scatter",
                                      "attn.norm",       "attn.residual"}));
  // The router's gradient from half the tokens is a partial sum over tp, as the two RMSNorm
  // weights' are: 64 + 64 + 64 x 8.
  EXPECT_EQ(moe.sp_partial_params, 64 + 64 + 512);
  EXPECT_EQ(m.layers[1].sp_partial_params, 64 + 64);
}

TEST(MoeLowering, ExpertParallelismNeedsAMixtureWhoseExpertsItDivides) {
  EXPECT_THROW(lower_moe_ep(3), InputError);  // 8 experts over 3 ranks
  LoweringOptions o;
  o.ep = 2;
  EXPECT_THROW(lower(zoo_model("llama-tiny"), o), InputError);  // no experts to split
}

TEST(MoeBuckets, ExpertGradientsFillBucketsOfTheirOwnUnderExpertParallelism) {
  // dp 4, ep 4: the two local experts' gradients of the MoE layers go to expert buckets, the
  // rest (the dense block, attention, router, shared expert, embedding, head) to dense ones.
  spec::Plan plan;
  plan.dp = 4;
  plan.ep = 4;
  plan.global_batch = 8;
  plan.micro_batch = 2;
  const LoweredModel m = lower_moe_ep(4);
  int64_t dense = 0, experts = 0;
  for (const GradientBucket& b : gradient_buckets(plan, m, 0, int64_t{1} << 30, 2)) {
    (b.experts ? experts : dense) += b.params;
    if (b.experts) {  // the two MoE blocks, last first
      EXPECT_EQ(b.layers, (std::vector<size_t>{3, 2}));
    }
  }
  EXPECT_EQ(experts, 2 * 2 * 6144);
  EXPECT_EQ(dense + experts, stage_params(plan, m, 0));
  EXPECT_EQ(stage_expert_params(plan, m, 0), experts);
  // Without ep every gradient is summed over the same replicas: one kind of bucket.
  plan.ep = 1;
  for (const GradientBucket& b : gradient_buckets(plan, lower_moe_ep(1), 0, int64_t{1} << 30, 2))
    EXPECT_FALSE(b.experts);
  EXPECT_EQ(stage_expert_params(plan, lower_moe_ep(1), 0), 0);
}

}  // namespace
}  // namespace sextant::models
