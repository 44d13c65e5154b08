// Software stacks: the shipped presets, a plan's "stack" value, and the errors for bad ones.
#include "sextant/spec/stack.hpp"

#include <gtest/gtest.h>

#include "expect_input_error.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::spec {
namespace {

Json plan_with(Json stack) {
  Json j = Json::parse(R"({"schema": "sextant.plan/1", "dp": 2, "tp": 1, "pp": 1, "zero": 0,
                           "micro_batch": 1, "global_batch": 2})");
  j["stack"] = std::move(stack);
  return j;
}

TEST(Stack, EveryPresetCitesASourceForEveryKnob) {
  std::vector<std::string> names = builtin_stack_names();
  for (const char* expected :
       {"megatron-lm", "megatron-core", "deepspeed", "pytorch-fsdp", "torchtitan",
        "torchtitan-compiled", "llm.c", "mosaic-mpt", "sextant"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
  for (const std::string& name : names) {
    Stack s = builtin_stack(name);
    EXPECT_EQ(s.preset, name);
    for (std::string_view knob : stack_knob_names()) {
      auto it = s.sources.find(std::string(knob));
      ASSERT_NE(it, s.sources.end()) << name << " has no source for " << knob;
      EXPECT_GT(it->second.size(), 20u) << name << "/" << knob;
    }
    // Which knobs a search may vary is the software's, and cited too.
    EXPECT_GT(s.sources["tunable"].size(), 20u) << name;
  }
  // Sextant's own executor honours the gradient bucket and its overlap, nothing else.
  EXPECT_EQ(builtin_stack("sextant").tunable,
            (std::vector<std::string>{"dp_overlap", "dp_bucket_bytes"}));
  EXPECT_EQ(builtin_stack("megatron-core").tunable.size(), tunable_knob_names().size());
}

TEST(Stack, TunableNamesKnownKnobsOnce) {
  Json j = stack_file_json(builtin_stack("sextant"));
  EXPECT_EQ(stack_from_json(j, "s.json").tunable, builtin_stack("sextant").tunable);
  j["tunable"] = {"dp_overlap", "attention"};
  EXPECT_INPUT_ERROR(stack_from_json(j, "s.json"),
                     "s.json: /tunable = \"attention\": each entry once, one of tp_overlap");
  j["tunable"] = {"dp_overlap", "dp_overlap"};
  EXPECT_INPUT_ERROR(stack_from_json(j, "s.json"), "/tunable = \"dp_overlap\": each entry once");
}

TEST(Stack, PresetsSayWhatTheirStacksDo) {
  // Spot checks against the stacks' documented behaviour (docs/FORMATS.md cites each).
  Stack lm = builtin_stack("megatron-lm");
  EXPECT_EQ(lm.attention, AttentionKernel::kUnfused);
  EXPECT_FALSE(lm.dp_overlap);
  EXPECT_EQ(lm.precision, Dtype::kFp16);
  Stack core = builtin_stack("megatron-core");
  EXPECT_TRUE(is_fused_attention(core.attention));
  EXPECT_EQ(core.tp_overlap, TpOverlap::kPipelined);
  EXPECT_TRUE(core.param_gather_overlap);
  EXPECT_EQ(core.grad_dtype, Dtype::kFp32);
  EXPECT_EQ(builtin_stack("deepspeed").zero3, Zero3Impl::kDeepspeed);
  EXPECT_EQ(builtin_stack("torchtitan").fusion, Fusion::kEager);
  EXPECT_EQ(builtin_stack("torchtitan-compiled").fusion, Fusion::kCompiled);
}

TEST(Stack, ReshardPoliciesSayWhichUnitsAreGatheredAgainForBackward) {
  // FSDP's root unit (embedding, final norm, head) keeps its parameters from forward to backward
  // (FSDP1 _post_forward_reshard, FSDP2's root); TorchTitan before v0.2 also kept its last block;
  // TorchTitan since keeps [norm, output], and under pipeline parallelism every unit.
  using R = ReshardAfterForward;
  using U = ShardUnit;
  for (U unit : {U::kEmbedding, U::kBlock, U::kLastBlock, U::kHead}) {
    EXPECT_TRUE(regathers_for_backward(R::kAll, unit, false));
    EXPECT_TRUE(regathers_for_backward(R::kAll, unit, true));
  }
  EXPECT_FALSE(regathers_for_backward(R::kBlocks, U::kEmbedding, false));
  EXPECT_TRUE(regathers_for_backward(R::kBlocks, U::kLastBlock, false));
  EXPECT_FALSE(regathers_for_backward(R::kBlocks, U::kHead, false));
  EXPECT_TRUE(regathers_for_backward(R::kBlocksButLast, U::kBlock, false));
  EXPECT_FALSE(regathers_for_backward(R::kBlocksButLast, U::kLastBlock, false));
  EXPECT_FALSE(regathers_for_backward(R::kBlocksButLast, U::kEmbedding, false));
  EXPECT_TRUE(regathers_for_backward(R::kAllButHead, U::kEmbedding, false));
  EXPECT_TRUE(regathers_for_backward(R::kAllButHead, U::kLastBlock, false));
  EXPECT_FALSE(regathers_for_backward(R::kAllButHead, U::kHead, false));
  EXPECT_FALSE(regathers_for_backward(R::kAllButHead, U::kBlock, true));
  // The presets: TorchTitan's FSDP2 copies its gathered parameters out; FSDP1 keeps the root.
  EXPECT_TRUE(builtin_stack("torchtitan").param_copy_out);
  EXPECT_EQ(builtin_stack("torchtitan").reshard_after_forward, R::kAllButHead);
  EXPECT_EQ(builtin_stack("pytorch-fsdp").reshard_after_forward, R::kBlocks);
  EXPECT_FALSE(builtin_stack("pytorch-fsdp").param_copy_out);
  EXPECT_EQ(builtin_stack("deepspeed").reshard_after_forward, R::kAll);
  // A plan may override the policy by name; an unknown name is refused, listing the choices.
  Plan p = plan_from_json(plan_with({{"preset", "torchtitan"}, {"reshard_after_forward", "all"}}),
                          "p.json");
  EXPECT_EQ(p.stack->reshard_after_forward, R::kAll);
  EXPECT_INPUT_ERROR(
      plan_from_json(plan_with({{"preset", "torchtitan"}, {"reshard_after_forward", "some"}}),
                     "p.json"),
      "/stack/reshard_after_forward = \"some\"");
}

TEST(Stack, PlanNamesAPresetAndOverridesKnobs) {
  Plan p = plan_from_json(plan_with("torchtitan"), "p.json");
  ASSERT_TRUE(p.stack);
  EXPECT_EQ(*p.stack, builtin_stack("torchtitan"));
  Plan q = plan_from_json(
      plan_with(Json{{"preset", "megatron-core"}, {"tp_overlap", "none"}, {"dp_overlap", false}}),
      "p.json");
  EXPECT_EQ(q.stack->preset, "megatron-core");
  EXPECT_EQ(q.stack->tp_overlap, TpOverlap::kNone);
  EXPECT_FALSE(q.stack->dp_overlap);
  EXPECT_EQ(q.stack->attention, builtin_stack("megatron-core").attention);
  // Written plans carry the whole stack and read back the same.
  EXPECT_EQ(plan_from_json(to_json(q), "again").stack, q.stack);
}

TEST(Stack, StacksOfTheUsersOwnRoundTrip) {
  // A stack file of one's own: its name is kept as the preset, and a plan that carries it (as
  // `sextant plan --stack mine.json --out` writes it) reads back unchanged.
  Json file = stack_file_json(builtin_stack("torchtitan"));
  file["name"] = "mine";
  file["fusion"] = "compiled";
  Stack mine = stack_from_json(file, "mine.json");
  EXPECT_EQ(mine.preset, "mine");
  EXPECT_EQ(stack_label(mine), "mine");
  Plan p = plan_from_json(plan_with(to_json(mine)), "p.json");
  EXPECT_EQ(to_json(*p.stack), to_json(mine));  // knobs and name (sources stay in the file)
  EXPECT_EQ(p.stack->fusion, Fusion::kCompiled);
  EXPECT_EQ(plan_from_json(to_json(p), "again").stack->preset, "mine");
  // The shipped presets print as files that read back as themselves.
  for (const std::string& name : builtin_stack_names()) {
    Stack s = builtin_stack(name);
    EXPECT_EQ(stack_from_json(stack_file_json(s), "shown.json"), s) << name;
  }
  // Overridden knobs show in the report's label.
  Stack changed = builtin_stack("megatron-core");
  changed.tp_overlap = TpOverlap::kNone;
  EXPECT_EQ(stack_label(changed), "megatron-core (modified)");
  EXPECT_EQ(stack_label(builtin_stack("megatron-core")), "megatron-core");
}

TEST(Stack, DefaultDependsOnTheClusterKind) {
  Plan p = plan_from_json(plan_with("sextant"), "p.json");
  p.stack.reset();
  EXPECT_EQ(plan_stack(p, true).preset, "megatron-core");
  EXPECT_EQ(plan_stack(p, false).preset, "sextant");
}

TEST(Stack, BadStacksAreRefusedNamingTheField) {
  EXPECT_INPUT_ERROR(plan_from_json(plan_with("megatron"), "p.json"),
                     "p.json: /stack = \"megatron\": unknown stack preset (did you mean "
                     "megatron-lm?): must be one of");
  EXPECT_INPUT_ERROR(
      plan_from_json(plan_with(Json{{"preset", "torchtitan"}, {"attention", "flash9"}}), "p.json"),
      "/stack/attention = \"flash9\": must be one of unfused, flash2, flash3, cudnn or sdpa");
  EXPECT_INPUT_ERROR(
      plan_from_json(plan_with(Json{{"preset", "torchtitan"}, {"overlap", true}}), "p.json"),
      "/stack/overlap");
  // A misspelt preset with no knobs is not a stack of one's own.
  EXPECT_INPUT_ERROR(plan_from_json(plan_with(Json{{"preset", "torchtitn"}}), "p.json"),
                     "/stack/preset = \"torchtitn\": must be one of");
  // A preset file citing a source for something that is not a knob.
  Json bad = stack_file_json(builtin_stack("llm.c"));
  bad["sources"]["speed"] = "fast";
  EXPECT_INPUT_ERROR(stack_from_json(bad, "s.json"), "s.json: /sources/speed");
  // Without a preset every knob is needed.
  EXPECT_INPUT_ERROR(plan_from_json(plan_with(Json{{"attention", "flash2"}}), "p.json"),
                     "/stack/fusion");
  Json old = plan_with("sextant");
  old["overlap_dp_comm"] = false;
  EXPECT_INPUT_ERROR(plan_from_json(old, "p.json"),
                     "/overlap_dp_comm = false: moved to /stack/dp_overlap");
}

TEST(Stack, ModelCodeKnobsSayHowTheBlockIsWritten) {
  // TorchTitan's Llama (wq/wk/wv, complex rotation, repeat_kv, nn.Embedding); Megatron-Core's
  // fused linear_qkv and TE attention over the shared heads; llm.c's own embedding kernel.
  const ModelCode titan = builtin_stack("torchtitan").code;
  EXPECT_EQ(titan.projections, Projections::kSeparate);
  EXPECT_EQ(titan.rope, RopeKernel::kComplex);
  EXPECT_EQ(titan.gqa_kv, GqaKv::kRepeat);
  EXPECT_EQ(titan.embedding_backward, EmbeddingBackward::kSorted);
  const ModelCode core = builtin_stack("megatron-core").code;
  EXPECT_EQ(core.projections, Projections::kFused);
  EXPECT_EQ(core.gqa_kv, GqaKv::kNative);
  EXPECT_EQ(core.embedding_backward, EmbeddingBackward::kSorted);
  EXPECT_EQ(builtin_stack("llm.c").code.embedding_backward, EmbeddingBackward::kScatter);
  EXPECT_EQ(builtin_stack("sextant").code, ModelCode{});
  EXPECT_NE(titan.key(), core.key());
  // A plan overrides one; a stack file written before the knobs gets Megatron's code.
  Plan p =
      plan_from_json(plan_with(Json{{"preset", "torchtitan"}, {"rope", "rotate_half"}}), "p.json");
  EXPECT_EQ(p.stack->code.rope, RopeKernel::kRotateHalf);
  EXPECT_EQ(p.stack->code.projections, Projections::kSeparate);
  EXPECT_EQ(plan_from_json(to_json(p), "again").stack->code, p.stack->code);
  Json old = stack_file_json(builtin_stack("torchtitan"));
  old.erase("projections");
  EXPECT_EQ(stack_from_json(old, "old.json").code.projections, Projections::kFused);
  EXPECT_INPUT_ERROR(
      plan_from_json(plan_with(Json{{"preset", "torchtitan"}, {"gqa_kv", "copy"}}), "p.json"),
      "p.json: /stack/gqa_kv = \"copy\"");
}

TEST(Stack, HostLaunchCostsAreAKnobOfTwoPasses) {
  // The eager presets carry eager PyTorch's host cost per kernel, a C++ loop its launch call.
  EXPECT_EQ(builtin_stack("torchtitan").host_launch_us, (HostLaunch{77.2, 42.1}));
  EXPECT_EQ(builtin_stack("llm.c").host_launch_us, (HostLaunch{6.0, 6.0}));
  // A plan may override one pass; the other stays the preset's.
  Plan p = plan_from_json(
      plan_with(Json{{"preset", "torchtitan"}, {"host_launch_us", {{"forward", 80}}}}), "p.json");
  EXPECT_EQ(p.stack->host_launch_us, (HostLaunch{80, 42.1}));
  EXPECT_EQ(plan_from_json(to_json(p), "again").stack->host_launch_us, p.stack->host_launch_us);
  EXPECT_INPUT_ERROR(plan_from_json(plan_with(Json{{"preset", "torchtitan"},
                                                   {"host_launch_us", {{"forward", -1}}}}),
                                    "p.json"),
                     "p.json: /stack/host_launch_us/forward = -1");
  EXPECT_INPUT_ERROR(
      plan_from_json(plan_with(Json{{"preset", "torchtitan"}, {"host_launch_us", {{"fwd", 1}}}}),
                     "p.json"),
      "/stack/host_launch_us/fwd");
  // A stack file of one's own that names the knob names both passes; older files name none.
  Json file = stack_file_json(builtin_stack("torchtitan"));
  file["name"] = "mine";
  file["host_launch_us"] = {{"forward", 10}};
  EXPECT_INPUT_ERROR(stack_from_json(file, "mine.json"), "mine.json: /host_launch_us/backward");
  file.erase("host_launch_us");
  file["sources"].erase("host_launch_us");
  EXPECT_EQ(stack_from_json(file, "mine.json").host_launch_us, HostLaunch{});
}

TEST(Stack, CrossEntropyIsAKnobThatOlderFilesTakeFromTheFusionLevel) {
  EXPECT_EQ(builtin_stack("megatron-lm").cross_entropy, CrossEntropy::kMegatron);
  EXPECT_EQ(builtin_stack("llm.c").cross_entropy, CrossEntropy::kCompiled);
  // Every preset file names it (a preset must not fall back on the fusion level).
  for (const std::string& name : builtin_stack_names()) {
    Json file = stack_file_json(builtin_stack(name));
    EXPECT_TRUE(file.contains("cross_entropy")) << name;
  }
  // A stack file written before the knob existed: the cross-entropy its fusion level implied.
  Json old = stack_file_json(builtin_stack("torchtitan"));
  old.erase("cross_entropy");
  old["fusion"] = "compiled";
  EXPECT_EQ(stack_from_json(old, "old.json").cross_entropy, CrossEntropy::kCompiled);
  // Overriding the fusion of a preset keeps the preset's cross-entropy.
  Plan p =
      plan_from_json(plan_with(Json{{"preset", "megatron-lm"}, {"fusion", "eager"}}), "p.json");
  EXPECT_EQ(p.stack->cross_entropy, CrossEntropy::kMegatron);
  EXPECT_INPUT_ERROR(
      plan_from_json(plan_with(Json{{"preset", "torchtitan"}, {"cross_entropy", "apex"}}),
                     "p.json"),
      "/stack/cross_entropy = \"apex\": must be one of eager, megatron, fused or compiled");
}

}  // namespace
}  // namespace sextant::spec
