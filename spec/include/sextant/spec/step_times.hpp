// The warm-up rule: which measured steps a run's step time averages. One home for the executor's
// trace metadata (step_time_s), `sextant run`'s summary and the calibration loop.
#pragma once

#include <optional>
#include <vector>

namespace sextant::spec {

// The mean step after the warm-up: the first two steps left out when more than three ran, the
// first when two or three ran (caches, the allocator, clocks and on GPUs the GEMM heuristics
// settle in the first steps), the only one when one ran. nullopt when no step ran.
std::optional<double> mean_step_after_warmup(const std::vector<double>& step_times_s);

// The steps that mean averages.
std::vector<double> steps_after_warmup(const std::vector<double>& step_times_s);

}  // namespace sextant::spec
