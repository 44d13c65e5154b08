// The last backward beside its gradient reduction, played out on two resources.
#include "sextant/planner/gradient_drain.hpp"

#include <algorithm>
#include <deque>

namespace sextant::planner {

Drain gradient_drain(const DrainInput& in) {
  const double rate_slowed = 1.0 + in.slowdown;  // seconds of wall per second of work
  std::deque<double> queued;                     // buckets complete, waiting for the stream
  double now = 0;
  double stream_free = 0;  // when the reduction in flight (if any) ends
  auto start_next = [&](double at) {
    if (queued.empty()) return;
    stream_free = at + queued.front();
    queued.pop_front();
  };
  size_t next_bucket = 0;
  Drain out;
  out.layer_end.reserve(in.layer_backward.size());
  for (size_t k = 0; k < in.layer_backward.size(); ++k) {
    double work = in.layer_backward[k];
    while (work > 0) {
      if (stream_free > now) {
        // A reduction is in flight: the layer runs slowed until it ends (or the layer does).
        const double can = (stream_free - now) / rate_slowed;
        if (work <= can) {
          now += work * rate_slowed;
          work = 0;
        } else {
          work -= can;
          now = stream_free;
          start_next(now);
        }
      } else {
        now += work;
        work = 0;
      }
    }
    out.layer_end.push_back(now);
    if (stream_free <= now) start_next(stream_free);  // one that ended just as the layer did
    while (next_bucket < in.bucket_ready_after.size() &&
           in.bucket_ready_after[next_bucket] == static_cast<int64_t>(k)) {
      if (in.overlap) {
        queued.push_back(in.bucket_seconds[next_bucket]);
        if (stream_free <= now) start_next(now);
      }
      ++next_bucket;
    }
  }
  out.backward = now;
  double end = std::max(stream_free, now);
  for (double q : queued) end += q;
  if (!in.overlap)
    for (double s : in.bucket_seconds) end += s;
  out.end = end;
  return out;
}

}  // namespace sextant::planner
