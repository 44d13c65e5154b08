// Simulator speed: one iteration of GPT-3 175B on 1024 dgx-a100 GPUs (tp 8, pp 16, dp 8, global
// batch 1536, micro-batch 1, interleaved schedule with 2 chunks, full recompute, stack
// megatron-lm), every rank and event simulated, in both fidelities; and the same layout under
// megatron-core with sequence parallelism (flash attention, overlapped TP, distributed optimizer).
// Prints wall time, events and events per second (best of
// `--repeat` runs, default 3). A number, never a pass/fail.
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
  fmt::print("{:<14} {:<9} {:>10} {:>12} {:>14} {:>12}\n", "stack", "fidelity", "wall_s", "events",
             "events_per_s", "step_time_s");
  for (auto [p, f] :
       {std::pair{&plan, sim::Fidelity::kAnalytic}, std::pair{&plan, sim::Fidelity::kFlow},
        std::pair{&core, sim::Fidelity::kAnalytic}}) {
    double best = 1e300;
    sim::SimulationResult result;
    for (int i = 0; i < repeat; ++i) {
      sim::SimulationOptions o;
      o.fidelity = f;
      auto t0 = std::chrono::steady_clock::now();
      result = sim::simulate(model, cluster, *p, o);
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    fmt::print("{:<14} {:<9} {:>10.3f} {:>12} {:>14.3g} {:>12.3f}\n", p->stack->preset,
               spec::enum_name(sim::fidelity_names(), f), best, result.report.events,
               static_cast<double>(result.report.events) / best, result.report.step_time_s);
  }
  return 0;
}
