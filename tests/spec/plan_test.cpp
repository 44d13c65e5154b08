// Plan decoding, rules inside a plan, and rules against a model.
#include "sextant/spec/plan.hpp"

#include <gtest/gtest.h>

#include "expect_input_error.hpp"
#include "sextant/spec/limits.hpp"
#include "sextant/spec/pipeline_schedule.hpp"

namespace sextant::spec {
namespace {

Json base_plan() {
  return Json::parse(R"({"schema": "sextant.plan/1", "dp": 2, "tp": 2, "pp": 2, "zero": 1,
                         "micro_batch": 2, "global_batch": 16})");
}

ModelSpec gpt(int64_t layers, int64_t heads) {
  ModelSpec m;
  m.name = "g";
  TransformerSpec t;
  t.layers = layers;
  t.hidden = 64 * heads;
  t.heads = t.kv_heads = heads;
  t.ffn_hidden = 4 * t.hidden;
  t.vocab = 1000;
  t.seq_len = 128;
  t.max_positions = 128;
  m.body = t;
  return m;
}

TEST(Plan, DecodesWithDefaultsAndNames) {
  Plan p = plan_from_json(base_plan(), "p.json");
  EXPECT_EQ(p.world_size(), 8);
  EXPECT_EQ(p.micro_batches(), 4);  // 16 / (2 * 2)
  EXPECT_EQ(p.schedule, Schedule::k1F1B);
  EXPECT_FALSE(p.stack.has_value());  // the cluster kind decides (plan_stack)
  EXPECT_EQ(p.name(), "dp2.tp2.pp2.z1.mb2.1f1b");
}

TEST(Plan, AsRunPricesFsdpsZeroTwoAsZeroThreeKeepingEveryUnit) {
  // ZeRO-2 over replicas under a stack whose ZeRO-2 is FSDP's (TorchTitan's) is ZeRO-3 with no
  // unit resharded after its forward; under DeepSpeed's (Megatron-Core's), on one replica, or at
  // any other stage it runs as written.
  Plan plan;
  plan.dp = 4;
  plan.micro_batch = 1;
  plan.global_batch = 8;
  plan.zero = 2;
  const Stack titan = builtin_stack("torchtitan");
  const PlanAsRun fsdp = as_run(plan, titan);
  EXPECT_EQ(fsdp.plan.zero, 3);
  EXPECT_EQ(fsdp.stack.reshard_after_forward, ReshardAfterForward::kNone);
  EXPECT_EQ(as_run(plan, builtin_stack("megatron-core")).plan.zero, 2);
  for (int zero : {0, 1, 3}) {
    plan.zero = zero;
    EXPECT_EQ(as_run(plan, titan).plan.zero, zero);
    EXPECT_EQ(as_run(plan, titan).stack.reshard_after_forward, titan.reshard_after_forward);
  }
  plan.zero = 2;
  plan.dp = 1;
  plan.global_batch = 2;
  EXPECT_EQ(as_run(plan, titan).plan.zero, 2);
}

TEST(Plan, RoundTrips) {
  Json j = base_plan();
  j["collective_algorithms"] = Json::parse(R"({"all_reduce": "ring"})");
  j["schedule"] = "interleaved";
  j["virtual_stages"] = 2;
  Plan p = plan_from_json(j, "p.json");
  EXPECT_EQ(to_json(plan_from_json(to_json(p), "again")), to_json(p));
  EXPECT_EQ(p.collective_algorithms.at(CollectiveKind::kAllReduce), CollectiveAlgorithm::kRing);
}

// A CNN channel split's own algorithms: "x", "y", "w" per convolution, named ".chan", round-trip;
// anything else is refused naming the entry, w without a grid and a list without tp naming the
// field, and a list on a transformer against the model.
TEST(Plan, ChannelAlgorithmsDecodeRoundTripAndAreChecked) {
  Json j = base_plan();
  j["tp"] = 4;
  j["pp"] = 1;
  j["dp"] = 2;
  j["channel_algorithms"] = Json::parse(R"(["x", "w", "y"])");
  Plan p = plan_from_json(j, "p.json");
  EXPECT_EQ(p.channel_algorithms, (std::vector<ChannelAlgorithm>{ChannelAlgorithm::kStationaryX,
                                                                 ChannelAlgorithm::kStationaryW,
                                                                 ChannelAlgorithm::kStationaryY}));
  EXPECT_EQ(p.name(), "dp2.tp4.pp1.z1.mb2.chan");
  EXPECT_EQ(to_json(plan_from_json(to_json(p), "again")), to_json(p));
  j["channel_algorithms"] = Json::parse(R"(["x", "z"])");
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"),
                     "/channel_algorithms/1 = \"z\": \"x\", \"y\" or \"w\"");
  j["channel_algorithms"] = Json::parse(R"(["whole"])");
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "never chosen");
  j["tp"] = 2;
  j["channel_algorithms"] = Json::parse(R"(["w"])");
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "/channel_algorithms = 1 entries: entry 0: w");
  j["tp"] = 1;
  j["channel_algorithms"] = Json::parse(R"(["x"])");
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "needs tp > 1");
  p.tp = 2;
  p.channel_algorithms = {ChannelAlgorithm::kStationaryX};
  p.global_batch = 4;
  EXPECT_INPUT_ERROR(validate_plan(p, gpt(4, 4), 4, "p"), "a CNN only");
}

