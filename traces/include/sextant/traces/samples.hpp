// Measurements that calibration fits: compute ops (FLOPs, bytes, time) and collectives (kind,
// group size, bytes, time), from Sextant traces, PyTorch profiler (Kineto) traces and nccl-tests
// output.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/collective.hpp"
#include "sextant/spec/trace.hpp"
#include "sextant/spec/units.hpp"

namespace sextant::traces {

struct ComputeSample {
  spec::OpClass op_class = spec::OpClass::kGemm;
  std::string name;  // as the calibrated efficiency table keys it (efficiency_key)
  double flops = 0;
  int64_t bytes = 0;
  double seconds = 0;
  // The ranks of the run it was measured in (a trace's "ranks"): how many devices computed beside
  // it, which a device's co_run slowdown (DeviceSpec::co_run) says the cost of.
  int64_t run_ranks = 1;
};

struct CommSample {
  spec::CollectiveKind collective = spec::CollectiveKind::kAllReduce;
  int64_t ranks = 0;
  int64_t bytes = 0;  // nccl-tests size convention
  double seconds = 0;
  // Seen inside a training run: the time of the member that arrived last (it waited for nobody),
  // what training pays (caches cold from the compute before it), not what a benchmark loop sees.
  bool in_training = false;
};

// One measured training run's step, split into what its ops and transfers explain and the rest.
struct StepSample {
  std::string source;
  double step_s = 0;  // mean measured step time (the first step left out)
  // Of the rank with the least unexplained time: the mean time per step covered by at least one
  // op or transfer on any of its streams (their union, so overlap counts once).
  double busy_s = 0;
  double host_s() const { return step_s - busy_s; }
};

// One collective of a measured training run as its members reached it: how far the last arrival
// came after the members' mean arrival, and the members' mean time since their previous
// collective (the compute whose variation made them arrive apart).
struct SyncSample {
  std::string source;  // the trace (one training run) it came from
  int64_t ranks = 0;
  double spread_s = 0;   // last arrival - mean arrival
  double segment_s = 0;  // mean time since each member's previous collective ended
};

struct Samples {
  std::vector<ComputeSample> compute;
  std::vector<SyncSample> sync;
  std::vector<CommSample> comm;
  std::vector<StepSample> steps;
  std::vector<std::string> sources;  // files read
  // What the readers left out and why, one line each, naming the file: said where they are fitted.
  std::vector<std::string> warnings;
  // The files whose compute ops ran on a known kind of device (a profiler trace with GPU kernels,
  // or with CPU ops only): calibration refuses to fit one kind's times into the other's file.
  std::map<std::string, spec::DeviceKind> ran_on;
  void append(const Samples& other);
};

// From a Sextant trace: the collectives of a measured training run as their last member saw them
// (comm, in_training) and their arrival spreads of the collectives of a measured training run whose
// members all appear in it (sync); the step sample of a measured training run (metadata
// step_time_s); the compute ops of the critical rank (the one with the most compute time: it sets
// the step time) with their FLOPs or bytes, leaving out the first of several steps (it warms up);
// collectives from benchmark traces (metadata "bench": "comm") only: in a training trace a
// collective's time also holds the wait for the slowest member.
Samples samples_from_trace(const spec::Trace& trace, const std::string& source);

}  // namespace sextant::traces
