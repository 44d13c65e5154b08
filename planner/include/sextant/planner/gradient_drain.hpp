// The last micro-batch's backward of one stage beside its overlapped gradient reduction, in closed
// form: the same two resources the simulator's engine runs (the compute stream, and the
// data-parallel stream reducing buckets one after another as the backward completes them), with
// compute slowed to 1 / (1 + f) of full speed while a reduction is in flight (the engine's overlap
// model, DeviceSpec::overlap_slowdown).
#pragma once

#include <cstdint>
#include <vector>

namespace sextant::planner {

struct DrainInput {
  // Full-speed backward time of each layer of the last micro-batch, in backward order, s.
  std::vector<double> layer_backward;
  // Per bucket, in reduction order: the position in layer_backward after which it is complete
  // (models::GradientBucket's layers end there), and its reduction's time, s.
  std::vector<int64_t> bucket_ready_after;
  std::vector<double> bucket_seconds;
  // Reductions run after the whole backward when false (no overlap: nothing is slowed).
  bool overlap = true;
  double slowdown = 0;  // f
};

struct Drain {
  double backward = 0;            // when the last layer's backward ends, slowed, s
  double end = 0;                 // when the last bucket's reduction ends (at least `backward`), s
  std::vector<double> layer_end;  // when each layer's backward ends, slowed, s
};

Drain gradient_drain(const DrainInput& in);

}  // namespace sextant::planner
