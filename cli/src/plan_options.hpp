// Command-line plan flags shared by `simulate`, `run` and `plan`: either --plan FILE or the
// degrees and options of a plan on the command line.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"
#include "stack_options.hpp"

namespace sextant::cli {

struct PlanFlags {
  std::string plan_file;
  int64_t dp = 0;  // 0: not given (inferred from --gpus where that is the only free factor)
  int64_t tp = 1;
  int64_t pp = 1;
  int zero = 0;
  bool sp = false;
  bool branch_parallel = false;
  int64_t micro_batch = 1;
  int64_t global_batch = 0;
  std::string schedule = "1f1b";
  int64_t vpp = 1;
  std::string recompute = "none";
  int64_t recompute_layers = 0;  // 0: every layer
  std::string dtype;
  int64_t seq_len = 0;
  std::string compression;          // kind[:knob=value,...] (spec::compression_from_text)
  int64_t cp = 1;                   // ranks splitting each sequence (context parallelism)
  std::string cp_algorithm;         // ring, all-gather or all-to-all
  int64_t ep = 1;                   // ranks splitting a mixture of experts' routed experts
  std::string tp_grid;              // "XxYxZ": the tp ranks as AxoNN's 3D tensor grid
  std::string spatial;              // HxW, or H (rows only): a CNN's samples over a grid of ranks
  std::string offload_optimizer;    // host or nvme (ZeRO-Offload), or none
  std::string offload_params;       // host or nvme (ZeRO-Infinity, zero 3), or none
  std::string offload_activations;  // host, or none
  int64_t offload_activation_layers = 0;
  int64_t offload_prefetch_layers = 0;  // 0: the plan's (1)
  int64_t parameter_server = -1;        // staleness through parameter servers; -1: the all-reduce
  std::vector<std::string> collective_algorithms;  // "kind=algorithm" each
  StackFlags stack;
};

// Registers --plan, the plan flags and the stack flags on `cmd`.
void add_plan_flags(CLI::App& cmd, PlanFlags& flags);
// The plan from --plan, else from the flags (decoded and validated like a plan file, so errors
// name the flag), with the stack flags applied. `gpus` when given must equal the plan's ranks
// (dp*tp*pp*cp*spatial); without --dp, dp is what makes them equal when it divides out (else 1).
// Throws InputError.
spec::Plan plan_from_flags(const PlanFlags& flags, std::optional<int64_t> gpus, bool gpu_cluster,
                           spec::ModelKind model = spec::ModelKind::kTransformer);
// --model as a job started elsewhere (another directory, another node) reads it: a model file by
// its absolute path, a zoo name as it is.
std::string model_for_jobs(const std::string& model);

// The plan of the flags (`gpus` 0: not given) for `model` on `cluster`, validated as `simulate`
// validates it (errors name the plan file, or the command line).
spec::Plan validated_plan(const PlanFlags& flags, int64_t gpus, const spec::ModelSpec& model,
                          const spec::ClusterSpec& cluster);

}  // namespace sextant::cli
