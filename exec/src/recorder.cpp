// Op timing.
#include "sextant/exec/recorder.hpp"

#include "sextant/exec/backend.hpp"

namespace sextant::exec {

Recorder::Recorder(int64_t rank, bool enabled, Backend* backend)
    : rank_(rank), enabled_(enabled), backend_(backend), epoch_(std::chrono::steady_clock::now()) {}

void Recorder::start_epoch() {
  epoch_ = std::chrono::steady_clock::now();
}

Recorder::Scope::Scope(Recorder* recorder, Event event) : recorder_(recorder) {
  if (recorder_ == nullptr) return;
  event_ = std::move(event);
  recorder_->backend_->synchronize();
  start_ = std::chrono::steady_clock::now();
}

Recorder::Scope::~Scope() {
  if (recorder_ == nullptr) return;
  recorder_->backend_->synchronize();
  recorder_->add(event_, start_, std::chrono::steady_clock::now());
}

void Recorder::add(const Event& e, std::chrono::steady_clock::time_point start,
                   std::chrono::steady_clock::time_point end) {
  spec::TraceEvent t;
  t.name = e.name;
  t.op_class = e.op_class;
  t.rank = rank_;
  t.stream = e.stream;
  t.start_ps = std::chrono::duration_cast<std::chrono::nanoseconds>(start - epoch_).count() * 1000;
  t.duration_ps = std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count() * 1000;
  t.phase = e.phase;
  t.layer = e.layer;
  t.micro_batch = e.micro_batch;
  t.step = step_;
  t.flops = e.flops;
  t.bytes = e.bytes;
  t.shape = e.shape;
  t.dtype = backend_ != nullptr && backend_->activation_dtype() == DType::kBF16 ? spec::Dtype::kBf16
                                                                                : spec::Dtype::kFp32;
  t.group_size = e.group_size;
  t.algorithm = e.algorithm;
  events_.push_back(std::move(t));
}

}  // namespace sextant::exec
