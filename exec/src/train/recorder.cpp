// Op timing.
#include "sextant/exec/recorder.hpp"

#include <cmath>

namespace sextant::exec {

Recorder::Recorder(int64_t rank, bool enabled, DeviceMemory* backend)
    : rank_(rank), enabled_(enabled), backend_(backend) {}

void Recorder::start_epoch() {
  if (enabled_) epoch_ = backend_->mark();
}

Recorder::Scope::Scope(Recorder* recorder, Event event, bool drain)
    : recorder_(recorder), drain_(drain) {
  if (recorder_ == nullptr) return;
  event_ = std::move(event);
  start_ = recorder_->backend_->mark();
}

Recorder::Scope::~Scope() {
  if (recorder_ == nullptr) return;
  if (drain_) recorder_->backend_->synchronize();
  recorder_->pending_.push_back(
      {std::move(event_), std::move(start_), recorder_->backend_->mark()});
}

void Recorder::resolve() {
  if (pending_.empty()) return;
  if (epoch_ == nullptr) epoch_ = backend_->mark();  // no start_epoch(): time from here
  const spec::Dtype dtype =
      backend_->activation_dtype() == DType::kBF16 ? spec::Dtype::kBf16 : spec::Dtype::kFp32;
  for (Pending& p : pending_) {
    const Event& e = p.event;
    spec::TraceEvent t;
    t.name = e.name;
    t.op_class = e.op_class;
    t.rank = rank_;
    t.stream = e.stream;
    t.start_ps = std::llround(backend_->seconds_between(*epoch_, *p.start) * 1e12);
    t.duration_ps = std::llround(backend_->seconds_between(*p.start, *p.end) * 1e12);
    t.phase = e.phase;
    t.layer = e.layer;
    t.micro_batch = e.micro_batch;
    t.step = step_;
    t.flops = e.flops;
    t.bytes = e.bytes;
    t.shape = e.shape;
    t.dtype = dtype;
    t.group_size = e.group_size;
    t.algorithm = e.algorithm;
    events_.push_back(std::move(t));
  }
  pending_.clear();
}

}  // namespace sextant::exec
