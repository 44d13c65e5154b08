#include "sextant/spec/parameter_server.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "sextant/spec/error.hpp"

namespace sextant::spec {

int64_t parameter_server_version(int64_t step, int64_t staleness) {
  return std::max<int64_t>(0, step - staleness);
}

int64_t server_shard(int64_t params, int64_t servers) {
  SEXTANT_CHECK(params >= 0 && servers > 0, "{} parameters over {} servers", params, servers);
  return (params + servers - 1) / servers;
}

std::pair<int64_t, int64_t> server_range(int64_t params, int64_t servers, int64_t server) {
  SEXTANT_CHECK(server >= 0 && server < servers, "server {} of {}", server, servers);
  const int64_t shard = server_shard(params, servers);
  return {std::min(params, server * shard), std::min(params, (server + 1) * shard)};
}

int64_t parameter_server_window(const Plan& plan) {
  if (!plan.parameter_server.enabled || plan.parameter_server.staleness == 0) return 1;
  return 2 * (plan.parameter_server.staleness + 1);
}

std::string parameter_server_problem(const Plan& plan) {
  if (!plan.parameter_server.enabled) return "";
  if (plan.dp < 2) return "needs dp >= 2 (the data-parallel ranks are the workers and servers)";
  if (plan.zero != 0) return "shards the optimizer state over its servers itself: use zero 0";
  if (plan.compression.any()) return "pushes dense gradients: use no compression";
  if (asynchronous(plan.schedule))
    return fmt::format("runs each step with a synchronous pipeline schedule, not {}",
                       enum_name(schedule_names(), plan.schedule));
  if (plan.offload.any()) return "is not modelled with offload";
  if (plan.sample_split() > 1 || plan.ep > 1)
    return "serves the data-parallel replicas only: no context, spatial or expert parallelism";
  if (plan.parameter_server.staleness < 0 || plan.parameter_server.staleness > kMaxStaleness)
    return fmt::format("staleness must be 0 (synchronous) to {}", kMaxStaleness);
  return "";
}

}  // namespace sextant::spec
