// How fast each host core runs right now, alone: a check that the machine is undisturbed before
// and after a measurement (scripts/calibrate-local.sh). On the shared 2-core CI VM one core
// sometimes runs 10-100% slower for tens of seconds (a busy neighbour on the host), and a
// two-rank run measured then is as slow as its slow core: the calibration loop fitted and judged
// such runs as if they were the machine (docs/CALIBRATION.md).
#pragma once

#include <string>
#include <vector>

namespace sextant::exec {

struct CoreSpeed {
  int cpu = 0;
  double multiply_add_s = 0;   // independent fp32 multiply-adds over an L1-resident array
  double pointer_chase_s = 0;  // dependent loads with branches over an L2-resident array
  // The multiply-adds while every core runs them at once (0: not measured). Each core can be fast
  // alone while two together are slow: in one demo run the VM's two cores passed every check alone
  // while the two-rank plans ran 1.8x slow for two rounds (130 against 72 ms, steady within each
  // run), as hardware threads of one physical core would.
  double together_s = 0;
};

// The CPUs this process may run on (its affinity mask).
std::vector<int> allowed_cpus();

// Each CPU the process may run on, the calling thread pinned to it in turn (its affinity restored
// after), the best of `repeats` timings of two fixed kernels (~3 and ~4 ms on a 3.45 GHz Zen 5
// core), then the multiply-adds on every CPU at once. Two kinds, because disturbances differ: one
// slowed the dependent, branchy kernel 24% and the multiply-adds 3%; others slowed the
// multiply-adds 40-100%.
std::vector<CoreSpeed> probe_cores(int repeats = 3);

// Whether every core ran within `tolerance` of the fastest times seen so far, per kernel (the
// cores are alike: the fastest any of them ever ran is what an undisturbed one runs). `best`
// holds those times (0: none yet) and takes the faster ones of `speeds` first.
struct CoreVerdict {
  bool quiet = true;
  int slowest_cpu = -1;     // the core furthest above the best time, -1 when there is none
  double slowdown = 0;      // its time over the best, minus 1
  std::string description;  // "cpu 0: pointer chase 5.35 ms, 25% above the best 4.28 ms"
};
CoreVerdict judge_cores(const std::vector<CoreSpeed>& speeds, CoreSpeed& best, double tolerance);

// How much slower a core computes while the other cores compute too (DeviceSpec::co_run): two
// kernels of the executor's kind, a GEMM (Eigen, 512 x 128 by 128 x 384 fp32: gpt-tiny's QKV at
// micro-batch 4) and a streaming add over 256 KiB arrays (one of its activations), timed on each
// core alone and then on every core at once (one pinned thread each, started together). Best of
// `repeats` for each, alone and together in turn, so that a passing disturbance slows neither
// figure; each slowdown is the cores' mean time together over their mean time alone.
struct CoRunProbe {
  int cores = 0;  // run at once
  double matrix_alone_s = 0, matrix_together_s = 0;
  double memory_alone_s = 0, memory_together_s = 0;
  // What one timing of each kernel does: the GEMM's FLOPs, the streaming add's bytes read and
  // written (three 256 KiB arrays per pass: data a core holds in its L2).
  double matrix_flops = 0, memory_bytes = 0;
  double matrix_slowdown() const { return matrix_together_s / matrix_alone_s; }
  double memory_slowdown() const { return memory_together_s / memory_alone_s; }
  // A core alone, in FLOP/s and bytes/s (the cores' mean of their best timings).
  double matrix_alone_rate() const { return matrix_flops / matrix_alone_s; }
  double memory_alone_rate() const { return memory_bytes / memory_alone_s; }
};
CoRunProbe probe_co_run(int repeats = 5);

}  // namespace sextant::exec
