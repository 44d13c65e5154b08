// `sextant simulate`: predict one training step of a plan.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "plan_options.hpp"
#include "progress_line.hpp"
#include "report_print.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/sim/step_setup.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/stack_support.hpp"
#include "trace_options.hpp"
#include "validators.hpp"

namespace sextant::cli {

namespace {

struct SimulateOptions {
  std::string model;
  std::string cluster;
  int64_t gpus = 0;
  PlanFlags plan;
  std::string network = "analytic";
  bool json = false;
  bool explain_memory = false;
  TraceFlags trace;
  std::string report;
  bool quiet = false;
};

void run(const SimulateOptions& o) {
  spec::ModelSpec model = models::resolve_model(o.model);
  spec::ClusterSpec cluster = spec::resolve_cluster(o.cluster);
  spec::Plan plan =
      plan_from_flags(o.plan, o.gpus > 0 ? std::optional<int64_t>(o.gpus) : std::nullopt,
                      cluster.device.kind == spec::DeviceKind::kGpu, model.kind());
  sim::SimulationOptions options;
  auto fidelity = spec::enum_from_name(sim::fidelity_names(), o.network);
  if (!fidelity) {
    throw InputError("command line", "--network", o.network, "must be analytic or flow");
  }
  options.fidelity = *fidelity;
  options.trace = !o.trace.file.empty();
  options.explain_memory = o.explain_memory;
  options.plan_source = o.plan.plan_file.empty() ? "command line" : o.plan.plan_file;
  {
    // A plan its stack's software cannot run has no step time to predict (the plan's own rules
    // first: what is wrong with the plan itself is said before what its stack lacks).
    spec::validate_plan(plan, model, plan.world_size(), options.plan_source);
    const spec::Stack stack =
        spec::plan_stack(plan, cluster.device.kind == spec::DeviceKind::kGpu, model.kind());
    spec::check_stack_runs(plan, model, stack, sim::step_precision(cluster, plan, stack).gemm_dtype,
                           options.plan_source);
  }
  const spec::TraceSelection selection = trace_selection_from(o.trace, plan);
  options.trace_ranks = selection.ranks;  // only those recorded
  // Outputs are checked before the simulation, which can take a minute on large plans.
  for (const auto& [flag, path] :
       {std::pair{"--trace", o.trace.file}, std::pair{"--report", o.report}}) {
    if (path.empty()) continue;
    if (std::string why = spec::unwritable_reason(path); !why.empty())
      throw InputError(flag, "", path, why);
  }
  ProgressLine progress("simulating", "tasks", !o.json && !o.quiet);
  options.progress = [&progress](int64_t done, int64_t total) { progress.update(done, total); };
  sim::SimulationResult result = sim::simulate(model, cluster, plan, options);
  progress.finish();
  if (result.trace) {
    spec::apply(selection, *result.trace);
    spec::write_trace_file(o.trace.file, *result.trace);
    if (!o.json) fmt::print("trace: {} ({} events)\n", o.trace.file, result.trace->events.size());
    if (result.trace->events.empty())
      fmt::print(stderr, "warning: --trace-ranks / --trace-steps kept no event: {} is empty\n",
                 o.trace.file);
    // Perfetto's UI loads traces of up to ~2 GB (its in-browser memory); warn well before.
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(o.trace.file, ec);
    if (!ec && bytes > (1ULL << 30))
      fmt::print(stderr,
                 "warning: {} is {:.1f} GiB, more than Perfetto opens comfortably:\n"
                 "         keep fewer ranks (--trace-ranks stages) or steps (--trace-steps 0), "
                 "or name it .gz\n",
                 o.trace.file, static_cast<double>(bytes) / static_cast<double>(1ULL << 30));
  }
  if (!o.report.empty()) spec::write_json_file(o.report, spec::to_json(result.report));
  if (o.json) {
    std::cout << spec::to_json(result.report).dump(2) << "\n";
  } else {
    print_report(
        result.report,
        best_published_mfu(
            cluster, plan,
            spec::plan_stack(plan, cluster.device.kind == spec::DeviceKind::kGpu, model.kind())));
  }
}

}  // namespace

void add_simulate_command(CLI::App& app) {
  auto o = std::make_shared<SimulateOptions>();
  CLI::App* cmd = app.add_subcommand("simulate", "Predict one training step of a plan");
  cmd->add_option("--model", o->model, "Zoo name, model file or Hugging Face config.json")
      ->required();
  cmd->add_option("--cluster", o->cluster, "Cluster name or file")->required();
  cmd->add_option("--gpus", o->gpus,
                  "Number of GPUs (must equal dp*tp*pp, times the spatial split)")
      ->check(positive());
  add_plan_flags(*cmd, o->plan);
  cmd->add_option("--network", o->network, "Network fidelity: analytic or flow");
  cmd->add_flag("--json", o->json, "Print the report as JSON");
  cmd->add_flag("--explain-memory", o->explain_memory,
                "Itemize the memory of the most loaded rank: each part's bytes and how they arise");
  add_trace_flags(*cmd, o->trace, "the predicted trace");
  cmd->add_option("--report", o->report, "Write the report JSON to a file");
  cmd->add_flag("--quiet", o->quiet,
                "No progress line on stderr (none either when not a terminal)");
  cmd->callback([o] { run(*o); });
}

}  // namespace sextant::cli
