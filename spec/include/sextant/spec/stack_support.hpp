// What a training stack's software can run: the plan features each shipped preset supports
// (stacks/*.json "supports", every entry citing the stack's own code or flags; the research
// record is stacks/SOURCES.md). The planner's search asks it so that `plan --stack X` proposes
// only what X runs, and `simulate` / `run` refuse a plan its stack cannot run, naming the feature
// and the stacks that can. A stack that is not a shipped preset (a file of the user's own) is
// not restricted: Sextant does not know what that software runs.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "sextant/spec/dtype.hpp"
#include "sextant/spec/json_reader.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/stack.hpp"

namespace sextant::spec {

// Training state a stack can keep in host memory or on NVMe (Plan::Offload).
enum class OffloadKind {
  kOptimizer,           // the optimizer state alone (ZeRO-Offload, Megatron's optimizer offload)
  kOptimizerAndParams,  // the optimizer state and the parameter shard together (FSDP's
                        // CPUOffloadPolicy, ZeRO-Infinity's offload_param)
  kActivations,         // the activations kept for backward (Megatron's --cpu-offloading)
};
EnumNames<OffloadKind> offload_kind_names();

struct StackSupport {
  std::vector<ModelKind> models;  // the model families it trains
  std::vector<int> zero;          // ZeRO stages: 0 (DDP), 1, 2, 3
  // DDP (ZeRO 0 over more than one replica) beside tensor, pipeline, context or expert
  // parallelism; false: replicas beside model parallelism must be sharded (TorchTitan).
  bool ddp_with_model_parallel = true;
  bool tensor_parallel = false;  // Megatron-LM's 1D tensor parallelism
  bool sequence_parallel = false;
  bool tensor_grid = false;  // AxoNN's 3D tensor grids
  std::vector<ContextAlgorithm> context_parallel;
  bool expert_parallel = false;
  bool spatial = false;              // a CNN's samples over a grid of ranks
  std::vector<Schedule> schedules;   // pipeline schedules; empty: no pipeline parallelism
  std::vector<Recompute> recompute;  // "none" among them where it can keep every activation
  bool recompute_layers = false;     // full recompute of the first N layers of each chunk
  // Some layers' activations offloaded whole and the next ones recomputed (KARMA's split:
  // unit_recompute with activation_layers and recompute_layers both set).
  bool swap_and_recompute = false;
  // Data-parallel training through parameter servers (spec/parameter_server.hpp).
  bool parameter_server = false;
  // SUPER's split of Inception modules' branches over the tp ranks (spec/branch_parallel.hpp).
  bool branch_parallel = false;
  std::vector<OffloadKind> offload;
  std::vector<OffloadTarget> offload_devices;  // host, nvme (not "none")
  std::vector<Dtype> precisions;               // compute dtypes
  std::vector<CompressionKind> compression;    // gradient compressions (not "none")
  std::map<std::string, std::string> sources;  // per feature: the stack's code or flag

  bool operator==(const StackSupport&) const = default;
};

// The feature keys of a "supports" object, in file order; a shipped preset states and sources
// every one.
std::vector<std::string_view> stack_support_keys();

// A "supports" object (every key required).
StackSupport stack_support_from_json(const Json& json, const std::string& source,
                                     const std::string& pointer);
Json to_json(const StackSupport& support);

// What the shipped preset `stack` names can run; nullptr for a stack that is no shipped preset.
// A preset with knobs overridden runs what the preset runs.
const StackSupport* stack_support(const Stack& stack);
const StackSupport* stack_support(std::string_view preset);

// One plan feature a stack may or may not run: its label for messages and the test.
struct PlanFeature {
  std::string label;  // e.g. "ZeRO-1 (optimizer state sharded, gradients whole)"
  bool (*runs)(const StackSupport&, const Plan&, const ModelSpec&, Dtype);
};
// The features `plan` uses on `model` with `compute` as its compute dtype.
std::vector<PlanFeature> plan_features(const Plan& plan, const ModelSpec& model, Dtype compute);

// What of `plan` the stack cannot run, one line per feature: "the stack torchtitan does not run
// ZeRO-1 (...); stacks that do: megatron-core, ..."; empty when it runs all of it or is not a
// shipped preset. The one rule the planner's request check, simulate and run ask.
std::vector<std::string> stack_support_problems(const Plan& plan, const ModelSpec& model,
                                                const Stack& stack, Dtype compute);
// Throws InputError naming `source` with every problem above (nothing when there is none).
void check_stack_runs(const Plan& plan, const ModelSpec& model, const Stack& stack, Dtype compute,
                      const std::string& source);

}  // namespace sextant::spec
