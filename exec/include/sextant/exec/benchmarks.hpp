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
#include "sextant/spec/device_models.hpp"
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

// The CPU executor's blockwise flash attention (blockwise_attention.hpp: ring attention's
// steps) over sequence lengths: forward and backward, causal (one sequence's own block) and dense
// (a block of earlier keys, ring attention's later steps), timed per call and counted as
// models::flash_attention_executed_flops counts. What a cluster file's attention curves hold,
// so that `simulate` can price the executor's ring attention (AttentionRow -> attention_curves).
struct AttentionRow {
  int64_t head_dim = 0;
  int64_t seq_len = 0;  // query rows and key rows of the block
  bool causal = false;
  bool backward = false;
  double flops = 0;   // executed, per call
  double time_s = 0;  // mean per call
  double tflops = 0;
};

struct AttentionBenchOptions {
  std::vector<int64_t> seq_lens = {128, 256, 512, 1024};
  std::vector<int64_t> head_dims = {64};
  int64_t heads = 4;
  int64_t tokens = 2048;  // batch * seq_len per call (at least one sequence)
  int warmup = 1;
  int iterations = 5;
};

std::vector<AttentionRow> bench_attention(const AttentionBenchOptions& options);

// The rows as a cluster file's curves: one per (head_dim, mask, pass), over sequence length.
std::vector<spec::AttentionCurve> attention_curves(const std::vector<AttentionRow>& rows);

}  // namespace sextant::exec
