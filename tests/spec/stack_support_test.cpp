// What each shipped stack runs: every feature stated and sourced, the facts of stacks/SOURCES.md,
// the plan check's messages, and the errors for a bad "supports" object.
#include "sextant/spec/stack_support.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "expect_input_error.hpp"
#include "sextant/models/zoo.hpp"

namespace sextant::spec {
namespace {

template <typename T>
bool has(const std::vector<T>& values, T value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

TEST(StackSupport, EveryPresetStatesAndSourcesEveryFeature) {
  for (const std::string& name : builtin_stack_names()) {
    const StackSupport* s = stack_support(name);
    ASSERT_NE(s, nullptr) << name << " says nothing of what it runs";
    for (std::string_view key : stack_support_keys()) {
      auto it = s->sources.find(std::string(key));
      ASSERT_NE(it, s->sources.end()) << name << " has no source for supports." << key;
      EXPECT_GE(it->second.size(), 4u) << name << "/" << key;
    }
    EXPECT_FALSE(s->precisions.empty()) << name;
    // The JSON form reads back the same.
    EXPECT_EQ(stack_support_from_json(to_json(*s), "s.json", "/supports"), *s) << name;
  }
}

TEST(StackSupport, TheRecordedFactsOfEachStack) {
  // stacks/SOURCES.md, each read from the stack's own code at the commit it names.
  const StackSupport& titan = *stack_support("torchtitan");
  EXPECT_FALSE(has(titan.zero, 1));  // no optimizer-only sharding
  EXPECT_EQ(titan.offload, std::vector<OffloadKind>{OffloadKind::kOptimizerAndParams});
  EXPECT_FALSE(titan.ddp_with_model_parallel);  // "DDP has not supported > 1D parallelism"
  EXPECT_TRUE(has(titan.schedules, Schedule::kGpipe));
  EXPECT_FALSE(has(titan.precisions, Dtype::kFp16));
  EXPECT_EQ(*stack_support("torchtitan-compiled"), titan);
  const StackSupport& core = *stack_support("megatron-core");
  EXPECT_FALSE(has(core.schedules, Schedule::kGpipe));  // schedules.py: no GPipe
  EXPECT_TRUE(has(core.offload, OffloadKind::kOptimizer));
  EXPECT_FALSE(has(core.offload, OffloadKind::kOptimizerAndParams));
  EXPECT_FALSE(has(core.models, ModelKind::kCnn));
  const StackSupport& ds = *stack_support("deepspeed");
  EXPECT_EQ(ds.schedules, std::vector<Schedule>{Schedule::k1F1B});  // TrainSchedule only
  EXPECT_EQ(ds.context_parallel, std::vector<ContextAlgorithm>{ContextAlgorithm::kAllToAll});
  EXPECT_TRUE(has(ds.offload_devices, OffloadTarget::kNvme));
  EXPECT_EQ(stack_support("llm.c")->zero, (std::vector<int>{0, 1}));
  EXPECT_TRUE(stack_support("mosaic-mpt")->offload.empty());  // "FSDP CPU Offload not supported"
  EXPECT_TRUE(has(stack_support("pytorch-ddp")->models, ModelKind::kCnn));
  EXPECT_EQ(stack_support("not-a-preset"), nullptr);
}

TEST(StackSupport, CnnsDefaultToAStackThatTrainsThem) {
  EXPECT_EQ(default_stack_name(true, ModelKind::kCnn), "pytorch-ddp");
  EXPECT_EQ(default_stack_name(true, ModelKind::kMlp), "pytorch-ddp");
  EXPECT_EQ(default_stack_name(true), "megatron-core");
  EXPECT_EQ(default_stack_name(false, ModelKind::kCnn), "sextant");
  Plan p;
  EXPECT_EQ(plan_stack(p, true, ModelKind::kCnn).preset, "pytorch-ddp");
}

TEST(StackSupport, AProblemNamesTheFeatureAndTheStacksThatRunIt) {
  const ModelSpec gpt = models::zoo_model("gpt2-124m");
  Plan p;
  p.dp = 8;
  p.zero = 1;
  // ZeRO-1 is in the stage lists of deepspeed, deepspeed-0.5, llm.c, megatron-core, megatron-lm,
  // pytorch-ddp (ZeroRedundancyOptimizer) and sextant; not in mosaic-mpt's, pytorch-fsdp's or
  // TorchTitan's.
  EXPECT_EQ(
      stack_support_problems(p, gpt, builtin_stack("torchtitan"), Dtype::kBf16),
      std::vector<std::string>{
          "the stack torchtitan does not run ZeRO-1 (optimizer state sharded, gradients "
          "whole); stacks that do: deepspeed, deepspeed-0.5, llm.c, megatron-core, megatron-lm, "
          "pytorch-ddp, sextant (--stack NAME)"});
  EXPECT_TRUE(stack_support_problems(p, gpt, builtin_stack("megatron-core"), Dtype::kBf16).empty());
  // A preset with a knob overridden runs what the preset runs.
  Stack modified = builtin_stack("torchtitan");
  modified.dp_overlap = false;
  EXPECT_EQ(stack_support_problems(p, gpt, modified, Dtype::kBf16).size(), 1u);
  // A stack of the user's own is not limited: Sextant does not know that software.
  modified.preset = "";
  EXPECT_TRUE(stack_support_problems(p, gpt, modified, Dtype::kBf16).empty());
  // Several at once, in plan order: ZeRO-1, the optimizer offloaded alone, fp16 (GPipe it runs).
  Plan q;
  q.dp = 2;
  q.pp = 2;
  q.zero = 1;
  q.schedule = Schedule::kGpipe;
  q.offload.optimizer = OffloadTarget::kHost;
  const std::vector<std::string> problems =
      stack_support_problems(q, gpt, builtin_stack("torchtitan"), Dtype::kFp16);
  ASSERT_EQ(problems.size(), 3u);
  EXPECT_NE(problems[0].find("ZeRO-1"), std::string::npos);
  EXPECT_NE(problems[1].find("offloading the optimizer state alone; stacks that do: deepspeed, "
                             "deepspeed-0.5, megatron-core, sextant"),
            std::string::npos);
  EXPECT_NE(problems[2].find("fp16 compute"), std::string::npos);
  // One stage on one replica is no data parallelism: nothing to refuse.
  Plan single;
  single.zero = 1;
  EXPECT_TRUE(
      stack_support_problems(single, gpt, builtin_stack("torchtitan"), Dtype::kBf16).empty());
  // KARMA's reload window: Transformer Engine's handler double-buffers, one layer ahead.
  Plan window;
  window.offload.activations = OffloadTarget::kHost;
  window.offload.prefetch_layers = 4;
  EXPECT_EQ(stack_support_problems(window, gpt, builtin_stack("megatron-core"), Dtype::kBf16),
            std::vector<std::string>{
                "the stack megatron-core does not run reloading offloaded activations more than "
                "one layer ahead (KARMA); stacks that do: sextant (--stack NAME)"});
  EXPECT_TRUE(stack_support_problems(window, gpt, builtin_stack("sextant"), Dtype::kBf16).empty());
  // A CNN under Megatron.
  EXPECT_INPUT_ERROR(check_stack_runs(Plan{}, models::zoo_model("resnet50"),
                                      builtin_stack("megatron-core"), Dtype::kBf16, "plan.json"),
                     "plan.json: /stack = megatron-core: the stack megatron-core does not run "
                     "CNNs; stacks that do: deepspeed, pytorch-ddp, pytorch-fsdp, sextant");
}

TEST(StackSupport, ABadSupportsObjectIsNamed) {
  Json stack = stack_file_json(builtin_stack("megatron-core"));
  Json bad = stack;
  bad["supports"]["schedules"] = {"1f1b", "zero-bubble"};
  EXPECT_INPUT_ERROR(
      stack_from_json(bad, "s.json"),
      "s.json: /supports/schedules = \"zero-bubble\": each entry once, one of gpipe, "
      "1f1b, interleaved, pipedream-2bw, pipedream or gems");
  bad = stack;
  bad["supports"]["offload_devices"] = {"none"};
  EXPECT_INPUT_ERROR(stack_from_json(bad, "s.json"),
                     "/supports/offload_devices = \"none\": each entry once, one of host or nvme");
  bad = stack;
  bad["supports"].erase("zero");
  EXPECT_INPUT_ERROR(stack_from_json(bad, "s.json"), "/supports/zero");
  bad = stack;
  bad["supports"]["zero"] = {0, 4};
  EXPECT_INPUT_ERROR(stack_from_json(bad, "s.json"), "/supports/zero");
  bad = stack;
  bad["supports"]["pipelines"] = true;
  EXPECT_INPUT_ERROR(stack_from_json(bad, "s.json"), "/supports/pipelines");
  bad = stack;
  bad["supports"]["sources"]["zer0"] = "typo";
  EXPECT_INPUT_ERROR(stack_from_json(bad, "s.json"), "/supports/sources/zer0");
}

}  // namespace
}  // namespace sextant::spec
