// Drivers of the micro-benchmarks.
#include "sextant/exec/bench_main.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <utility>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "sextant/exec/cpu_backend.hpp"
#include "sextant/exec/cuda_backend.hpp"
#include "sextant/exec/host_allocator.hpp"
#include "sextant/spec/build_info.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::exec {

namespace {

spec::Json comm_rows_json(const std::vector<CommRow>& rows) {
  spec::Json j = spec::Json::array();
  for (const CommRow& r : rows)
    j.push_back({{"collective", spec::enum_name(spec::collective_kind_names(), r.collective)},
                 {"ranks", r.ranks},
                 {"bytes", r.bytes},
                 {"time_s", r.time_s},
                 {"algbw_GBps", r.algbw_GBps},
                 {"busbw_GBps", r.busbw_GBps}});
  return j;
}

// nccl-tests' layout (doc/PERFORMANCE.md): rank lines, the column header, one row per size with
// out-of-place and in-place figures (the same measurement here: MPI collectives run in place).
void write_nccl_tests(const std::string& prefix, const std::vector<CommRow>& rows,
                      CommKind transport) {
  const bool cpu = transport == CommKind::kMpi;
  std::map<std::pair<spec::CollectiveKind, int64_t>, std::vector<CommRow>> blocks;
  for (const CommRow& r : rows) blocks[{r.collective, r.ranks}].push_back(r);
  std::map<spec::CollectiveKind, std::string> text;
  for (const auto& [key, list] : blocks) {
    const std::string name(spec::enum_name(spec::collective_kind_names(), key.first));
    std::string& t = text[key.first];
    if (!t.empty()) continue;  // one group size per file: the first (smallest) measured
    t += fmt::format("# {}_perf (sextant bench comm, {} collectives, nccl-tests layout)\n", name,
                     comm_kind_name(transport));
    t += "#\n# Using devices\n";
    for (int64_t r = 0; r < key.second; ++r)
      t += fmt::format("#  Rank {:2} Group  0 Pid {:6} on localhost device {:2} [{}] {}\n", r, r,
                       cpu ? 0 : r, cpu ? "cpu" : "gpu", cpu ? "CPU" : "GPU");
    t += "#\n#                                                              out-of-place           "
         "            in-place\n";
    t += "#       size         count      type   redop    root     time   algbw   busbw #wrong     "
         "time   algbw   busbw #wrong\n";
    t += "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            "
         "(us)  (GB/s)  (GB/s)\n";
    for (const CommRow& r : list) {
      t += fmt::format(
          "{:>12} {:>13}     float     sum      -1 {:8.2f} {:7.2f} {:7.2f}      0 {:8.2f} {:7.2f} "
          "{:7.2f}      0\n",
          r.bytes, r.bytes / 4, r.time_s * 1e6, r.algbw_GBps, r.busbw_GBps, r.time_s * 1e6,
          r.algbw_GBps, r.busbw_GBps);
    }
  }
  for (const auto& [kind, t] : text)
    spec::write_file_atomically(
        prefix + std::string(spec::enum_name(spec::collective_kind_names(), kind)) + "_perf.txt",
        t);
}

void write_trace(const std::string& path, std::vector<spec::TraceEvent> events,
                 const std::string& bench, const std::string& backend) {
  spec::Trace t;
  t.kind = "measured";
  t.events = std::move(events);
  t.metadata = {{"bench", bench}, {"backend", backend}, {"commit", spec::git_commit()}};
  spec::write_trace_file(path, t);
}

// The first of `outputs` (flag, path) that cannot be written, as InputError, before any
// measurement: the bench once ran its minutes and then failed on the path.
void check_outputs(const std::vector<std::pair<const char*, std::string>>& outputs) {
  for (const auto& [flag, path] : outputs) {
    if (path.empty()) continue;
    if (std::string why = spec::unwritable_reason(path); !why.empty())
      throw InputError("command line", flag, path, why);
  }
}

}  // namespace

