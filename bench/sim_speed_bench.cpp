// Simulator speed: one iteration of GPT-3 175B on 1024 dgx-a100 GPUs (tp 8, pp 16, dp 8, global
// batch 1536, micro-batch 1, interleaved schedule with 2 chunks, full recompute, stack
// megatron-lm), every rank and event simulated, in both fidelities; and the same layout under
// megatron-core with sequence parallelism (flash attention, overlapped TP, distributed optimizer).
// The analytic rows fold symmetric ranks (rank_symmetry.hpp: `ranks` says how many the engine
// ran); the "analytic-all" row runs every rank, for the engine's own speed. Prints wall time,
// events and events per second (best of `--repeat` runs, default 3). A number, never a pass/fail.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_catalog.hpp"

int main(int argc, char** argv) {
  using namespace sextant;
  int repeat = 3;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--repeat") == 0) repeat = std::max(1, std::atoi(argv[i + 1]));
  spec::ModelSpec model = models::zoo_model("gpt3-175b");
  spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  spec::Plan plan;
  plan.dp = 8;
  plan.tp = 8;
  plan.pp = 16;
  plan.global_batch = 1536;
  plan.micro_batch = 1;
  plan.schedule = spec::Schedule::kInterleaved;
  plan.virtual_stages = 2;
  plan.recompute = spec::Recompute::kFull;
  plan.stack = spec::builtin_stack("megatron-lm");
  spec::Plan core = plan;
  core.stack = spec::builtin_stack("megatron-core");
  core.sequence_parallel = true;
  core.zero = 1;
  fmt::print("{:<14} {:<13} {:>10} {:>6} {:>12} {:>14} {:>12}\n", "stack", "fidelity", "wall_s",
             "ranks", "events", "events_per_s", "step_time_s");
  struct Row {
    const spec::Plan* plan;
    sim::Fidelity fidelity;
    bool fold;
  };
  for (Row row :
       {Row{&plan, sim::Fidelity::kAnalytic, true}, Row{&plan, sim::Fidelity::kAnalytic, false},
        Row{&plan, sim::Fidelity::kFlow, false}, Row{&core, sim::Fidelity::kAnalytic, true},
        Row{&core, sim::Fidelity::kAnalytic, false}}) {
    const spec::Plan* p = row.plan;
    double best = 1e300;
    sim::SimulationResult result;
    for (int i = 0; i < repeat; ++i) {
      sim::SimulationOptions o;
      o.fidelity = row.fidelity;
      o.fold_symmetric_ranks = row.fold;
      auto t0 = std::chrono::steady_clock::now();
      result = sim::simulate(model, cluster, *p, o);
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::string fidelity(spec::enum_name(sim::fidelity_names(), row.fidelity));
    if (row.fidelity == sim::Fidelity::kAnalytic && !row.fold) fidelity += "-all";
    fmt::print("{:<14} {:<13} {:>10.3f} {:>6} {:>12} {:>14.3g} {:>12.3f}\n", p->stack->preset,
               fidelity, best, result.report.simulated_ranks, result.report.events,
               static_cast<double>(result.report.events) / best, result.report.step_time_s);
  }
  return 0;
}
