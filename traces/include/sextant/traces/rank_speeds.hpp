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

// How much slower each run of a set computed than the set's fastest, one speed reference across
// the set's plans (issue 63): a run's slowdown is its slowest rank's time in its compute ops over
// the least mean time any run of the set took for the same ops, minus 1. An op is the same where
// its name, pass, class, shape and dtype are, in a run of as many ranks, and beside another rank's
// compute or alone (a core computes slower while another computes: DeviceSpec::co_run; a pipeline
// stage computes alone in its bubbles). Plans that share no op with the others are compared with
// their own runs only. On the 2-core CI VM the runs of one plan fell in two speeds ~25% apart
// while the cores were disturbed; divided by this, they agreed within 2-21%
// (bench/results/calibration_local.md). `first_steps[i]` is run i's first step after the warm-up.
// A trace of no compute ops has slowdown 0.
std::vector<double> slowdowns_against_fastest(const std::vector<const spec::Trace*>& runs,
                                              const std::vector<int64_t>& first_steps);

// How steady the cores were through one run: per step from `first_step`, the most any rank's
// compute ops took over that rank's least in any of those steps, minus 1. Every step runs the
// same ops, so a step that computed longer ran on slower cores, whatever the model predicted: the
// demo's local run of 2026-12-03 logged 105-113 ms for its steps 1-3, then mostly 120-133 ms,
// a rank's compute 5-25% above its fastest step in 26 of the 28 steps after the warm-up
// (traces/samples/run-gpt-tiny-dp2-slow-spell.json.gz).
// Steps with no compute op on a rank leave that rank out; empty when the trace has none.
std::map<int64_t, double> step_slowdowns(const spec::Trace& trace, int64_t first_step);

}  // namespace sextant::traces
