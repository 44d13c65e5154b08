// Times every op and collective of a rank with the backend's marks (CUDA events on a GPU, so the
// device is never stalled to time it; the host clock on the CPU) and keeps them as trace events
// in the shared schema. Marks are turned into times when a step ends. Disabled, it costs a
// branch per op.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sextant/exec/kernels/memory.hpp"
#include "sextant/spec/trace.hpp"

namespace sextant::exec {

class Recorder {
 public:
  Recorder(int64_t rank, bool enabled, DeviceMemory* backend);

  bool enabled() const { return enabled_; }
  // Sets time zero (call right after a barrier so that ranks share it).
  void start_epoch();
  void set_step(int64_t step) {
    resolve();
    step_ = step;
  }
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

  // Records `event` from construction to destruction. `drain`: the end waits for all the
  // backend's work, on every stream (an asynchronous collective launched inside the scope is
  // timed to its completion; it no longer overlaps while tracing).
  class Scope {
   public:
    Scope(Recorder* recorder, Event event, bool drain);
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope();
    // The bytes the op moved, when the data decides them (SparCML's sparse unions): known only
    // once it ran.
    void set_bytes(int64_t bytes) { event_.bytes = bytes; }

   private:
    Recorder* recorder_;
    Event event_;
    bool drain_;
    std::unique_ptr<DeviceMemory::TimeMark> start_;
  };
  Scope scope(Event event, bool drain = false) {
    return Scope(enabled_ ? this : nullptr, std::move(event), drain);
  }

  // Every event recorded so far (resolves the pending marks first).
  const std::vector<spec::TraceEvent>& events() {
    resolve();
    return events_;
  }
  void clear() {
    resolve();
    events_.clear();
  }

 private:
  friend class Scope;
  struct Pending {
    Event event;
    std::unique_ptr<DeviceMemory::TimeMark> start, end;
  };
  // Turns the pending marks into trace events (waits for the last of them).
  void resolve();

  int64_t rank_;
  bool enabled_;
  DeviceMemory* backend_;
  int64_t step_ = 0;
  std::unique_ptr<DeviceMemory::TimeMark> epoch_;
  std::vector<Pending> pending_;
  std::vector<spec::TraceEvent> events_;
};

}  // namespace sextant::exec