int run_comm_bench(const CommBenchJob& job) {
  keep_freed_host_memory();
  MPI_Init(nullptr, nullptr);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int status = 0;
  try {
    CommKind kind = CommKind::kMpi;
    std::unique_ptr<Backend> backend = make_backend(job.backend, job.comm_choice, Precision::kFp32,
                                                    job.json, MPI_COMM_WORLD, kind);
    // Every rank checks the paths rank 0 will write (same answer on one node; on several, rank
    // 0's is the one that matters and any rank's refusal ends the job).
    check_outputs({{"--out", job.json_file},
                   {"--trace", job.trace_file},
                   {"--nccl-tests", job.nccl_tests_prefix.empty()
                                        ? std::string()
                                        : job.nccl_tests_prefix + "all_reduce_perf.txt"}});
    CommBenchOptions options = job.options;
    options.transport = std::string(comm_kind_name(kind));
    std::vector<CommRow> rows;
    std::vector<spec::TraceEvent> events;
    // Groups of 2, 4, ... ranks; a single rank measures its group of one (the plumbing: NCCL on
    // one GPU copies, MPI returns).
    for (int group = size == 1 ? 1 : 2; group <= size; group *= 2) {
      // Contiguous blocks of `group` ranks; the first block reports.
      MPI_Comm split = MPI_COMM_NULL;
      MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank / group, rank, &split));
      std::unique_ptr<Communicator> comm = make_communicator(kind, split, "bench");
      if (rank / group * group + group <= size) {
        std::vector<CommRow> r =
            bench_comm(*comm, *backend, options, 0, rank == 0 ? &events : nullptr);
        if (rank == 0) rows.insert(rows.end(), r.begin(), r.end());
      }
      MPI_Barrier(MPI_COMM_WORLD);
    }
    if (rank == 0) {
      if (job.json) {
        std::cout << spec::Json{{"schema", "sextant.bench_comm/1"}, {"rows", comm_rows_json(rows)}}
                         .dump(2)
                  << "\n";
      } else {
        fmt::print("{:<15} {:>6} {:>12} {:>12} {:>12} {:>12}\n", "collective", "ranks", "bytes",
                   "time_us", "algbw_GBps", "busbw_GBps");
        for (const CommRow& r : rows)
          fmt::print("{:<15} {:>6} {:>12} {:>12.2f} {:>12.3f} {:>12.3f}\n",
                     spec::enum_name(spec::collective_kind_names(), r.collective), r.ranks, r.bytes,
                     r.time_s * 1e6, r.algbw_GBps, r.busbw_GBps);
      }
      if (!job.json_file.empty())
        spec::write_json_file(job.json_file,
                              {{"schema", "sextant.bench_comm/1"}, {"rows", comm_rows_json(rows)}});
      if (!job.trace_file.empty())
        write_trace(job.trace_file, events, "comm", std::string(comm_kind_name(kind)));
      if (!job.nccl_tests_prefix.empty()) write_nccl_tests(job.nccl_tests_prefix, rows, kind);
    }
    if (size < 2 && rank == 0)
      fmt::print(stderr,
                 "one rank: a group of one measures the plumbing only (mpirun -np 2, or --np 2)\n");
  } catch (const InputError& e) {
    if (rank == 0) fmt::print(stderr, "error: {}\n", e.what());
    status = 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "[rank {}] error: {}\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}

int run_compute_bench(ComputeBenchJob job) {
  std::unique_ptr<Backend> be;
  if (job.backend == BackendKind::kCuda) {
    if (cuda_device_count() == 0)
      throw InputError("command line", "--backend", "cuda",
                       "a usable GPU, but " + cuda_unavailable_reason());
    be = make_cuda_backend(0, job.precision.value_or(Precision::kBf16));
    const int iterations = job.options.iterations;  // --iterations raises the GPU default
    job.options = gpu_compute_bench();
    job.options.iterations = std::max(iterations, job.options.iterations);
  } else {
    be = make_cpu_backend(job.precision.value_or(Precision::kFp32));
  }
  check_outputs({{"--trace", job.trace_file}});
  std::vector<spec::TraceEvent> events;
  std::vector<ComputeRow> rows = bench_compute(*be, job.options, &events);
  if (job.json) {
    spec::Json j = spec::Json::array();
    for (const ComputeRow& r : rows)
      j.push_back({{"op", r.op},
                   {"shape", r.shape},
                   {"flops", r.flops},
                   {"bytes", r.bytes},
                   {"time_s", r.time_s},
                   {"tflops", r.tflops},
                   {"GBps", r.GBps}});
    std::cout << spec::Json{{"schema", "sextant.bench_compute/1"}, {"rows", j}}.dump(2) << "\n";
  } else {
    fmt::print("{:<10} {:<18} {:>12} {:>10} {:>9} {:>9}\n", "op", "shape", "flops", "time_us",
               "GFLOP/s", "GB/s");
    for (const ComputeRow& r : rows)
      fmt::print("{:<10} {:<18} {:>12.3g} {:>10.2f} {:>9.2f} {:>9.2f}\n", r.op,
                 fmt::format("{}", fmt::join(r.shape, "x")), r.flops, r.time_s * 1e6,
                 r.tflops * 1e3, r.GBps);
  }
  if (!job.trace_file.empty()) write_trace(job.trace_file, events, "compute", be->name());
  return 0;
}

int run_attention_bench(const AttentionBenchJob& job) {
  const std::vector<AttentionRow> rows = bench_attention(job.options);
  if (job.json) {
    spec::Json j = spec::Json::array();
    for (const AttentionRow& r : rows)
      j.push_back({{"head_dim", r.head_dim},
                   {"seq_len", r.seq_len},
                   {"causal", r.causal},
                   {"pass", r.backward ? "bwd" : "fwd"},
                   {"flops", r.flops},
                   {"time_s", r.time_s},
                   {"tflops", r.tflops}});
    spec::AttentionKernelData data;
    data.curves = attention_curves(rows);
    data.source = "sextant bench attention: the CPU executor's blockwise flash kernels, " +
                  std::to_string(job.options.heads) + " heads, " +
                  std::to_string(job.options.tokens) + " tokens per call, fp32";
    const std::map<spec::AttentionKernel, spec::AttentionKernelData> kernels{
        {spec::AttentionKernel::kFlash2, data}};
    std::cout << spec::Json{{"schema", "sextant.bench_attention/1"},
                            {"rows", j},
                            {"attention_kernels", spec::to_json(kernels)}}
                     .dump(2)
              << "\n";
  } else {
    fmt::print("{:>8} {:>8} {:>7} {:>4} {:>12} {:>10} {:>9}\n", "head_dim", "seq_len", "mask",
               "pass", "flops", "time_us", "GFLOP/s");
    for (const AttentionRow& r : rows)
      fmt::print("{:>8} {:>8} {:>7} {:>4} {:>12.3g} {:>10.1f} {:>9.2f}\n", r.head_dim, r.seq_len,
                 r.causal ? "causal" : "dense", r.backward ? "bwd" : "fwd", r.flops, r.time_s * 1e6,
                 r.tflops * 1e3);
  }
  return 0;
}

}  // namespace sextant::exec
