// Plan flags to a Plan, through the same decoder as plan files.
#include "plan_options.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <regex>

#include "validators.hpp"

namespace sextant::cli {

void add_plan_flags(CLI::App& cmd, PlanFlags& f) {
  cmd.add_option("--plan", f.plan_file,
                 "Plan JSON (sextant.plan/1), e.g. written by `sextant plan`");
  cmd.add_option("--dp", f.dp, "Data-parallel degree")->check(positive());
  cmd.add_option("--tp", f.tp, "Tensor-parallel degree")->check(positive());
  cmd.add_option("--pp", f.pp, "Pipeline-parallel degree")->check(positive());
  cmd.add_option("--zero", f.zero, "ZeRO stage 0-3 (3 = FSDP)")->check(CLI::Range(0, 3));
  cmd.add_flag("--sp", f.sp, "Sequence parallelism (with tp > 1)");
  cmd.add_flag("--branch-parallel", f.branch_parallel,
               "SUPER: the tp ranks split Inception modules' branches (a CNN)");
  cmd.add_option("--micro-batch", f.micro_batch, "Sequences per micro-batch")->check(positive());
  cmd.add_option("--global-batch", f.global_batch, "Sequences per optimizer step")
      ->check(positive());
  cmd.add_option("--schedule", f.schedule,
                 "Pipeline schedule: gpipe, 1f1b, interleaved, pipedream-2bw or pipedream "
                 "(asynchronous, weight stashing)");
  cmd.add_option("--vpp", f.vpp, "Virtual stages per pipeline rank (interleaved)")
      ->check(positive());
  cmd.add_option("--recompute", f.recompute, "Activation recompute: none, selective or full");
  cmd.add_option("--recompute-layers", f.recompute_layers,
                 "With --recompute full: recompute only the first N layers of each stage chunk "
                 "(Megatron-LM --recompute-method block --recompute-num-layers N); beside "
                 "--offload-activation-layers A, the N after the A offloaded (KARMA)")
      ->check(positive());
  cmd.add_option("--dtype", f.dtype,
                 "Compute dtype (default: the stack's precision, else bf16 on GPUs (fp16 without "
                 "bf16) and fp32 on CPUs)");
  cmd.add_option("--seq-len", f.seq_len, "Override the model's sequence length")->check(positive());
  cmd.add_option(
      "--compression", f.compression,
      "Compressed DDP gradient exchange, kind[:knob=value,...]: qsgd[:bits=4,bucket=512], "
      "topk[:ratio=0.01], onebit[:bucket=512], powersgd[:rank=1], "
      "sparcml[:ratio=0.01,algorithm=recursive_doubling|split_allgather]; "
      "error_feedback=false turns error feedback off");
  cmd.add_option("--parameter-server", f.parameter_server,
                 "Exchange gradients through parameter servers on the data-parallel ranks, "
                 "workers running S steps ahead of the updates they read (0: synchronous; "
                 "Li et al. OSDI'14 bounded delay)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--spatial", f.spatial,
                 "Split each sample of a CNN over an HxW grid of ranks (spatial parallelism, "
                 "Dryden et al. IPDPS'19), e.g. 2x2; H alone splits the rows; DxHxW splits a "
                 "volume's planes too");
  cmd.add_option("--cp", f.cp,
                 "Context parallelism: split each sequence of a transformer over N ranks")
      ->check(positive());
  cmd.add_option("--ep", f.ep,
                 "Expert parallelism: split a mixture of experts' routed experts over N of the "
                 "data-parallel ranks (N divides dp and the experts)")
      ->check(positive());
  cmd.add_option("--tp-grid", f.tp_grid,
                 "3D tensor parallelism (AxoNN): the tp ranks as an XxYxZ grid, e.g. 2x2x2; "
                 "--tp defaults to X*Y*Z");
  cmd.add_option("--offload-optimizer", f.offload_optimizer,
                 "ZeRO-Offload: the optimizer's shard (fp32 master weights, moments, gradients) "
                 "and its step on the host: host, nvme or none (needs --zero >= 1)");
  cmd.add_option("--offload-params", f.offload_params,
                 "ZeRO-Infinity: the parameter shard on the host: host, nvme or none (needs "
                 "--zero 3)");
  cmd.add_option("--offload-activations", f.offload_activations,
                 "What the transformer blocks keep for backward, copied to host memory after "
                 "their forward and back before their backward (Megatron-LM --cpu-offloading): "
                 "host or none");
  cmd.add_option("--offload-activation-layers", f.offload_activation_layers,
                 "With --offload-activations host: only the first N layers of each stage chunk "
                 "(Megatron-LM --cpu-offloading-num-layers N)")
      ->check(positive());
  cmd.add_option("--offload-prefetch-layers", f.offload_prefetch_layers,
                 "With --offload-activations host: issue the reloads of the N layers below the "
                 "one running backward (default 1, Transformer Engine's double buffer; more: "
                 "KARMA's swap schedule)")
      ->check(positive());
  cmd.add_option("--cp-algorithm", f.cp_algorithm,
                 "How context-parallel ranks attend to the whole sequence: ring (default; ring "
                 "attention, needs a fused attention kernel), all-gather (Llama 3) or all-to-all "
                 "(DeepSpeed-Ulysses)");
  cmd.add_option("--collective-algorithm", f.collective_algorithms,
                 "KIND=ALGORITHM (repeatable): run and price that collective by that algorithm, "
                 "e.g. all_reduce=ring (docs/FORMATS.md: collective_algorithms)");
  add_stack_flags(cmd, f.stack);
}

namespace {

// "HxW", "H" or a volume's "DxHxW" as a spatial split; throws InputError naming --spatial.
spec::SpatialSplit spatial_from_text(const std::string& text) {
  static const std::regex pattern(
      R"(^\s*(\d{1,8})\s*(?:[xX]\s*(\d{1,8}))?\s*(?:[xX]\s*(\d{1,8}))?\s*$)");
  std::smatch m;
  if (!std::regex_match(text, m, pattern))
    throw InputError("command line", "--spatial", text,
                     "expected HxW (e.g. 2x2), H to split the rows only, or DxHxW (a volume's "
                     "planes, rows and columns)");
  spec::SpatialSplit s;
  if (m[3].matched) {
    s.d = std::stoll(m[1]);
    s.h = std::stoll(m[2]);
    s.w = std::stoll(m[3]);
  } else {
    s.h = std::stoll(m[1]);
    s.w = m[2].matched ? std::stoll(m[2]) : 1;
  }
  if (s.d < 1 || s.h < 1 || s.w < 1)
    throw InputError("command line", "--spatial", text,
                     "every degree must be at least 1 (1 leaves that dimension whole)");
  return s;
}

// "XxYxZ" as a plan's "tp_grid" array; throws InputError naming --tp-grid.
spec::Json grid_from_text(const std::string& text) {
  static const std::regex pattern(R"(^\s*(\d{1,8})\s*[xX]\s*(\d{1,8})\s*[xX]\s*(\d{1,8})\s*$)");
  std::smatch m;
  if (!std::regex_match(text, m, pattern))
    throw InputError("command line", "--tp-grid", text,
                     "expected XxYxZ (e.g. 2x2x2): the grid's three axes");
  return spec::Json::array({std::stoll(m[1]), std::stoll(m[2]), std::stoll(m[3])});
}

}  // namespace

namespace {

// dp from --gpus when --dp is not given: the ranks over what the other flags split.
int64_t data_parallel_degree(const PlanFlags& f, std::optional<int64_t> gpus) {
  if (f.dp > 0) return f.dp;
  if (!gpus) return 1;
  int64_t others = f.pp * f.cp;
  if (!f.tp_grid.empty() && f.tp == 1) {
    const spec::Json grid = grid_from_text(f.tp_grid);
    others *= grid[0].get<int64_t>() * grid[1].get<int64_t>() * grid[2].get<int64_t>();
  } else {
    others *= f.tp;
  }
  if (!f.spatial.empty()) {
    const spec::SpatialSplit s = spatial_from_text(f.spatial);
    others *= s.d * s.h * s.w;
  }
  return others > 0 && *gpus % others == 0 ? *gpus / others : 1;
}

}  // namespace

spec::Plan plan_from_flags(const PlanFlags& f, std::optional<int64_t> gpus, bool gpu_cluster,
                           spec::ModelKind model) {
  spec::Plan plan;
  if (!f.plan_file.empty()) {
    plan = spec::read_plan_file(f.plan_file);
  } else {
    if (f.global_batch == 0) {
      throw InputError("command line", "--global-batch", "",
                       "missing: give --plan FILE or --global-batch with the plan flags");
    }
    spec::Json j = {{"schema", spec::kPlanSchema},
                    {"dp", data_parallel_degree(f, gpus)},
                    {"tp", f.tp},
                    {"pp", f.pp},
                    {"zero", f.zero},
                    {"sequence_parallel", f.sp},
                    {"micro_batch", f.micro_batch},
                    {"global_batch", f.global_batch},
                    {"schedule", f.schedule},
                    {"virtual_stages", f.vpp},
                    {"recompute", f.recompute}};
    if (f.recompute_layers > 0) j["recompute_layers"] = f.recompute_layers;
    if (f.branch_parallel) j["branch_parallel"] = true;
    if (!f.dtype.empty()) j["dtype"] = f.dtype;
    if (f.seq_len > 0) j["seq_len"] = f.seq_len;
    if (f.cp > 1) j["cp"] = f.cp;
    if (!f.cp_algorithm.empty()) j["cp_algorithm"] = f.cp_algorithm;
    if (f.ep > 1) j["ep"] = f.ep;
    if (!f.tp_grid.empty()) {
      j["tp_grid"] = grid_from_text(f.tp_grid);
      if (f.tp == 1)
        j["tp"] = j["tp_grid"][0].get<int64_t>() * j["tp_grid"][1].get<int64_t>() *
                  j["tp_grid"][2].get<int64_t>();
    }
    plan = spec::plan_from_json(j, "command line");
  }
  if (!f.plan_file.empty() && f.seq_len > 0) plan.seq_len = f.seq_len;
  if (!f.plan_file.empty() && !f.tp_grid.empty()) {
    // The flag overrides the file's grid; tp stays the file's.
    spec::Json j = spec::to_json(plan);
    j["tp_grid"] = grid_from_text(f.tp_grid);
    plan = spec::plan_from_json(j, "command line");
  }
  if (!f.plan_file.empty() && (f.cp > 1 || !f.cp_algorithm.empty() || f.ep > 1)) {
    // The flags override the file's split; the plan's own rules again.
    spec::Json j = spec::to_json(plan);
    if (f.cp > 1) j["cp"] = f.cp;
    if (!f.cp_algorithm.empty()) j["cp_algorithm"] = f.cp_algorithm;
    if (f.ep > 1) j["ep"] = f.ep;
    plan = spec::plan_from_json(j, "command line");
  }
  if (!f.collective_algorithms.empty()) {
    // Decoded and checked as a plan file's "collective_algorithms" object.
    spec::Json j = spec::to_json(plan);
    if (!j.contains("collective_algorithms")) j["collective_algorithms"] = spec::Json::object();
    for (const std::string& text : f.collective_algorithms) {
      const size_t eq = text.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
        throw InputError("command line", "--collective-algorithm", text,
                         "KIND=ALGORITHM, e.g. all_reduce=ring");
      j["collective_algorithms"][text.substr(0, eq)] = text.substr(eq + 1);
    }
    plan = spec::plan_from_json(j, "command line");
  }
  if (!f.spatial.empty()) {
    plan.spatial = spatial_from_text(f.spatial);
    // The plan's own rules again, now with its split (degrees >= 1, DDP only).
    plan = spec::plan_from_json(spec::to_json(plan), "command line");
  }
  if (!f.offload_optimizer.empty() || !f.offload_params.empty() || !f.offload_activations.empty() ||
      f.offload_activation_layers > 0 || f.offload_prefetch_layers > 0) {
    // Decoded and checked as a plan file's "offload" object (the flag's value named in errors).
    spec::Json j = spec::to_json(plan);
    spec::Json offload = j.contains("offload") ? j["offload"] : spec::Json::object();
    if (!f.offload_optimizer.empty()) offload["optimizer"] = f.offload_optimizer;
    if (!f.offload_params.empty()) offload["params"] = f.offload_params;
    if (!f.offload_activations.empty()) offload["activations"] = f.offload_activations;
    if (f.offload_activation_layers > 0) offload["activation_layers"] = f.offload_activation_layers;
    if (f.offload_prefetch_layers > 0) offload["prefetch_layers"] = f.offload_prefetch_layers;
    j["offload"] = offload;
    plan = spec::plan_from_json(j, "command line");
  }
  if (!f.compression.empty()) {
    plan.compression = spec::compression_from_text(f.compression, "--compression");
    // The plan's own rules again, now with its compression (DDP only, dp > 1).
    plan = spec::plan_from_json(spec::to_json(plan), "command line");
  }
  if (f.parameter_server >= 0) {
    // Decoded and checked as a plan file's "parameter_server" object.
    spec::Json j = spec::to_json(plan);
    j["parameter_server"] = {{"staleness", f.parameter_server}};
    plan = spec::plan_from_json(j, "command line");
  }
  apply_stack_flags(f.stack, plan, gpu_cluster, model);
  if (gpus && *gpus != plan.world_size()) {
    throw InputError(
        "command line", "--gpus", std::to_string(*gpus),
        fmt::format("must equal the ranks of the plan ({}: {})", plan.name(), plan.world_size()));
  }
  return plan;
}

spec::Plan validated_plan(const PlanFlags& flags, int64_t gpus, const spec::ModelSpec& model,
                          const spec::ClusterSpec& cluster) {
  const spec::Plan plan =
      plan_from_flags(flags, gpus > 0 ? std::optional<int64_t>(gpus) : std::nullopt,
                      cluster.device.kind == spec::DeviceKind::kGpu, model.kind());
  spec::validate_plan(plan, model, plan.world_size(),
                      flags.plan_file.empty() ? "command line" : flags.plan_file);
  return plan;
}

std::string model_for_jobs(const std::string& model) {
  std::error_code ec;
  return std::filesystem::is_regular_file(model, ec) ? std::filesystem::absolute(model).string()
                                                     : model;
}

}  // namespace sextant::cli
