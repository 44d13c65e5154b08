// Communication and compute micro-benchmarks.
#include "sextant/exec/benchmarks.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>

namespace sextant::exec {

using Clock = std::chrono::steady_clock;

double bus_bandwidth_factor(spec::CollectiveKind kind, int64_t ranks) {
  const double n = static_cast<double>(ranks);
  switch (kind) {
    case spec::CollectiveKind::kAllReduce:
      return 2 * (n - 1) / n;
    case spec::CollectiveKind::kReduceScatter:
    case spec::CollectiveKind::kAllGather:
    case spec::CollectiveKind::kAllToAll:
      return (n - 1) / n;
    case spec::CollectiveKind::kBroadcast:
    case spec::CollectiveKind::kReduce:
    case spec::CollectiveKind::kSendRecv:
      return 1;
  }
  return 1;
}

namespace {

// Inputs of uniform values in [-1, 1) from a fixed-seed generator. Constant or zero inputs time
// faster than real data: on an H200 an 8192^3 bf16 GEMM ran 894 TFLOP/s on zeros against 788 on
// random data (device tool KINDS.md, 2026-10-28); this bench on constant inputs reported 886
// there (bench/results/gpu_h200.md).
void fill_random(Backend& be, Tensor& t, uint32_t seed) {
  std::vector<float> host(static_cast<size_t>(t.numel()));
  uint64_t state = 0x9E3779B97F4A7C15ull * (seed + 1);
  for (float& v : host) {  // SplitMix64 (Steele et al. 2014), top 24 bits
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    v = static_cast<float>(z >> 40) / static_cast<float>(1 << 23) - 1.0f;
  }
  be.from_host(host, t);
}

spec::OpClass op_class_of(spec::CollectiveKind k) {
  switch (k) {
    case spec::CollectiveKind::kAllReduce:
      return spec::OpClass::kAllReduce;
    case spec::CollectiveKind::kReduceScatter:
      return spec::OpClass::kReduceScatter;
    case spec::CollectiveKind::kAllGather:
      return spec::OpClass::kAllGather;
    case spec::CollectiveKind::kBroadcast:
      return spec::OpClass::kBroadcast;
    case spec::CollectiveKind::kReduce:
      return spec::OpClass::kReduce;
    case spec::CollectiveKind::kAllToAll:
      return spec::OpClass::kAllToAll;
    case spec::CollectiveKind::kSendRecv:
      return spec::OpClass::kSend;
  }
  return spec::OpClass::kAllReduce;
}

}  // namespace

std::vector<CommRow> bench_comm(Communicator& comm, Backend& be, const CommBenchOptions& o,
                                int64_t trace_rank, std::vector<spec::TraceEvent>* events) {
  std::vector<CommRow> rows;
  const int64_t n = comm.size();
  for (spec::CollectiveKind kind : o.collectives) {
    if (kind == spec::CollectiveKind::kSendRecv && n != 2) continue;  // a pair of ranks
    for (int64_t bytes : o.sizes) {
      // Element counts per rank as nccl-tests sizes them.
      const bool whole_array =
          kind == spec::CollectiveKind::kReduceScatter || kind == spec::CollectiveKind::kAllGather;
      int64_t count = std::max<int64_t>(1, bytes / 4);
      if (whole_array) count = std::max<int64_t>(n, count - count % n);
      const int64_t block = whole_array ? count / n : count;
      Tensor a = be.zeros({count}), b = be.zeros({count});  // zeros: repeated sums never overflow
      auto once = [&] {
        switch (kind) {
          case spec::CollectiveKind::kAllReduce:
            comm.all_reduce(a.data(), count);
            break;
          case spec::CollectiveKind::kReduceScatter:
            comm.reduce_scatter(a.data(), b.data(), block);
            break;
          case spec::CollectiveKind::kAllGather:
            comm.all_gather(a.data(), b.data(), block);
            break;
          case spec::CollectiveKind::kBroadcast:
            comm.broadcast(a.data(), count, 0);
            break;
          case spec::CollectiveKind::kSendRecv:
            if (comm.rank() == 0) {
              comm.send(a.data(), count, 1, 7)->wait();
            } else {
              comm.recv(b.data(), count, 0, 7);
            }
            break;
          default:
            break;
        }
      };
      for (int i = 0; i < o.warmup; ++i) once();
      be.synchronize();
      comm.barrier();
      std::vector<double> times;
      auto t_all = Clock::now();
      for (int i = 0; i < o.iterations; ++i) {
        auto t0 = Clock::now();
        once();
        be.synchronize();  // NCCL returns once the collective is queued
        auto t1 = Clock::now();
        times.push_back(std::chrono::duration<double>(t1 - t0).count());
        if (events != nullptr && comm.rank() == trace_rank) {
          spec::TraceEvent e;
          e.name = std::string(spec::enum_name(spec::collective_kind_names(), kind));
          e.op_class = op_class_of(kind);
          e.rank = trace_rank;
          e.stream = spec::Stream::kDpComm;
          e.start_ps =
              std::chrono::duration_cast<std::chrono::nanoseconds>(t0 - t_all).count() * 1000;
          e.duration_ps =
              std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count() * 1000;
          e.bytes = count * 4;
          e.group_size = n;
          e.algorithm = o.transport;
          e.dtype = spec::Dtype::kFp32;
          events->push_back(e);
        }
      }
      double mean =
          std::accumulate(times.begin(), times.end(), 0.0) / static_cast<double>(times.size());
      // The slowest rank's mean, as every rank reports it.
      std::vector<float> m = {static_cast<float>(mean)};
      comm.all_reduce_max_host(m.data(), 1);
      CommRow row;
      row.collective = kind;
      row.ranks = n;
      row.bytes = count * 4;
      row.time_s = m[0];
      row.time_s = std::max(row.time_s, 1e-9);  // a group of one can return within a tick
      row.algbw_GBps = static_cast<double>(row.bytes) / row.time_s / 1e9;
      row.busbw_GBps = row.algbw_GBps * bus_bandwidth_factor(kind, n);
      rows.push_back(row);
    }
  }
  return rows;
}

ComputeBenchOptions default_compute_bench() {
  ComputeBenchOptions o;
  for (int64_t s : {32, 64, 128, 256, 512}) o.gemms.push_back({s, s, s});
  // Shapes of small transformer layers: tokens x (3h, 4h, h) x h.
  for (int64_t h : {128, 256}) {
    o.gemms.push_back({256, 3 * h, h});
    o.gemms.push_back({256, 4 * h, h});
    o.gemms.push_back({512, h, 4 * h});
  }
  o.elementwise_sizes = {1 << 12, 1 << 15, 1 << 18, 1 << 21};
  return o;
}

ComputeBenchOptions gpu_compute_bench() {
  ComputeBenchOptions o;
  for (int64_t s : {512, 1024, 2048, 4096, 8192}) o.gemms.push_back({s, s, s});
  // GPT-2 124M with 8 x 1024 tokens: qkv, proj, fc1, fc2 and the tied output layer.
  const int64_t tokens = 8192, h = 768;
  o.gemms.push_back({tokens, 3 * h, h});
  o.gemms.push_back({tokens, h, h});
  o.gemms.push_back({tokens, 4 * h, h});
  o.gemms.push_back({tokens, h, 4 * h});
  o.gemms.push_back({tokens, 50304, h});
  o.elementwise_sizes = {1 << 16, 1 << 20, 1 << 24, 1 << 26};
  o.warmup = 5;
  o.iterations = 20;
  return o;
}

std::vector<ComputeRow> bench_compute(Backend& be, const ComputeBenchOptions& o,
                                      std::vector<spec::TraceEvent>* events) {
  std::vector<ComputeRow> rows;
  // Activations and weights in the backend's activation type (bf16 in mixed precision), as the
  // trainer runs them; statistics stay fp32.
  const DType act = be.activation_dtype();
  const int64_t esize = element_size(act);
  auto start = Clock::now();
  auto time_it = [&](ComputeRow row, const std::function<void()>& fn) {
    for (int i = 0; i < o.warmup; ++i) fn();
    be.synchronize();
    double total = 0;
    for (int i = 0; i < o.iterations; ++i) {
      auto t0 = Clock::now();
      fn();
      be.synchronize();
      auto t1 = Clock::now();
      total += std::chrono::duration<double>(t1 - t0).count();
      if (events != nullptr) {
        spec::TraceEvent e;
        e.name = row.op;
        e.op_class = row.op_class;
        e.start_ps =
            std::chrono::duration_cast<std::chrono::nanoseconds>(t0 - start).count() * 1000;
        e.duration_ps =
            std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count() * 1000;
        e.flops = row.flops;
        e.bytes = row.bytes;
        e.shape = row.shape;
        e.dtype = act == DType::kBF16 ? spec::Dtype::kBf16 : spec::Dtype::kFp32;
        events->push_back(e);
      }
    }
    row.time_s = total / o.iterations;
    row.tflops = row.flops / row.time_s / 1e12;
    row.GBps = static_cast<double>(row.bytes) / row.time_s / 1e9;
    rows.push_back(row);
  };
  for (const std::vector<int64_t>& g : o.gemms) {
    const int64_t m = g[0], n = g[1], k = g[2];
    Tensor x = be.zeros({m, k}, act), w = be.zeros({k, n}, act), y = be.zeros({m, n}, act);
    fill_random(be, x, 1);
    fill_random(be, w, 2);
    ComputeRow row;
    row.op = "gemm";
    row.shape = {m, n, k};
    row.flops = 2.0 * static_cast<double>(m * n * k);
    row.bytes = (m * k + k * n + m * n) * esize;
    time_it(row, [&] { be.matmul(x, w, nullptr, y); });
  }
  for (int64_t size : o.elementwise_sizes) {
    const int64_t cols = 256, r = size / cols;
    Tensor x = be.zeros({r, cols}, act), y = be.zeros({r, cols}, act);
    fill_random(be, x, 3);
    ComputeRow gelu;
    gelu.op = "gelu";
    gelu.op_class = spec::OpClass::kElementwise;
    gelu.shape = {r, cols};
    gelu.bytes = 2 * size * esize;
    time_it(gelu, [&] { be.gelu(x, y); });
    ComputeRow add = gelu;
    add.op = "add";
    add.bytes = 3 * size * esize;
    time_it(add, [&] { be.add(x, x, y); });
    Tensor g = be.zeros({cols}, act), b = be.zeros({cols}, act), mean = be.zeros({r}),
           rstd = be.zeros({r});
    be.fill(g, 1.0f);
    ComputeRow ln = gelu;
    ln.op = "layernorm";
    ln.op_class = spec::OpClass::kNorm;
    time_it(ln, [&] { be.layernorm(x, g, b, y, mean, rstd); });
  }
  return rows;
}

}  // namespace sextant::exec