TEST(Plan, GlobalBatchMustDivideIntoMicroBatches) {
  Json j = base_plan();
  j["global_batch"] = 10;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"),
                     "/global_batch = 10: must be a multiple of dp*micro_batch (2*2 = 4)");
}

// Sizes past spec/limits.hpp are refused before any work: a global batch of 10^9 sequences in
// micro-batches of 1 made `simulate` and `plan` run until killed (10^9 micro-batches to schedule),
// and degrees of 2^24 each overflowed dp*tp*pp.
TEST(Plan, SizesPastTheLimitsAreRefused) {
  Json j = base_plan();
  j["global_batch"] = 1'000'000'000;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"),
                     "/global_batch = 1000000000: must be in [1, 16777216]");
  // 2^18 sequences over dp 2 in micro-batches of 2: 2^16 micro-batches per replica, the limit.
  j["global_batch"] = 1 << 18;
  EXPECT_EQ(plan_from_json(j, "p.json").micro_batches(), kMaxMicroBatches);
  j["global_batch"] = 1 << 19;  // 2^17 micro-batches
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"),
                     "/global_batch = 524288: gives 131072 micro-batches per replica per step; "
                     "at most 65536");
  j = base_plan();
  j["dp"] = int64_t{1} << 25;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "/dp = 33554432: must be in [1, 16777216]");
  j["dp"] = j["tp"] = j["pp"] = 1 << 10;  // 2^30 ranks
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "dp*tp*pp must be at most 16777216 ranks");
}

TEST(Plan, VirtualStagesNeedTheInterleavedSchedule) {
  Json j = base_plan();
  j["virtual_stages"] = 2;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "must be 1 unless schedule is \"interleaved\"");
}

// PipeDream-2BW: a schedule of its own (named also with one stage, where it is still a different
// training rule), at least pp micro-batches per replica (m >= d: two weight versions suffice), a
// whole stashed version (no ZeRO-3), no offload.
TEST(Plan, PipeDream2BWNamesItselfAndNeedsAsManyMicroBatchesAsStages) {
  Json j = base_plan();  // dp2 tp2 pp2, 4 micro-batches
  j["schedule"] = "pipedream-2bw";
  Plan p = plan_from_json(j, "p.json");
  EXPECT_EQ(p.schedule, Schedule::kPipeDream2BW);
  EXPECT_EQ(p.name(), "dp2.tp2.pp2.z1.mb2.2bw");
  EXPECT_EQ(to_json(plan_from_json(to_json(p), "again")), to_json(p));
  j["pp"] = 1;
  EXPECT_EQ(plan_from_json(j, "p.json").name(), "dp2.tp2.pp1.z1.mb2.2bw");
  j["pp"] = 8;  // 4 micro-batches for 8 stages
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"),
                     "/schedule = \"pipedream-2bw\": needs at least pp (8) micro-batches per "
                     "replica, has 4");
  j["pp"] = 1;
  j["zero"] = 3;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "ZeRO-3 shards: use zero <= 1");
  j["pp"] = 2;
  j["zero"] = 1;
  j["virtual_stages"] = 2;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "must be 1 unless schedule is \"interleaved\"");
  // One batch on its own runs 1F1B's units; back to back, one stream without a flush.
  EXPECT_EQ(pipeline_schedule(Schedule::kPipeDream2BW, 4, 1, 8, 1).size(),
            pipeline_schedule(Schedule::k1F1B, 4, 1, 8, 1).size());
  const std::vector<ScheduleUnit> two = pipedream_2bw_units(4, 8, 2, 0);
  ASSERT_EQ(two.size(), 32u);
  // Stage 0 of 4 starts batch 1's first micro-batch (8) before batch 0's last backward (7):
  // warm-up 3, then forward k + 3 before backward k.
  size_t forward8 = 0, backward7 = 0;
  for (size_t i = 0; i < two.size(); ++i) {
    if (two[i].forward && two[i].micro_batch == 8) forward8 = i;
    if (!two[i].forward && two[i].micro_batch == 7) backward7 = i;
  }
  EXPECT_LT(forward8, backward7);
  EXPECT_EQ(pipedream_2bw_version(0), 0);
  EXPECT_EQ(pipedream_2bw_version(1), 0);
  EXPECT_EQ(pipedream_2bw_version(5), 4);
}

