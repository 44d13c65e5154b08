// A pipeline stage's last backward passes beside its overlapped gradient reduction, in closed
// form: the two resources the simulator's engine runs -- the compute stream, and the
// data-parallel stream reducing buckets one after another as the backward completes them -- with
// compute slowed to 1 / (1 + f) of full speed while a reduction is in flight (the engine's overlap
// model, DeviceSpec::overlap_slowdown). The planner's estimate of the end of a step; the pipeline's
// makespan (pipeline_schedule.hpp) runs each stage's passes through one at the times its schedule
// starts them, so a reduction also progresses, unslowing, while its stage waits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace sextant::spec {

// A view: the caller owns the arrays (the planner prices millions of drains that share their
// passes and differ in their buckets' prices).
struct StageDrain {
  // Full-speed backward time of each layer of the drained passes (from the stage's first backward
  // of the last micro-batch on), in order, s; pass_end[k]: one past pass k's last layer.
  std::span<const double> layer_backward;
  std::span<const size_t> pass_end;
  // Per bucket, in reduction order: the layer (index into layer_backward) after which it is
  // complete, and its reduction's time, s.
  std::span<const int64_t> bucket_ready_after;
  std::span<const double> bucket_seconds;
  double after = 0;     // reductions that wait for all of these (a tied table's), s
  bool overlap = true;  // false: every reduction after the last pass, nothing slowed
  double slowdown = 0;  // f
};

// One stage's drain, pass by pass.
class DrainStream {
 public:
  explicit DrainStream(const StageDrain& drain) : drain_(&drain) {}
  // Runs the next pass from `start` (no earlier than the previous one's end); returns its end.
  double pass(double start);
  // When the stage's last reduction ends, its last pass having ended at `last_end`.
  double finish(double last_end) const;

 private:
  void advance_stream(double to);  // starts the queued reductions due by `to`

  const StageDrain* drain_;
  size_t next_pass_ = 0, next_layer_ = 0, next_bucket_ = 0;
  size_t queued_ = 0;  // buckets complete and not started: the last `queued_` before next_bucket_
  double stream_free_ = 0;  // when the reduction in flight (if any) ends
};

struct Drain {
  double backward = 0;  // when the last pass ends, s
  double end = 0;       // when the last reduction ends (at least `backward`), s
};
// The passes back to back from 0 (a stage with nothing to wait for between them).
Drain drain_back_to_back(const StageDrain& drain);

}  // namespace sextant::spec
