// The planner's search flags and plan files (search_flags.hpp).
#include "search_flags.hpp"

#include <fmt/format.h>

#include <ctime>
#include <memory>

#include "progress_line.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/build_info.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/parameter_server.hpp"
#include "validators.hpp"

namespace sextant::cli {

namespace {

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace

void add_search_flags(CLI::App& cmd, SearchFlags& f) {
  cmd.add_option("--model", f.model, "Zoo name, model file or Hugging Face config.json")
      ->required();
  cmd.add_option("--cluster", f.cluster, "Cluster name or file")->required();
  cmd.add_option("--global-batch", f.global_batch, "Sequences (samples) per optimizer step")
      ->required()
      ->check(positive());
  cmd.add_option("--seq-len", f.seq_len, "Override the model's sequence length")->check(positive());
  cmd.add_option("--constraint", f.constraints, "Bound a dimension, e.g. tp<=8, pp=1, zero>=1");
  cmd.add_option(
      "--compression", f.compressions,
      "Let DDP layouts exchange gradients compressed (repeatable), kind[:knob=value,...]: "
      "qsgd[:bits=4], topk[:ratio=0.01], onebit, powersgd[:rank=1], "
      "sparcml[:ratio=0.01] (both its algorithms unless one is named); "
      "ranked on time only: what it costs in accuracy is the user's to check");
  cmd.add_flag("--async-pipeline", f.asynchronous_pipelines,
               "Also try the asynchronous pipelines, PipeDream-2BW and PipeDream (no flush; "
               "stale gradients, which change what the model learns: the user's to check)");
  cmd.add_option("--parameter-server", f.parameter_server_staleness,
                 "Also let DDP layouts exchange through parameter servers with each staleness "
                 "bound given (0: synchronous; at most 3 values; stale ones change what the model "
                 "learns: the user's to check)")
      ->check(CLI::Range(int64_t{0}, spec::kMaxStaleness));
  cmd.add_flag("--gems", f.gems,
               "Also try GEMS' MAST on even pp: a second replica of the stages running the other "
               "way on the same ranks (twice the weights a rank; each candidate simulated)");
  cmd.add_option("--network", f.network, "Fidelity of the leaders' simulation: analytic or flow");
  cmd.add_option("--objective", f.objective,
                 "Rank by time, cost (GPU-seconds per step) or memory (most headroom, then time)");
  cmd.add_option("--dtype", f.dtype,
                 "Compute dtype (default: bf16 on GPUs, fp16 on GPUs without bf16, fp32 on CPUs)");
  cmd.add_option("--leaders", f.leaders,
                 "Plans simulated event by event after the closed-form ranking (0: all that fit)");
  cmd.add_option("--variants-per-layout", f.variants_per_layout,
                 "Of the leaders, at most N variants of one layout (stack knobs, recomputed "
                 "layers); 0: the best estimates whatever they are")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--threads", f.threads,
                 "Threads for the estimates and the leaders' simulations (default: the CPUs this "
                 "process may run on)")
      ->check(positive());
  cmd.add_flag("--allow-tp-across-nodes", f.allow_tp_across_nodes,
               "Allow tensor parallelism larger than a node");
  cmd.add_flag("--fixed-stack", f.fixed_stack,
               "Run the stack's overlap knobs and gradient bucket as given (by default the search "
               "also tries each overlap turned off, TP overlap down to bulk and none, and the "
               "bucket at 1/4 and 4x; a knob given as a flag stays)");
  cmd.add_flag("--per-op", f.per_op,
               "Also split each op its own way over the dp x tp mesh (a dense transformer's "
               "block ops, a CNN's fc layers; from each of the best uniform plans, kept only "
               "where the simulated step is shorter; `run` trains transformers' on CPU ranks)");
  cmd.add_flag("--json", f.json, "Print JSON");
  cmd.add_flag("--quiet", f.quiet, "No progress line on stderr (none either when not a terminal)");
  add_stack_flags(cmd, f.stack);
}

planner::SearchRequest request_from(const SearchFlags& f, int64_t gpus) {
  planner::SearchRequest r;
  r.model = models::resolve_model(f.model);
  r.cluster = spec::resolve_cluster(f.cluster);
  r.gpus = gpus;
  r.global_batch = f.global_batch;
  if (f.seq_len > 0) {
    if (std::string problem = spec::seq_len_problem(r.model, f.seq_len); !problem.empty())
      throw InputError("command line", "--seq-len", std::to_string(f.seq_len), problem);
    r.seq_len = f.seq_len;
  }
  for (const std::string& c : f.constraints) r.constraints.push_back(planner::parse_constraint(c));
  for (const std::string& text : f.compressions)
    for (const spec::GradientCompression& c : spec::searched_compressions(text, "--compression"))
      r.compressions.push_back(c);
  r.allow_tp_across_nodes = f.allow_tp_across_nodes;
  r.asynchronous_pipelines = f.asynchronous_pipelines;
  r.gems = f.gems;
  if (f.parameter_server_staleness.size() > planner::kMaxSearchedServerBounds)
    throw InputError(
        "command line", "--parameter-server",
        fmt::format("{} values", f.parameter_server_staleness.size()),
        fmt::format("at most {} staleness bounds a search", planner::kMaxSearchedServerBounds));
  r.parameter_server_staleness = f.parameter_server_staleness;
  r.stack =
      stack_from_flags(f.stack, std::nullopt, r.cluster.device.kind == spec::DeviceKind::kGpu);
  // A knob the user set is kept as set; --fixed-stack keeps them all.
  r.tuning.tp_overlap = !f.fixed_stack && f.stack.tp_overlap.empty();
  r.tuning.dp_overlap = !f.fixed_stack && !f.stack.no_overlap;
  r.tuning.param_gather_overlap = !f.fixed_stack;
  r.tuning.pp_overlap = !f.fixed_stack;
  r.tuning.dp_bucket_bytes = !f.fixed_stack && f.stack.bucket_mb == 0;
  if (!f.dtype.empty()) {
    r.dtype = spec::enum_from_name(spec::dtype_names(), f.dtype);
    if (!r.dtype)
      throw InputError("command line", "--dtype", f.dtype,
                       "must be one of " + spec::enum_choices(spec::dtype_names()));
  }
  return r;
}

planner::SearchOptions options_from(const SearchFlags& f) {
  planner::SearchOptions o;
  auto fidelity = spec::enum_from_name(sim::fidelity_names(), f.network);
  if (!fidelity)
    throw InputError("command line", "--network", f.network, "must be analytic or flow");
  o.fidelity = *fidelity;
  if (f.objective != "time" && f.objective != "cost" && f.objective != "memory")
    throw InputError("command line", "--objective", f.objective, "must be time, cost or memory");
  o.objective = f.objective == "cost"     ? planner::Objective::kCost
                : f.objective == "memory" ? planner::Objective::kMemory
                                          : planner::Objective::kTime;
  o.leaders = f.leaders;
  o.variants_per_layout = f.variants_per_layout;
  o.threads = f.threads;
  // Progress on a terminal only, and never with --json or --quiet.
  auto line =
      std::make_shared<ProgressLine>("simulating the leaders", "plans", !f.json && !f.quiet);
  o.progress = [line](int64_t done, int64_t total) { line->update(done, total); };
  auto scoring = std::make_shared<ProgressLine>("estimating configurations", "configurations",
                                                !f.json && !f.quiet);
  o.estimate_progress = [scoring](int64_t done, int64_t total) { scoring->update(done, total); };
  o.choose_op_splits = f.per_op;
  auto splitting = std::make_shared<ProgressLine>("splitting ops", "moves", !f.json && !f.quiet);
  o.op_split_progress = [splitting](int64_t done, int64_t total) {
    splitting->update(done, total);
  };
  return o;
}

spec::Json plan_file_json(const planner::RankedPlan& best, const planner::SearchRequest& r) {
  spec::Json j = spec::to_json(best.plan);
  j["predicted"] = {{"step_time_s", best.report.step_time_s},
                    {"tokens_per_s", best.report.tokens_per_s},
                    {"mfu", best.report.mfu},
                    {"peak_memory_bytes", best.report.memory.peak_bytes},
                    {"network", best.report.network}};
  j["provenance"] = {{"tool", fmt::format("sextant plan {}", spec::kVersion)},
                     {"commit", spec::git_commit()},
                     {"gpus", r.gpus},
                     {"date", utc_now()}};
  return j;
}

}  // namespace sextant::cli