// PipeDream: one micro-batch a batch per replica, ZeRO 0, no offload; named; each stage its own
// staleness; the simulator's window of pp + 1 batches.
TEST(Plan, PipeDreamUpdatesAfterEveryBatchOfOneMicroBatch) {
  Json j = base_plan();  // dp2 tp2 pp2, 4 micro-batches
  j["schedule"] = "pipedream";
  j["zero"] = 0;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"),
                     "/schedule = \"pipedream\": updates after every batch of one micro-batch "
                     "per replica (PipeDream's minibatch), has 4");
  j["micro_batch"] = 8;
  const Plan p = plan_from_json(j, "p.json");
  EXPECT_EQ(p.schedule, Schedule::kPipeDream);
  EXPECT_TRUE(asynchronous(p.schedule));
  EXPECT_FALSE(asynchronous(Schedule::k1F1B));
  EXPECT_EQ(p.name(), "dp2.tp2.pp2.z0.mb8.pipedream");
  EXPECT_EQ(to_json(plan_from_json(to_json(p), "again")), to_json(p));
  EXPECT_EQ(asynchronous_window(p), 3);
  j["zero"] = 1;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "use zero 0");
  // Stage 0 of 4 reads batch t three updates behind, the last stage none behind.
  EXPECT_EQ(pipedream_version(2, 4, 0), 0);
  EXPECT_EQ(pipedream_version(7, 4, 0), 4);
  EXPECT_EQ(pipedream_version(7, 4, 2), 6);
  EXPECT_EQ(pipedream_version(7, 4, 3), 7);
}

TEST(Plan, ZeroTwoWithPipelineIsRejected) {
  Json j = base_plan();
  j["zero"] = 2;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "use zero <= 1 with pp > 1");
}

// A plan built in code meets the same rules, in the same words, as a plan file (one home:
// validate_plan asks the rules plan_from_json asks).
TEST(Plan, PlansBuiltInCodeMeetThePlanFileRules) {
  Plan p = plan_from_json(base_plan(), "p.json");
  p.zero = 2;
  p.pp = 2;
  p.dp = 2;
  p.tp = 2;
  Json j = to_json(p);
  const std::string rule = "/zero = 2: ZeRO-2/3 shard gradients that pipeline parallelism";
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), rule);
  EXPECT_INPUT_ERROR(validate_plan(p, gpt(4, 4), 8, "p.json"), rule);
  p.zero = 0;
  p.sequence_parallel = true;
  p.tp = 1;
  p.dp = 4;
  EXPECT_INPUT_ERROR(validate_plan(p, gpt(4, 4), 8, "p.json"),
                     "/sequence_parallel = true: needs tp > 1");
  p.sequence_parallel = false;
  p.micro_batch = 0;
  EXPECT_INPUT_ERROR(validate_plan(p, gpt(4, 4), 8, "p.json"), "must be >= 1");
}

TEST(Plan, ZeroStageOutOfRange) {
  Json j = base_plan();
  j["zero"] = 4;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "/zero = 4: must be in [0, 3]");
}

