// How fast the cores of a run computed, from its measured trace, by two comparisons: the ranks
// against each other over the compute ops every rank ran (one name, pass, class, shape and
// dtype, each weighted alike on every rank), and the fastest rank against the fastest runs of
// the same ops seen before. The ranks of a plan run these ops on cores of one kind, so a rank that
// took longer ran on a slower core, and a run whose every rank took longer than the ops have run
// ran on slow cores. On the shared 2-core CI VM one vCPU or both at times compute 10-30% slower
// for a whole run, steady within it, and the run's step is as slow as its slowest rank: runs of
// gpt-tiny dp2.z2.mb8 measured 69-78 ms with their ranks 0-9.3% apart, 77-89 ms with one rank
// 10.1-28.6% behind, and 80-84 ms with both 15-20% slower than before
// (bench/results/slow_cores.md).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sextant/spec/trace.hpp"

namespace sextant::traces {

struct RankSpeeds {
  std::vector<double> compute_s;  // per rank: its time in the ops every rank ran
  int64_t shared_ops = 0;         // distinct ops every rank ran (0: no comparison possible)
  // The slowest rank's time over the fastest's, minus 1 (0 with fewer than two ranks or no
  // shared op).
  double spread() const;
  int64_t slowest_rank() const;
  int64_t fastest_rank() const;
};

// Over the events of steps `first_step` and later (the warm-up rule's steps); communication ops
// are left out, since their time holds the waits for the slowest rank.
RankSpeeds rank_speeds(const spec::Trace& trace, int64_t first_step);

// The least mean time each compute op took on a rank of the runs shown so far, per rank count
// (a core computes slower while the others compute too: DeviceSpec::co_run).
class OpSpeedRecord {
 public:
  struct Verdict {
    // The fastest rank's time in the ops the record holds over the record's times for them
    // (each op at the rank's count), minus 1: how much slower than before its cores computed.
    double slowdown = 0;
    double covered = 0;  // the share of that rank's compute time those ops make (0: none known)
  };
  // Judges the run (steps `first_step` and later) against the runs shown before, then records
  // its ops' times where faster.
  Verdict judge_then_record(const spec::Trace& trace, int64_t first_step);

 private:
  std::map<std::string, double> fastest_s_;
};

}  // namespace sextant::traces
