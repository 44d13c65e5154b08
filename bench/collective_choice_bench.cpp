// Which collective algorithm the cost model picks per message size and network (issue 61): the
// library's own choice (NCCL's tuner model on GPU clusters, the cheapest formula or a fitted
// transport under MPI) and, where the executor runs named algorithms (MPI CPU ranks), the named
// one the planner would keep (planner/collective_algorithms.hpp) with its gain. Prints numbers,
// never pass/fail. Usage: collective_choice_bench CLUSTER:SIZE[:NODES] ...
#include <fmt/format.h>

#include <cstdio>
#include <limits>
#include <string>

#include "sextant/sim/collective_model.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/executor_support.hpp"

namespace {

using sextant::spec::CollectiveAlgorithm;
using sextant::spec::CollectiveKind;

std::string name_of(CollectiveAlgorithm a) {
  return std::string(sextant::spec::enum_name(sextant::spec::collective_algorithm_names(), a));
}

void table(const std::string& arg) {
  const size_t c1 = arg.find(':');
  const std::string cluster_name = arg.substr(0, c1);
  const std::string rest = c1 == std::string::npos ? "8" : arg.substr(c1 + 1);
  const size_t c2 = rest.find(':');
  const int64_t size = std::stoll(rest.substr(0, c2));
  const int64_t nodes = c2 == std::string::npos ? 1 : std::stoll(rest.substr(c2 + 1));
  const sextant::spec::ClusterSpec cluster = sextant::spec::resolve_cluster(cluster_name);
  const sextant::sim::GroupShape shape{size, nodes, size / nodes};
  const sextant::sim::CollectiveModel library(cluster, {});
  const bool named = cluster.device.kind == sextant::spec::DeviceKind::kCpu &&
                     cluster.network.library == sextant::spec::CollectiveLibrary::kMpi;
  fmt::print(
      "{}: {} ranks on {} node(s), {}{}\n", cluster.name, size, nodes,
      sextant::spec::enum_name(sextant::spec::collective_library_names(), cluster.network.library),
      cluster.collective_fits.empty() ? "" : ", fitted");
  fmt::print("  {:<15} {:>10}  {:<28} {:>11}  {:<20} {:>11} {:>7}\n", "collective", "bytes",
             "library's choice", "time us", "best named", "time us", "gain");
  for (CollectiveKind kind :
       {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter, CollectiveKind::kAllGather}) {
    for (int64_t bytes = 1024; bytes <= (int64_t{1} << 30); bytes *= 16) {
      const sextant::sim::CollectiveCost own = library.cost(kind, bytes, shape);
      std::string choice = name_of(own.algorithm);
      if (!own.protocol.empty()) choice += "/" + std::string(own.protocol);
      std::string best = "-";
      double best_s = std::numeric_limits<double>::infinity();
      if (named) {
        for (const auto& [text, algorithm] : sextant::spec::collective_algorithm_names()) {
          if (!sextant::spec::executor_runs_collective(kind, algorithm)) continue;
          const sextant::sim::CollectiveModel as_named(cluster, {{kind, algorithm}});
          const double s = as_named.cost(kind, bytes, shape).seconds();
          if (s < best_s) {
            best_s = s;
            best = name_of(algorithm);
          }
        }
      }
      const std::string kind_name(
          sextant::spec::enum_name(sextant::spec::collective_kind_names(), kind));
      if (named) {
        fmt::print("  {:<15} {:>10}  {:<28} {:>11.1f}  {:<20} {:>11.1f} {:>6.1f}%\n", kind_name,
                   bytes, choice, own.seconds() * 1e6, best, best_s * 1e6,
                   100 * (own.seconds() - best_s) / own.seconds());
      } else {
        fmt::print("  {:<15} {:>10}  {:<28} {:>11.1f}\n", kind_name, bytes, choice,
                   own.seconds() * 1e6);
      }
    }
  }
  fmt::print("\n");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    for (int i = 1; i < argc; ++i) table(argv[i]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