TEST(Plan, ValidateAgainstModelAndRanks) {
  Plan p = plan_from_json(base_plan(), "p.json");
  EXPECT_NO_THROW(validate_plan(p, gpt(4, 4), 8, "p.json"));
  EXPECT_INPUT_ERROR(validate_plan(p, gpt(4, 4), 16, "p.json"),
                     "dp*tp*pp must equal the number of ranks (16)");
  EXPECT_INPUT_ERROR(validate_plan(p, gpt(4, 3), 8, "p.json"), "must divide the 3 attention heads");
  p.pp = 8;
  p.dp = 1;
  p.tp = 1;
  EXPECT_INPUT_ERROR(validate_plan(p, gpt(4, 4), 8, "p.json"),
                     "pp*virtual_stages (8) must not exceed the model's 4 layers");
}

TEST(Plan, StageLayersMustCoverTheModel) {
  Json j = base_plan();
  j["stage_layers"] = {3, 3};
  Plan p = plan_from_json(j, "p.json");
  EXPECT_INPUT_ERROR(validate_plan(p, gpt(4, 4), 8, "p.json"),
                     "must add up to the model's 4 layers");
}

TEST(Plan, EvenSplitGivesTheRemainderToLaterStages) {
  Plan p;
  p.pp = 3;
  EXPECT_EQ(stage_layer_counts(p, 10), (std::vector<int64_t>{3, 3, 4}));
  p.pp = 2;
  p.virtual_stages = 2;
  EXPECT_EQ(stage_layer_counts(p, 8), (std::vector<int64_t>{2, 2, 2, 2}));
}

// Megatron's block method: the first N layers of each chunk are recomputed, the rest are not.
// Chunks of 3 and 4 layers (pp 2, stage_layers {3, 4}) with N = 2: units 0-1 and 3-4 recomputed,
// 2 and 5-6 not; with two chunks of 2 per stage interleaved (pp 2, v 2, 8 layers) and N = 1: the
// first layer of each chunk, units 0, 2, 4, 6.
TEST(Plan, RecomputeLayersRecomputeTheFirstLayersOfEachChunk) {
  using R = Recompute;
  Plan p;
  p.pp = 2;
  p.stage_layers = {3, 4};
  p.recompute = R::kFull;
  EXPECT_EQ(unit_recompute(p, 7), std::vector<R>(7, R::kFull));  // 0: every layer
  p.recompute_layers = 2;
  EXPECT_EQ(unit_recompute(p, 7),
            (std::vector<R>{R::kFull, R::kFull, R::kNone, R::kFull, R::kFull, R::kNone, R::kNone}));
  EXPECT_EQ(p.name(), "dp1.tp1.pp2.z0.mb1.1f1b.split.rc-full2");
  p.stage_layers.clear();
  p.schedule = Schedule::kInterleaved;
  p.virtual_stages = 2;
  p.recompute_layers = 1;
  EXPECT_EQ(unit_recompute(p, 8), (std::vector<R>{R::kFull, R::kNone, R::kFull, R::kNone, R::kFull,
                                                  R::kNone, R::kFull, R::kNone}));
  p.recompute = R::kSelective;  // (refused by the rules; the modes stay the plan's)
  EXPECT_EQ(unit_recompute(p, 8), std::vector<R>(8, R::kSelective));
}

// KARMA's split: with the activations of the first 2 units of each chunk offloaded and full
// recompute of 3, the 3 recomputed are units 2-4 of a 6-unit chunk; 0 and 1 are swapped whole and
// 5 keeps its activations. Offloading every unit (activation_layers 0) beside recompute is
// DeepSpeed's cpu_checkpointing, whose recomputed layers stay the first ones.
TEST(Plan, SwappedLayersComeBeforeTheRecomputedOnes) {
  using R = Recompute;
  Plan p;
  p.recompute = R::kFull;
  p.recompute_layers = 3;
  p.offload.activations = OffloadTarget::kHost;
  p.offload.activation_layers = 2;
  EXPECT_TRUE(swaps_and_recomputes(p));
  EXPECT_EQ(unit_recompute(p, 6),
            (std::vector<R>{R::kNone, R::kNone, R::kFull, R::kFull, R::kFull, R::kNone}));
  EXPECT_EQ(unit_activation_offload(p, 6),
            (std::vector<bool>{true, true, false, false, false, false}));
  EXPECT_EQ(p.name(), "dp1.tp1.pp1.z0.mb1.rc-full3.off-act2");
  p.offload.activation_layers = 0;
  EXPECT_FALSE(swaps_and_recomputes(p));
  EXPECT_EQ(unit_recompute(p, 6),
            (std::vector<R>{R::kFull, R::kFull, R::kFull, R::kNone, R::kNone, R::kNone}));
}

