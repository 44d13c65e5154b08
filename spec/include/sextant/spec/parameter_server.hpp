// Data-parallel training through sharded parameter servers with bounded staleness (Li et al.,
// OSDI'14, "Scaling Distributed Machine Learning with the Parameter Server", §3.1 key ranges,
// §4.3 bounded delay; Ho et al., NIPS'13, "More Effective Distributed ML via a Stale Synchronous
// Parallel Parameter Server"). The data-parallel ranks are the workers and, co-located, the
// servers: server r owns a contiguous range of the stage's parameters (server_range) with their
// master weights and optimizer state. After its step t a worker pushes each server its part of
// the gradients; the server sums the workers' parts in rank order, updates its range and sends
// the new version to every worker (the pull). A worker runs step t with the version after
// parameter_server_version(t, s) = max(0, t - s) updates: staleness 0 is synchronous, and with s
// >= 1 the exchange of step t runs while the worker computes the next s steps. The bound is
// taken every step (SSP's worst case), so the run is deterministic and equals one process that
// reads every layer s steps stale (exec's TrainOptions::layer_staleness).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "sextant/spec/plan.hpp"

namespace sextant::spec {

// The most steps a worker may run ahead of the updates it has read.
inline constexpr int64_t kMaxStaleness = 16;

// The weight version (updates applied) step `step` reads under staleness `staleness`.
int64_t parameter_server_version(int64_t step, int64_t staleness);

// The parameters each of `servers` servers owns of `params`, rounded up: every server prices (and
// pads) this many, the last one holding fewer (as a ZeRO shard).
int64_t server_shard(int64_t params, int64_t servers);
// The flat range [begin, end) of `params` parameters that server `server` owns.
std::pair<int64_t, int64_t> server_range(int64_t params, int64_t servers, int64_t server);

// The batches the simulator runs back to back to price a step in steady state: 1 when
// synchronous; 2 (s + 1) with staleness s, so that s + 1 steps wait for a pull.
int64_t parameter_server_window(const Plan& plan);

// Why `plan` cannot train through parameter servers: "" if it can (validate_plan asks).
std::string parameter_server_problem(const Plan& plan);

}  // namespace sextant::spec
