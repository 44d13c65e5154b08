// Expert parallelism in the plan: its field, its rules and where its ranks sit.
#include "sextant/spec/expert_parallel.hpp"

#include <gtest/gtest.h>

#include "expect_input_error.hpp"
#include "sextant/spec/rank_layout.hpp"

namespace sextant::spec {
namespace {

// A mixture of 8 experts (top-2) in 4 layers.
ModelSpec mixture() {
  ModelSpec m;
  m.name = "moe";
  TransformerSpec t;
  t.layers = 4;
  t.hidden = 256;
  t.heads = 4;
  t.kv_heads = 4;
  t.ffn_hidden = 512;
  t.vocab = 1000;
  t.seq_len = 128;
  MoeSpec moe;
  moe.experts = 8;
  moe.top_k = 2;
  moe.expert_ffn_hidden = 512;
  t.moe = moe;
  m.body = t;
  return m;
}

Plan ep_plan(int64_t dp, int64_t ep) {
  Plan p;
  p.dp = dp;
  p.ep = ep;
  p.global_batch = dp;
  return p;
}

TEST(ExpertParallel, DecodesNamesAndRoundTrips) {
  const Plan p = plan_from_json(Json::parse(R"({"schema": "sextant.plan/1", "dp": 8, "tp": 1,
      "pp": 2, "zero": 1, "micro_batch": 1, "ep": 4, "global_batch": 16})"),
                                "p.json");
  EXPECT_EQ(p.ep, 4);
  EXPECT_EQ(p.world_size(), 16);      // ep ranks are data-parallel ranks: dp x pp
  EXPECT_EQ(p.replicas(), 8);         // dense gradients summed over all of dp
  EXPECT_EQ(p.expert_replicas(), 2);  // an expert's over the 8 / 4 ranks holding it
  EXPECT_EQ(p.name(), "dp8.tp1.pp2.z1.mb1.1f1b.ep4");
  EXPECT_EQ(plan_from_json(to_json(p), "again").ep, 4);
  EXPECT_EQ(to_json(ep_plan(2, 1)).count("ep"), 0u);  // written only when it splits
}

TEST(ExpertParallel, TheRulesNameTheFieldAndTheReason) {
  const ModelSpec m = mixture();
  EXPECT_NO_THROW(validate_plan(ep_plan(8, 8), m, 8, "p"));
  EXPECT_NO_THROW(validate_plan(ep_plan(8, 2), m, 8, "p"));
  // ep is carved out of dp.
  EXPECT_INPUT_ERROR(validate_plan(ep_plan(6, 4), m, 6, "p"), "must divide dp (6)");
  // Each rank holds experts/ep of them whole: 8 experts do not split over 16 ranks.
  EXPECT_INPUT_ERROR(validate_plan(ep_plan(16, 16), m, 16, "p"),
                     "must divide the model's 8 routed experts");
  // With tensor parallelism each tp rank routes its own tokens: sequence parallelism, with or
  // without ep (Megatron-LM's rule for a MoE with tp), named on the field to set.
  Plan tp = ep_plan(4, 4);
  tp.tp = 2;
  EXPECT_INPUT_ERROR(validate_plan(tp, m, 8, "p"), "with tp 2 needs sequence parallelism");
  EXPECT_INPUT_ERROR(validate_plan(tp, m, 8, "p"), "/sequence_parallel");
  tp.sequence_parallel = true;
  EXPECT_NO_THROW(validate_plan(tp, m, 8, "p"));
  Plan tp_only = ep_plan(4, 1);
  tp_only.tp = 2;
  EXPECT_INPUT_ERROR(validate_plan(tp_only, m, 8, "p"), "with tp 2 needs sequence parallelism");
  tp_only.sequence_parallel = true;
  EXPECT_NO_THROW(validate_plan(tp_only, m, 8, "p"));
  EXPECT_EQ(moe_tensor_parallel_problem(m, 1, false), "");  // one rank routes every token
  // Not beside offload or compression (yet).
  Plan z3 = ep_plan(4, 4);
  z3.zero = 3;  // the experts' shards over the expert replicas (TorchTitan's FSDP2 with ep)
  EXPECT_NO_THROW(validate_plan(z3, m, 4, "p"));
  Plan off = ep_plan(4, 4);
  off.zero = 1;
  off.offload.optimizer = OffloadTarget::kHost;
  EXPECT_INPUT_ERROR(validate_plan(off, m, 4, "p"), "runs without optimizer or parameter offload");
  // A plan file says which field is wrong.
  EXPECT_INPUT_ERROR(plan_from_json(Json::parse(R"({"schema": "sextant.plan/1", "dp": 6,
      "tp": 1, "pp": 1, "zero": 0, "micro_batch": 1, "ep": 4, "global_batch": 6})"),
                                    "p.json"),
                     "/ep");
  // A dense model has no experts to split.
  ModelSpec dense = m;
  dense.transformer().moe.reset();
  EXPECT_INPUT_ERROR(validate_plan(ep_plan(4, 4), dense, 4, "p"), "mixture-of-experts");
}

TEST(ExpertParallel, ExpertRanksAreConsecutiveDataParallelRanks) {
  // dp 4, ep 2, cp 2, pp 2: rank = cp + 2 (dp + 4 pp). Rank 13 = 1 + 2 x 6: cp 1, dp 2, pp 1.
  Plan p = ep_plan(4, 2);
  p.cp = 2;
  p.pp = 2;
  const RankLayout layout(p);
  ASSERT_EQ(layout.world_size(), 16);
  // Its ep block is dp 2 and 3 (Megatron's ep inside dp), at its cp and pp place.
  EXPECT_EQ(layout.ep_group(13), (std::vector<int64_t>{13, 15}));
  EXPECT_EQ(layout.ep_group(15), (std::vector<int64_t>{13, 15}));
  // Its experts are also held by dp 0 (the first of the other block); their gradients are summed
  // over those dp ranks with every cp rank, in (dp, cp) order: 8 + {0, 1}, 8 + 4 + {0, 1}.
  EXPECT_EQ(layout.expert_replica_group(13), (std::vector<int64_t>{8, 9, 12, 13}));
  EXPECT_EQ(layout.expert_replica_group(13).size(), static_cast<size_t>(p.expert_replicas()));
  // Without ep, the expert replicas are all the replicas.
  const RankLayout plain(ep_plan(4, 1));
  EXPECT_EQ(plain.expert_replica_group(1), plain.replica_group(1));
  EXPECT_EQ(plain.ep_group(1), (std::vector<int64_t>{1}));
}

}  // namespace
}  // namespace sextant::spec