TEST(Plan, RecomputeLayersNeedFullRecomputeAndAChunkThatLong) {
  Json j = base_plan();
  j["recompute_layers"] = 2;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"),
                     "/recompute_layers = 2: applies to recompute \"full\" only");
  j["recompute"] = "full";
  Plan p = plan_from_json(j, "p.json");
  EXPECT_EQ(p.recompute_layers, 2);
  EXPECT_EQ(plan_from_json(to_json(p), "again").recompute_layers, 2);
  EXPECT_NO_THROW(validate_plan(p, gpt(4, 4), 8, "p.json"));  // chunks of 2
  p.recompute_layers = 3;
  EXPECT_INPUT_ERROR(validate_plan(p, gpt(4, 4), 8, "p.json"),
                     "/recompute_layers = 3: must not exceed the layers of the largest stage "
                     "chunk (2)");
  j["recompute_layers"] = -1;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "/recompute_layers = -1");
}

}  // namespace
}  // namespace sextant::spec

namespace sextant::spec {
namespace {

Json ddp_plan(const std::string& compression) {
  Json j = Json::parse(R"({"schema": "sextant.plan/1", "dp": 4, "tp": 1, "pp": 1, "zero": 0,
                           "micro_batch": 1,
                           "global_batch": 8})");
  j["compression"] = Json::parse(compression);
  return j;
}

TEST(PlanCompression, DecodesNamesAndRoundTrips) {
  Plan q = plan_from_json(ddp_plan(R"({"kind": "qsgd", "bits": 2, "bucket": 128})"), "p.json");
  EXPECT_EQ(q.compression.kind, CompressionKind::kQsgd);
  EXPECT_EQ(q.compression.bits, 2);
  EXPECT_EQ(q.compression.bucket, 128);
  EXPECT_TRUE(q.compression.error_feedback);  // the default: compression without it diverges
  EXPECT_EQ(q.name(), "dp4.tp1.pp1.z0.mb1.qsgd2b128");
  Plan t = plan_from_json(ddp_plan(R"({"kind": "topk", "ratio": 0.001,
                                        "error_feedback": false})"),
                          "p.json");
  EXPECT_EQ(t.name(), "dp4.tp1.pp1.z0.mb1.topk0.001-noef");
  Plan o = plan_from_json(ddp_plan(R"({"kind": "onebit"})"), "p.json");
  EXPECT_EQ(o.compression.bucket, 512);
  EXPECT_EQ(o.name(), "dp4.tp1.pp1.z0.mb1.onebit512");
  Plan w = plan_from_json(ddp_plan(R"({"kind": "powersgd", "rank": 4})"), "p.json");
  EXPECT_EQ(w.compression.rank, 4);
  EXPECT_EQ(w.name(), "dp4.tp1.pp1.z0.mb1.powersgd4");
  EXPECT_EQ(plan_from_json(ddp_plan(R"({"kind": "powersgd"})"), "p.json").compression.rank, 1);
  Plan sparse = plan_from_json(ddp_plan(R"({"kind": "sparcml", "ratio": 0.02})"), "p.json");
  EXPECT_EQ(sparse.compression.ratio, 0.02);
  EXPECT_EQ(sparse.name(), "dp4.tp1.pp1.z0.mb1.sparcml0.02");
  EXPECT_EQ(sparse.compression.sparse_algorithm, SparseAlgorithm::kRecursiveDoubling);
  Plan split = plan_from_json(
      ddp_plan(R"({"kind": "sparcml", "ratio": 0.02, "algorithm": "split_allgather"})"), "p.json");
  EXPECT_EQ(split.compression.sparse_algorithm, SparseAlgorithm::kSplitAllGather);
  EXPECT_EQ(split.name(), "dp4.tp1.pp1.z0.mb1.sparcml0.02split");
  EXPECT_EQ(compression_from_text("sparcml:ratio=0.02,algorithm=split_allgather", "--compression"),
            split.compression);
  // The text form reads back as the same compression.
  EXPECT_EQ(compression_text(split.compression),
            "sparcml:ratio=0.02,algorithm=split_allgather,error_feedback=true");
  for (const Plan& p : {q, t, o, w, sparse, split})
    EXPECT_EQ(compression_from_text(compression_text(p.compression), "text"), p.compression)
        << compression_text(p.compression);
  // A search tries both of SparCML's algorithms unless the text names one.
  const std::vector<GradientCompression> both = searched_compressions("sparcml:ratio=0.02", "f");
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0], sparse.compression);
  EXPECT_EQ(both[1], split.compression);
  EXPECT_EQ(searched_compressions("sparcml:algorithm=recursive_doubling", "f").size(), 1u);
  EXPECT_EQ(searched_compressions("topk", "f").size(), 1u);
  for (const Plan& p : {q, t, o, w, sparse, split}) {
    EXPECT_EQ(plan_from_json(to_json(p), "again.json").compression, p.compression) << p.name();
  }
  // No compression writes nothing.
  EXPECT_FALSE(to_json(Plan{}).contains("compression"));
}

