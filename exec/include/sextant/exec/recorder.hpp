// Times every op and collective of a rank (steady clock, after the backend synchronizes) and
// keeps them as trace events in the shared schema. Disabled, it costs a branch per op.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sextant/spec/trace.hpp"

namespace sextant::exec {

class Backend;

class Recorder {
 public:
  Recorder(int64_t rank, bool enabled, Backend* backend);

  bool enabled() const { return enabled_; }
  // Sets time zero (call right after a barrier so that ranks share it).
  void start_epoch();
  void set_step(int64_t step) { step_ = step; }
  int64_t step() const { return step_; }

  struct Event {
    std::string name;
    spec::OpClass op_class = spec::OpClass::kGemm;
    spec::Stream stream = spec::Stream::kCompute;
    spec::Phase phase = spec::Phase::kNone;
    std::optional<int64_t> layer;
    std::optional<int64_t> micro_batch;
    double flops = 0;
    int64_t bytes = 0;
    std::vector<int64_t> shape;
    int64_t group_size = 0;
    std::string algorithm;
  };

  // Records `event` from construction to destruction.
  class Scope {
   public:
    Scope(Recorder* recorder, Event event);
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope();

   private:
    Recorder* recorder_;
    Event event_;
    std::chrono::steady_clock::time_point start_;
  };
  Scope scope(Event event) { return Scope(enabled_ ? this : nullptr, std::move(event)); }

  // Records an event whose span the caller measured (asynchronous collectives: from launch to
  // the end of the wait).
  void add_span(const Event& e, std::chrono::steady_clock::time_point start,
                std::chrono::steady_clock::time_point end) {
    if (enabled_) add(e, start, end);
  }

  const std::vector<spec::TraceEvent>& events() const { return events_; }
  void clear() { events_.clear(); }

 private:
  friend class Scope;
  void add(const Event& e, std::chrono::steady_clock::time_point start,
           std::chrono::steady_clock::time_point end);

  int64_t rank_;
  bool enabled_;
  Backend* backend_;
  int64_t step_ = 0;
  std::chrono::steady_clock::time_point epoch_;
  std::vector<spec::TraceEvent> events_;
};

}  // namespace sextant::exec
