// When gradient compression pays: a plan's layout held fixed, the bandwidth of the network level
// its gradient exchange crosses is swept, and the bandwidth below which the compressed step is
// faster than the uncompressed one is found -- the answer to "is our interconnect slow enough for
// QSGD, top-k, 1-bit or PowerSGD to help?" before buying it.
#pragma once

#include <optional>
#include <string>

#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::planner {

struct CompressionCrossover {
  spec::GradientCompression compression;
  std::string level;        // the network level swept: the outermost the replica group crosses
  double cluster_GBps = 0;  // its bandwidth in the cluster file
  double lowest_GBps = 0;   // the swept range (kSweepBelow below to kSweepAbove above it)
  double highest_GBps = 0;
  // Steps at the cluster's own bandwidth.
  double compressed_step_s = 0;
  double uncompressed_step_s = 0;
  // The highest bandwidth of the range at which compression turns from faster to slower or back
  // (the highest crossing, where a codec's cost and a smaller last bucket can make more than
  // one); `pays_below` says on which side of it the compressed step is the faster one (below it
  // where compression sends fewer bytes; above it where it sends more but its exposed tail is
  // shorter). Empty when the two never cross in the range: then `pays_throughout` says whether
  // compression is faster across all of it or nowhere.
  std::optional<double> crossover_GBps;
  bool pays_below = true;
  bool pays_throughout = false;
};

// The sweep's range around the cluster's bandwidth: from 1/kSweepBelow of it (a slow Ethernet
// under an InfiniBand cluster's figure) to kSweepAbove times it.
inline constexpr double kSweepBelow = 1000;
inline constexpr double kSweepAbove = 10;

// Sweeps `plan`'s layout with `compression` against it uncompressed (plan.compression is
// ignored). The level's bandwidth and the inverse bandwidth of calibrated collective fits at that
// level scale together; latency, message efficiency and every other level stay. Throws
// InputError naming `plan_source` when the layout cannot compress its gradients so
// (spec::compression_problem) or the plan does not fit the model and cluster.
CompressionCrossover compression_crossover(const spec::ModelSpec& model,
                                           const spec::ClusterSpec& cluster, const spec::Plan& plan,
                                           const spec::GradientCompression& compression,
                                           sim::Fidelity fidelity,
                                           const std::string& plan_source = "plan");

}  // namespace sextant::planner