TEST(PlanCompression, KnobsOfAnotherKindAndBadValuesAreRefused) {
  EXPECT_INPUT_ERROR(plan_from_json(ddp_plan(R"({"kind": "topk", "bits": 4})"), "p.json"),
                     "/compression/bits");
  EXPECT_INPUT_ERROR(plan_from_json(ddp_plan(R"({"kind": "qsgd", "ratio": 0.1})"), "p.json"),
                     "applies to kind \"topk\" and \"sparcml\" only");
  EXPECT_INPUT_ERROR(plan_from_json(ddp_plan(R"({"kind": "qsgd", "bits": 3})"), "p.json"),
                     "must be 2, 4 or 8");
  EXPECT_INPUT_ERROR(plan_from_json(ddp_plan(R"({"kind": "topk", "ratio": 1})"), "p.json"),
                     "must be in (0, 1)");
  EXPECT_INPUT_ERROR(plan_from_json(ddp_plan(R"({"kind": "gzip"})"), "p.json"),
                     "/compression/kind");
  EXPECT_INPUT_ERROR(plan_from_json(ddp_plan(R"({"kind": "powersgd", "rank": 0})"), "p.json"),
                     "/compression/rank");
  EXPECT_INPUT_ERROR(plan_from_json(ddp_plan(R"({"kind": "onebit", "rank": 2})"), "p.json"),
                     "applies to kind \"powersgd\" only");
  EXPECT_INPUT_ERROR(
      plan_from_json(ddp_plan(R"({"kind": "none", "error_feedback": true})"), "p.json"),
      "/compression/error_feedback");
  EXPECT_INPUT_ERROR(
      plan_from_json(ddp_plan(R"({"kind": "topk", "algorithm": "split_allgather"})"), "p.json"),
      "applies to kind \"sparcml\" only");
  EXPECT_INPUT_ERROR(
      plan_from_json(ddp_plan(R"({"kind": "sparcml", "algorithm": "ring"})"), "p.json"),
      "must be one of");
  EXPECT_INPUT_ERROR(compression_from_text("topk:ratio=lots", "--compression"), "/ratio");
}

TEST(PlanCompression, OnlyDdpWithSeveralReplicasCompresses) {
  Json zero = ddp_plan(R"({"kind": "onebit"})");
  zero["zero"] = 1;
  EXPECT_INPUT_ERROR(plan_from_json(zero, "p.json"), "ZeRO's reduce-scatter is not compressed");
  Json alone = ddp_plan(R"({"kind": "onebit"})");
  alone["dp"] = 1;
  EXPECT_INPUT_ERROR(plan_from_json(alone, "p.json"), "needs dp > 1");
  // SparCML pairs the ranks by the bits of their index.
  Json three = ddp_plan(R"({"kind": "sparcml"})");
  three["dp"] = 3;
  three["global_batch"] = 6;
  EXPECT_INPUT_ERROR(plan_from_json(three, "p.json"), "needs dp a power of two");
  EXPECT_EQ(sparcml_problem(8, SparseAlgorithm::kRecursiveDoubling), "");
  // Its split all-gather gives each rank a range, whatever their number.
  three["compression"]["algorithm"] = "split_allgather";
  EXPECT_EQ(plan_from_json(three, "p.json").dp, 3);
  // The same rules for a plan built in code.
  Plan p;
  p.compression.kind = CompressionKind::kQsgd;
  p.compression.bits = 5;
  p.dp = 2;
  p.global_batch = 2;
  EXPECT_INPUT_ERROR(validate_plan(p, gpt(2, 2), 2, "code"), "/compression/bits");
}

}  // namespace
}  // namespace sextant::spec
