// The bandwidth at which a compressed gradient exchange starts to pay, by a sweep and bisection
// of simulated steps.
#include "sextant/planner/compression_crossover.hpp"

#include <fmt/format.h>

#include <cmath>
#include <set>

#include "sextant/spec/error.hpp"
#include "sextant/spec/rank_layout.hpp"

namespace sextant::planner {

namespace {

// Points of the log-spaced sweep over [1/kSweepBelow, kSweepAbove] times the cluster's bandwidth
// (four decades: four to five points a decade), and the bisection steps that then narrow the
// highest crossing to a factor of 2^(log2(1.85) / 2^20): far below the model's own error.
constexpr int kSweepPoints = 17;
constexpr int kBisections = 20;

// The outermost network level the gradient exchange crosses: the cluster level when the
// replicas summing a gradient (spec::RankLayout::replica_group) sit on several nodes.
size_t swept_level(const spec::ClusterSpec& cluster, const spec::Plan& plan) {
  if (!cluster.network.cluster_level()) return 0;
  std::set<int64_t> nodes;
  for (int64_t r : spec::RankLayout(plan).replica_group(0))
    nodes.insert(r / cluster.devices_per_node);
  return nodes.size() > 1 ? 1 : 0;
}

// `cluster` with the bandwidth of level `level` multiplied by `factor` (its calibrated fits' β
// divided by it).
spec::ClusterSpec with_bandwidth(spec::ClusterSpec cluster, size_t level, double factor) {
  spec::NetworkLevel& l = cluster.network.levels[level];
  l.bandwidth_GBps *= factor;
  for (spec::CollectiveFit& fit : cluster.collective_fits)
    if (fit.level == l.name) fit.beta_us_per_byte /= factor;
  return cluster;
}

}  // namespace

CompressionCrossover compression_crossover(const spec::ModelSpec& model,
                                           const spec::ClusterSpec& cluster, const spec::Plan& plan,
                                           const spec::GradientCompression& compression,
                                           sim::Fidelity fidelity, const std::string& plan_source) {
  if (!compression.any())
    throw InputError(plan_source, "/compression/kind", "none",
                     "a compression to sweep against the uncompressed exchange");
  if (std::string problem = spec::compression_problem(plan, compression); !problem.empty())
    throw InputError(plan_source, "/compression/kind",
                     std::string(spec::enum_name(spec::compression_kind_names(), compression.kind)),
                     fmt::format("{} ({})", problem, plan.name()));
  spec::Plan uncompressed = plan;
  uncompressed.compression = {};
  spec::Plan compressed = plan;
  compressed.compression = compression;

  CompressionCrossover out;
  out.compression = compression;
  const size_t level = swept_level(cluster, plan);
  out.level = cluster.network.levels[level].name;
  out.cluster_GBps = cluster.network.levels[level].bandwidth_GBps;
  out.lowest_GBps = out.cluster_GBps / kSweepBelow;
  out.highest_GBps = out.cluster_GBps * kSweepAbove;

  sim::SimulationOptions options;
  options.fidelity = fidelity;
  options.plan_source = plan_source;
  struct Steps {
    double compressed_s = 0;
    double uncompressed_s = 0;
    bool pays() const { return compressed_s < uncompressed_s; }
  };
  auto steps_at = [&](double factor) {
    const spec::ClusterSpec c = with_bandwidth(cluster, level, factor);
    return Steps{sim::simulate(model, c, compressed, options).report.step_time_s,
                 sim::simulate(model, c, uncompressed, options).report.step_time_s};
  };
  const Steps here = steps_at(1.0);
  out.compressed_step_s = here.compressed_s;
  out.uncompressed_step_s = here.uncompressed_s;

  const double log_low = std::log(1.0 / kSweepBelow);
  const double log_high = std::log(kSweepAbove);
  auto factor_at = [&](int i) {
    return std::exp(log_low + (log_high - log_low) * i / (kSweepPoints - 1));
  };
  // From the top of the range down: the first interval whose ends differ holds the highest
  // crossing.
  bool upper_pays = steps_at(factor_at(kSweepPoints - 1)).pays();
  bool all_pay = upper_pays;
  for (int i = kSweepPoints - 2; i >= 0; --i) {
    const bool lower_pays = steps_at(factor_at(i)).pays();
    all_pay = all_pay && lower_pays;
    if (lower_pays != upper_pays) {
      double lo = std::log(factor_at(i)), hi = std::log(factor_at(i + 1));
      for (int b = 0; b < kBisections; ++b) {
        const double mid = 0.5 * (lo + hi);
        (steps_at(std::exp(mid)).pays() == lower_pays ? lo : hi) = mid;
      }
      out.crossover_GBps = out.cluster_GBps * std::exp(0.5 * (lo + hi));
      out.pays_below = lower_pays;
      return out;
    }
    upper_pays = lower_pays;
  }
  out.pays_throughout = all_pay;
  return out;
}

}  // namespace sextant::planner
