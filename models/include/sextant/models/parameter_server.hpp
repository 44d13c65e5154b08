// The step ops of training through co-located parameter servers (spec/parameter_server.hpp): one
// description each, which the simulator prices and the executor traces.
#pragma once

#include <cstdint>

#include "sextant/models/step_ops.hpp"

namespace sextant::models {

// A worker's push: each server its part of the rank's `params` gradients, an all-to-all of the
// whole gradient buffer (the rank keeps its own server's part), `grad_bytes` an element.
StepOp ps_push(int64_t params, int64_t grad_bytes);
// A server's sum of the `servers` workers' parts of its range (spec::server_shard, padded): it
// reads each part and writes the sum, on the data-parallel stream.
StepOp ps_sum(int64_t params, int64_t servers, int64_t grad_bytes);
// A server's optimizer step over its range (optimizer_update over spec::server_shard), on the
// data-parallel stream: the next step's compute does not wait for it.
StepOp ps_update(const OptimizerPrecision& precision, int64_t params, int64_t servers);
// A worker's pull: every server's range of the new version, an all-gather of `params` in the
// parameters' compute dtype (`param_bytes`), the masters staying on their server.
StepOp ps_pull(int64_t params, int64_t param_bytes);

}  // namespace sextant::models
