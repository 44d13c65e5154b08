// `sextant bench comm|compute` on MPI ranks / one process: tables, JSON and calibration traces.
#pragma once

#include <string>
#include <vector>

#include "sextant/exec/benchmarks.hpp"
#include "sextant/exec/runner.hpp"

namespace sextant::exec {

struct CommBenchJob {
  CommBenchOptions options;
  bool json = false;
  std::string trace_file;
  std::string json_file;
  // Also write the rows of each collective in nccl-tests' text layout, to PREFIX<kind>_perf.txt.
  std::string nccl_tests_prefix;
  // cpu: MPI on host buffers; cuda: device buffers over NCCL (or MPI staged through the host).
  BackendKind backend = BackendKind::kCpu;
  std::optional<CommKind> comm_choice;
};

// Initialises MPI; benchmarks groups of 2, 4, ... contiguous ranks (a group of one on one rank);
// rank 0 prints and writes. Returns the exit status.
int run_comm_bench(const CommBenchJob& job);

struct ComputeBenchJob {
  ComputeBenchOptions options = default_compute_bench();  // cuda: gpu_compute_bench() instead
  bool json = false;
  std::string trace_file;
  BackendKind backend = BackendKind::kCpu;
  std::optional<Precision> precision;  // unset: the backend's default
};

// Throws InputError when the backend cannot run here (no GPU).
int run_compute_bench(ComputeBenchJob job);

struct AttentionBenchJob {
  AttentionBenchOptions options;
  bool json = false;  // rows and the cluster file's attention_kernels entry
};

// The CPU executor's blockwise flash kernels (bench_attention); prints a table, or JSON with an
// "attention_kernels" object ready for a cluster file (flash2: the kernel the executor's ring
// attention stands for).
int run_attention_bench(const AttentionBenchJob& job);

}  // namespace sextant::exec
