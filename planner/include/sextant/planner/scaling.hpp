// `scale`: the best plan at each GPU count, with throughput, speedup and parallel efficiency
// against the smallest count, and the time, GPU-hours and money to train a token budget -- what
// more GPUs buy.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sextant/planner/planner.hpp"

namespace sextant::planner {

struct ScaleRequest {
  SearchRequest base;               // gpus is overridden per point
  std::vector<int64_t> gpu_counts;  // increasing
  bool weak = false;                // global batch grows with the GPU count
  std::optional<double> tokens;     // training budget (tokens, or samples for non-transformers)
  std::optional<double> price_per_gpu_hour;
};

struct ScalePoint {
  int64_t gpus = 0;
  int64_t global_batch = 0;
  std::optional<RankedPlan> best;
  std::string why_none;  // when no plan exists or fits
  double tokens_per_s = 0;
  double speedup = 0;     // throughput over the first point with a plan
  double efficiency = 0;  // speedup / (gpus / gpus of that point)
  std::optional<double> train_time_s;
  std::optional<double> gpu_hours;
  std::optional<double> cost;
};

std::vector<ScalePoint> scale(const ScaleRequest& request, const SearchOptions& options);

}  // namespace sextant::planner
