// A stage's last backward passes beside its gradient reduction, on two resources.
#include "sextant/spec/gradient_drain.hpp"

#include <algorithm>

namespace sextant::spec {

void DrainStream::advance_stream(double to) {
  // A queued reduction starts when the one before it ends, whether or not compute runs then.
  while (queued_ > 0 && stream_free_ <= to) {
    stream_free_ += drain_->bucket_seconds[next_bucket_ - queued_];
    --queued_;
  }
}

double DrainStream::pass(double start) {
  const StageDrain& d = *drain_;
  const double slowed = 1.0 + d.slowdown;  // seconds of wall per second of work
  double now = start;
  advance_stream(now);
  const size_t end = d.pass_end[next_pass_++];
  const bool completes_bucket = next_bucket_ < d.bucket_ready_after.size() &&
                                d.bucket_ready_after[next_bucket_] < static_cast<int64_t>(end);
  if (!completes_bucket) {
    // No bucket joins the stream during the pass: it is busy until the reductions in flight and
    // queued are done, and the pass runs slowed for that long (in closed form; most passes of an
    // interleaved drain are of this kind).
    double work = 0;
    for (; next_layer_ < end; ++next_layer_) work += d.layer_backward[next_layer_];
    double busy_until = now;
    if (stream_free_ > now) {
      busy_until = stream_free_;
      for (size_t b = next_bucket_ - queued_; b < next_bucket_; ++b)
        busy_until += d.bucket_seconds[b];
    }
    const double beside = (busy_until - now) / slowed;  // work done while the stream is busy
    now = work <= beside ? now + work * slowed : busy_until + (work - beside);
    advance_stream(now);
    return now;
  }
  for (; next_layer_ < end; ++next_layer_) {
    double work = d.layer_backward[next_layer_];
    while (work > 0) {
      if (stream_free_ > now) {
        // A reduction is in flight: the layer runs slowed until it ends (or the layer does).
        const double can = (stream_free_ - now) / slowed;
        if (work <= can) {
          now += work * slowed;
          work = 0;
        } else {
          work -= can;
          now = stream_free_;
          advance_stream(now);
        }
      } else {
        now += work;
        work = 0;
      }
    }
    advance_stream(now);
    while (next_bucket_ < d.bucket_ready_after.size() &&
           d.bucket_ready_after[next_bucket_] == static_cast<int64_t>(next_layer_)) {
      ++next_bucket_;
      if (!d.overlap) continue;
      if (queued_ == 0 && stream_free_ <= now) {
        stream_free_ = now + d.bucket_seconds[next_bucket_ - 1];
      } else {
        ++queued_;
      }
    }
  }
  return now;
}

double DrainStream::finish(double last_end) const {
  const StageDrain& d = *drain_;
  double end = std::max(stream_free_, last_end);
  if (d.overlap) {
    for (size_t b = next_bucket_ - queued_; b < next_bucket_; ++b) end += d.bucket_seconds[b];
  } else {
    for (double s : d.bucket_seconds) end += s;
  }
  return end + d.after;
}

Drain drain_back_to_back(const StageDrain& drain) {
  DrainStream stream(drain);
  Drain out;
  for (size_t k = 0; k < drain.pass_end.size(); ++k) out.backward = stream.pass(out.backward);
  out.end = stream.finish(out.backward);
  return out;
}

}  // namespace sextant::spec
