// Per-convolution channel algorithms by simulated time (channel_algorithms.hpp).
#include "sextant/planner/channel_algorithms.hpp"

#include "sextant/models/lowering.hpp"
#include "sextant/sim/step_setup.hpp"
#include "sextant/spec/channel_split.hpp"

namespace sextant::planner {

ChannelChoice choose_channel_algorithms(const spec::ModelSpec& model,
                                        const spec::ClusterSpec& cluster, spec::Plan plan,
                                        const sim::SimulationOptions& options, int passes) {
  ChannelChoice out;
  auto step_of = [&](const spec::Plan& p) {
    ++out.simulations;
    return sim::simulate(model, cluster, p, options);
  };
  if (model.kind() != spec::ModelKind::kCnn || plan.tp <= 1) {
    out.result = step_of(plan);
    out.byte_rule_step_s = out.result.report.step_time_s;
    out.plan = std::move(plan);
    return out;
  }
  // The byte rule's choices, as the lowering makes them.
  plan.channel_algorithms.clear();
  const std::vector<spec::ChannelAlgorithm> byte_rule =
      models::lower(model, sim::step_setup(model, cluster, plan).lowering).channel_algorithms;
  sim::SimulationResult best = step_of(plan);
  out.byte_rule_step_s = best.report.step_time_s;
  std::vector<spec::ChannelAlgorithm> chosen = byte_rule;
  std::vector<spec::ChannelAlgorithm> options_of = {spec::ChannelAlgorithm::kStationaryX,
                                                    spec::ChannelAlgorithm::kStationaryY};
  if (spec::channel_filter_grid(plan.tp).any())
    options_of.push_back(spec::ChannelAlgorithm::kStationaryW);
  spec::Plan trial = plan;
  for (int pass = 0; pass < passes; ++pass) {
    bool improved = false;
    for (size_t i = 0; i < chosen.size(); ++i) {
      for (spec::ChannelAlgorithm a : options_of) {
        if (a == chosen[i]) continue;
        trial.channel_algorithms = chosen;
        trial.channel_algorithms[i] = a;
        sim::SimulationResult r = step_of(trial);
        // A change must beat the kept step by more than rounding (1 ns in a step of ms).
        if (r.report.step_time_s < best.report.step_time_s - 1e-9) {
          best = std::move(r);
          chosen[i] = a;
          improved = true;
        }
      }
    }
    if (!improved) break;
  }
  for (size_t i = 0; i < chosen.size(); ++i) out.changed += chosen[i] != byte_rule[i] ? 1 : 0;
  if (out.changed > 0) plan.channel_algorithms = chosen;
  out.plan = std::move(plan);
  out.result = std::move(best);
  return out;
}

}  // namespace sextant::planner
