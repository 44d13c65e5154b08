// Scaling sweeps over GPU counts.
#include "sextant/planner/scaling.hpp"

#include <fmt/format.h>

namespace sextant::planner {

std::vector<ScalePoint> scale(const ScaleRequest& request, const SearchOptions& options) {
  std::vector<ScalePoint> points;
  const int64_t first_gpus = request.gpu_counts.empty() ? 1 : request.gpu_counts.front();
  std::optional<size_t> reference;  // index of the first point with a plan
  for (int64_t gpus : request.gpu_counts) {
    ScalePoint p;
    p.gpus = gpus;
    SearchRequest r = request.base;
    r.gpus = gpus;
    r.global_batch =
        request.weak ? request.base.global_batch * gpus / first_gpus : request.base.global_batch;
    p.global_batch = r.global_batch;
    if (gpus > r.cluster.total_devices()) {
      p.why_none = fmt::format("the cluster has {} devices", r.cluster.total_devices());
    } else {
      SearchResult s = search(r, options);
      if (!s.ranked.empty()) {
        p.best = s.ranked.front();
      } else if (s.enumerated == 0) {
        p.why_none = "no legal layout (the batch does not divide over the replicas)";
      } else {
        p.why_none = fmt::format("nothing fits in memory (least needed {:.1f} GiB)",
                                 static_cast<double>(s.least_memory_bytes) / (1 << 30));
      }
    }
    if (p.best) {
      p.tokens_per_s = p.best->report.tokens_per_s;
      if (!reference) {
        p.speedup = 1;
        p.efficiency = 1;
      } else {
        const ScalePoint& ref = points[*reference];
        p.speedup = p.tokens_per_s / ref.tokens_per_s;
        p.efficiency = p.speedup * static_cast<double>(ref.gpus) / static_cast<double>(gpus);
      }
      if (request.tokens) {
        p.train_time_s = *request.tokens / p.tokens_per_s;
        p.gpu_hours = *p.train_time_s * static_cast<double>(gpus) / 3600;
        if (request.price_per_gpu_hour) p.cost = *p.gpu_hours * *request.price_per_gpu_hour;
      }
    }
    points.push_back(std::move(p));
    if (!reference && points.back().best) reference = points.size() - 1;
  }
  return points;
}

}  // namespace sextant::planner
