// Micro-benchmarks that produce calibration input. Communication follows nccl-tests: warm-up
// iterations, timed iterations, time per collective, algorithm bandwidth (bytes / time) and bus
// bandwidth (algbw * a factor that makes it comparable with the link bandwidth, docs/METRICS.md).
// Computation times GEMMs over shapes and the memory-bound ops over sizes. Both return rows and
// trace events in the shared schema for `sextant calibrate`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sextant/exec/backend.hpp"
#include "sextant/exec/communicator.hpp"
#include "sextant/spec/collective.hpp"
#include "sextant/spec/trace.hpp"

namespace sextant::exec {

// nccl-tests busbw factors: all-reduce 2(n-1)/n; reduce-scatter, all-gather, all-to-all (n-1)/n;
// broadcast, reduce, send/recv 1.
double bus_bandwidth_factor(spec::CollectiveKind kind, int64_t ranks);

struct CommRow {
  spec::CollectiveKind collective = spec::CollectiveKind::kAllReduce;
  int64_t ranks = 0;
  int64_t bytes = 0;  // nccl-tests size: the buffer (all-reduce) or the whole array
  double time_s = 0;  // mean per iteration, the slowest rank
  double algbw_GBps = 0;
  double busbw_GBps = 0;
};

struct CommBenchOptions {
  std::vector<int64_t> sizes;  // bytes
  int warmup = 5;
  int iterations = 20;
  std::vector<spec::CollectiveKind> collectives = {
      spec::CollectiveKind::kAllReduce, spec::CollectiveKind::kReduceScatter,
      spec::CollectiveKind::kAllGather, spec::CollectiveKind::kBroadcast,
      spec::CollectiveKind::kSendRecv};
  std::string transport = "mpi";  // recorded as each event's algorithm: mpi, mpi-staged, nccl
};

// Collective over `comm` on buffers of `backend` (host memory for MPI, device memory for NCCL):
// every rank runs the same sizes; rows are identical on every rank. Events: one per timed
// collective (rank `trace_rank`'s), with bytes, group size and collective class.
std::vector<CommRow> bench_comm(Communicator& comm, Backend& backend,
                                const CommBenchOptions& options, int64_t trace_rank,
                                std::vector<spec::TraceEvent>* events);

struct ComputeRow {
  std::string op;  // "gemm" or the memory-bound op name
  spec::OpClass op_class = spec::OpClass::kGemm;
  std::vector<int64_t> shape;
  double flops = 0;
  int64_t bytes = 0;
  double time_s = 0;  // mean per call
  double tflops = 0;
  double GBps = 0;
};

struct ComputeBenchOptions {
  std::vector<std::vector<int64_t>> gemms;  // {m, n, k}
  std::vector<int64_t> elementwise_sizes;   // elements
  int warmup = 2;
  int iterations = 10;
};
ComputeBenchOptions default_compute_bench();  // CPU-sized shapes
ComputeBenchOptions gpu_compute_bench();      // H100-sized shapes (up to 8192^3, GPT-2 layers)

std::vector<ComputeRow> bench_compute(Backend& backend, const ComputeBenchOptions& options,
                                      std::vector<spec::TraceEvent>* events);

}  // namespace sextant::exec
