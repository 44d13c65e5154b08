// Context parallelism in the plan: its fields, its rules and where its ranks sit.
#include "sextant/spec/context_parallel.hpp"

#include <gtest/gtest.h>

#include "expect_input_error.hpp"
#include "sextant/spec/rank_layout.hpp"

namespace sextant::spec {
namespace {

// A decoder of 8 heads (2 key/value heads), sequences of 4096 tokens.
ModelSpec decoder() {
  ModelSpec m;
  m.name = "d";
  TransformerSpec t;
  t.layers = 4;
  t.hidden = 512;
  t.heads = 8;
  t.kv_heads = 2;
  t.ffn_hidden = 2048;
  t.vocab = 1000;
  t.seq_len = 4096;
  t.position_embedding = PositionEmbedding::kRope;
  m.body = t;
  return m;
}

Plan cp_plan(int64_t dp, int64_t tp, int64_t cp, ContextAlgorithm algorithm) {
  Plan p;
  p.dp = dp;
  p.tp = tp;
  p.cp = cp;
  p.cp_algorithm = algorithm;
  p.global_batch = dp;
  return p;
}

TEST(ContextParallel, DecodesNamesAndRoundTrips) {
  const Plan p = plan_from_json(Json::parse(R"({"schema": "sextant.plan/1", "dp": 2, "tp": 2,
      "pp": 1, "zero": 0, "micro_batch": 1, "cp": 4, "cp_algorithm": "all-gather",
      "global_batch": 4})"),
                                "p.json");
  EXPECT_EQ(p.cp, 4);
  EXPECT_EQ(p.cp_algorithm, ContextAlgorithm::kAllGather);
  EXPECT_EQ(p.world_size(), 16);    // dp x tp x cp
  EXPECT_EQ(p.replicas(), 8);       // the cp ranks hold the same parameters as the dp replicas
  EXPECT_EQ(p.micro_batches(), 2);  // sequences split, not shared out: 4 / (dp 2 x mb 1)
  EXPECT_EQ(p.name(), "dp2.tp2.pp1.z0.mb1.cp4ag");
  const Plan back = plan_from_json(to_json(p), "again");
  EXPECT_EQ(back.cp, 4);
  EXPECT_EQ(back.cp_algorithm, ContextAlgorithm::kAllGather);
  EXPECT_EQ(cp_plan(1, 1, 2, ContextAlgorithm::kRing).name(), "dp1.tp1.pp1.z0.mb1.cp2");
  EXPECT_EQ(cp_plan(1, 1, 2, ContextAlgorithm::kAllToAll).name(), "dp1.tp1.pp1.z0.mb1.cp2a2a");
  // An algorithm without a split is a mistake, not a default.
  EXPECT_INPUT_ERROR(plan_from_json(Json::parse(R"({"schema": "sextant.plan/1", "dp": 1,
      "tp": 1, "pp": 1, "zero": 0, "micro_batch": 1, "cp_algorithm": "ring", "global_batch": 1})"),
                                    "p.json"),
                     "/cp_algorithm");
  EXPECT_INPUT_ERROR(plan_from_json(Json::parse(R"({"schema": "sextant.plan/1", "dp": 1,
      "tp": 1, "pp": 1, "zero": 0, "micro_batch": 1, "cp": 2, "cp_algorithm": "zigzag",
      "global_batch": 1})"),
                                    "p.json"),
                     "/cp_algorithm");
}

TEST(ContextParallel, TheRulesNameTheFieldAndTheReason) {
  const ModelSpec m = decoder();
  EXPECT_NO_THROW(validate_plan(cp_plan(2, 2, 2, ContextAlgorithm::kRing), m, 8, "p"));
  EXPECT_INPUT_ERROR(validate_plan(cp_plan(2, 2, 2, ContextAlgorithm::kRing), m, 4, "p"),
                     "dp*tp*pp*cp must equal the number of ranks (4)");
  // 2 x 4096 chunks do not divide 4096 tokens.
  EXPECT_INPUT_ERROR(validate_plan(cp_plan(1, 1, 4096, ContextAlgorithm::kRing), m, 4096, "p"),
                     "2*cp (8192) to divide the sequence length (4096)");
  // Ulysses: 2 key/value heads per rank at tp 1 do not split over 4 ranks; at cp 2 they do.
  EXPECT_INPUT_ERROR(validate_plan(cp_plan(1, 1, 4, ContextAlgorithm::kAllToAll), m, 4, "p"),
                     "/cp");
  EXPECT_NO_THROW(validate_plan(cp_plan(1, 1, 2, ContextAlgorithm::kAllToAll), m, 2, "p"));
  // Sequence parallelism splits the rank's 4096 / 2 tokens over tp: 2 divides them, 3 does not.
  Plan sp = cp_plan(1, 2, 2, ContextAlgorithm::kRing);
  sp.sequence_parallel = true;
  EXPECT_NO_THROW(validate_plan(sp, m, 4, "p"));
  sp.tp = 3;
  EXPECT_EQ(context_parallel_problem(m, 4096, sp),
            "leaves 2048 tokens per rank, which sequence parallelism cannot split over tp 3");
  // Not a transformer.
  ModelSpec mlp;
  mlp.name = "mlp";
  MlpSpec body;
  body.widths = {8, 8};
  mlp.body = body;
  EXPECT_INPUT_ERROR(validate_plan(cp_plan(1, 1, 2, ContextAlgorithm::kRing), mlp, 2, "p"),
                     "splits a transformer's sequences");
  // Ring attention needs a fused kernel; the others do not.
  EXPECT_NE(context_attention_problem(2, ContextAlgorithm::kRing, AttentionKernel::kUnfused), "");
  EXPECT_EQ(context_attention_problem(2, ContextAlgorithm::kRing, AttentionKernel::kFlash2), "");
  EXPECT_EQ(context_attention_problem(2, ContextAlgorithm::kAllGather, AttentionKernel::kUnfused),
            "");
}

TEST(ContextParallel, RanksSitBetweenTensorAndDataParallelism) {
  // dp 2, tp 2, cp 2, pp 2: rank = tp + 2 (cp + 2 (dp + 2 pp)) (Megatron-LM's tp-cp-dp-pp).
  Plan p = cp_plan(2, 2, 2, ContextAlgorithm::kRing);
  p.pp = 2;
  const RankLayout layout(p);
  ASSERT_EQ(layout.world_size(), 16);
  // 13 = 1 + 2 x 6: tp 1; 6 = cp 0 + 2 x 3: cp 0; 3 = dp 1 + 2 x pp 1.
  const RankCoord c = layout.coord(13);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(layout.rank(c), 13);
  EXPECT_EQ(layout.tp_group(13), (std::vector<int64_t>{12, 13}));
  EXPECT_EQ(layout.cp_group(13), (std::vector<int64_t>{13, 15}));
  EXPECT_EQ(layout.dp_group(13), (std::vector<int64_t>{9, 13}));
  // Gradients are summed over the data-parallel replicas and their cp ranks, in (dp, cp) order.
  EXPECT_EQ(layout.replica_group(13), (std::vector<int64_t>{9, 11, 13, 15}));
  EXPECT_EQ(layout.pp_next(13), 5);
  for (int64_t r = 0; r < layout.world_size(); ++r) EXPECT_EQ(layout.rank(layout.coord(r)), r);
}

}  // namespace
}  // namespace sextant::spec
