// `sextant bench attention`: the blockwise flash kernels of the CPU executor, timed.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <tuple>

#include "sextant/exec/benchmarks.hpp"
#include "sextant/exec/blockwise_attention.hpp"
#include "sextant/exec/cpu_backend.hpp"
#include "sextant/models/flash_flops.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {

namespace {

using Clock = std::chrono::steady_clock;

void fill_uniform(Tensor& t, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  float* v = t.data();
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = u(rng);
}

// Mean seconds of `call` over `iterations` after `warmup` untimed calls.
template <typename Call>
double time_calls(int warmup, int iterations, Call&& call) {
  for (int i = 0; i < warmup; ++i) call();
  const auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) call();
  return std::chrono::duration<double>(Clock::now() - start).count() / iterations;
}

}  // namespace

std::vector<AttentionRow> bench_attention(const AttentionBenchOptions& o) {
  if (o.iterations < 1 || o.warmup < 0 || o.heads < 1 || o.tokens < 1)
    throw InputError("bench attention", "", "",
                     "iterations >= 1, warmup >= 0, heads >= 1 and tokens >= 1");
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::mt19937 rng(1234);
  std::vector<AttentionRow> rows;
  for (int64_t d : o.head_dims)
    for (int64_t s : o.seq_lens) {
      if (d < 1 || s < 1)
        throw InputError("bench attention", "", fmt::format("head_dim {}, seq_len {}", d, s),
                         "positive sizes");
      const int64_t batch = std::max<int64_t>(1, o.tokens / s);
      // Queries at positions s..2s-1 see every key of a block at 0..s-1 (dense: ring attention's
      // later steps); at 0..s-1 they see the keys up to their own (causal: the first step).
      std::vector<int32_t> later(static_cast<size_t>(s));
      for (int64_t i = 0; i < s; ++i) later[static_cast<size_t>(i)] = static_cast<int32_t>(s + i);
      for (bool causal : {true, false}) {
        const QkvLayout q{batch, s, o.heads, o.heads, d, causal ? nullptr : later.data()};
        const context::Geometry g{q, s};
        Tensor qkv = be->empty({batch * s, q.width()});
        Tensor kv = be->empty({batch * s, g.kv_width()});
        Tensor dout = be->empty({batch * s, o.heads * d});
        fill_uniform(qkv, rng);
        fill_uniform(kv, rng);
        fill_uniform(dout, rng);
        Tensor out = be->empty({batch * s, o.heads * d});
        Tensor lse = be->empty({batch, o.heads, s});
        Tensor delta = be->empty({batch, o.heads, s});
        Tensor dq = be->empty({batch * s, o.heads * d});
        Tensor dkv = be->empty({batch * s, g.kv_width()});
        const double forward =
            time_calls(o.warmup, o.iterations, [&] { blockwise::forward(qkv, kv, g, out, lse); });
        blockwise::backward_prep(out, dout, q, delta);  // attn.core_prep: an op of its own
        const double backward = time_calls(o.warmup, o.iterations, [&] {
          blockwise::backward(qkv, kv, dout, lse, delta, g, dq, dkv);
        });
        for (bool bwd : {false, true}) {
          AttentionRow r;
          r.head_dim = d;
          r.seq_len = s;
          r.causal = causal;
          r.backward = bwd;
          r.flops = models::flash_attention_executed_flops(batch * o.heads, s, s, d, causal, bwd);
          r.time_s = bwd ? backward : forward;
          r.tflops = r.flops / r.time_s / 1e12;
          rows.push_back(r);
        }
      }
    }
  return rows;
}

std::vector<spec::AttentionCurve> attention_curves(const std::vector<AttentionRow>& rows) {
  std::map<std::tuple<int64_t, bool, bool>, std::map<int64_t, double>> by_curve;
  for (const AttentionRow& r : rows)
    by_curve[{r.head_dim, r.causal, r.backward}][r.seq_len] = r.tflops;
  std::vector<spec::AttentionCurve> curves;
  for (const auto& [key, points] : by_curve) {
    const auto& [head_dim, causal, backward] = key;
    spec::AttentionCurve c;
    c.head_dim = head_dim;
    c.causal = causal;
    c.pass = backward ? "bwd" : "fwd";
    for (const auto& [seq, tflops] : points) {
      c.seq_len.push_back(static_cast<double>(seq));
      c.tflops.push_back(tflops);
    }
    curves.push_back(std::move(c));
  }
  return curves;
}

}  // namespace sextant::exec
