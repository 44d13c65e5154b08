// `sextant bench attention`'s logic (never its times): the FLOP convention, the curves a cluster
// file gets from the rows, and the refusals.
#include <gtest/gtest.h>

#include "sextant/exec/benchmarks.hpp"
#include "sextant/models/flash_flops.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {
namespace {

// FlashAttention-2 §4.1's count, by hand for b*h = 8, s = 128, d = 64: the forward is
// 4 * 8 * 128 * 128 * 64 = 33,554,432 FLOPs, a causal mask executes half (16,777,216), and the
// backward 2.5x the forward (41,943,040 causal, 83,886,080 dense).
TEST(FlashFlops, TheFlashAttentionCount) {
  EXPECT_DOUBLE_EQ(models::flash_attention_executed_flops(8, 128, 128, 64, false, false),
                   33554432.0);
  EXPECT_DOUBLE_EQ(models::flash_attention_executed_flops(8, 128, 128, 64, true, false),
                   16777216.0);
  EXPECT_DOUBLE_EQ(models::flash_attention_executed_flops(8, 128, 128, 64, true, true), 41943040.0);
  EXPECT_DOUBLE_EQ(models::flash_attention_executed_flops(8, 128, 128, 64, false, true),
                   83886080.0);
}

// One curve per (head_dim, mask, pass), its points in sequence order whatever the rows' order.
TEST(AttentionBench, RowsBecomeOneCurvePerHeadDimMaskAndPass) {
  std::vector<AttentionRow> rows;
  for (int64_t s : {256, 128})
    for (bool causal : {true, false})
      for (bool bwd : {false, true}) {
        AttentionRow r;
        r.head_dim = 64;
        r.seq_len = s;
        r.causal = causal;
        r.backward = bwd;
        r.tflops = static_cast<double>(s) / 1000 + (causal ? 0.0 : 0.5) + (bwd ? 0.25 : 0.0);
        rows.push_back(r);
      }
  const std::vector<spec::AttentionCurve> curves = attention_curves(rows);
  ASSERT_EQ(curves.size(), 4u);
  for (const spec::AttentionCurve& c : curves) {
    EXPECT_EQ(c.head_dim, 64);
    ASSERT_EQ(c.seq_len, (std::vector<double>{128, 256}));
    const double offset = (c.causal ? 0.0 : 0.5) + (c.pass == "bwd" ? 0.25 : 0.0);
    EXPECT_DOUBLE_EQ(c.tflops[0], 0.128 + offset);
    EXPECT_DOUBLE_EQ(c.tflops[1], 0.256 + offset);
  }
}

// A tiny run: every point is measured, its work is the count above, and its rate is work over
// time (whatever the time is).
TEST(AttentionBench, EveryPointIsCountedAsTheLoweringCountsIt) {
  AttentionBenchOptions o;
  o.seq_lens = {8, 16};
  o.head_dims = {4};
  o.heads = 2;
  o.tokens = 32;
  o.warmup = 0;
  o.iterations = 1;
  const std::vector<AttentionRow> rows = bench_attention(o);
  ASSERT_EQ(rows.size(), 8u);  // 2 lengths x {causal, dense} x {fwd, bwd}
  for (const AttentionRow& r : rows) {
    const int64_t batch = 32 / r.seq_len;
    EXPECT_DOUBLE_EQ(r.flops, models::flash_attention_executed_flops(
                                  batch * 2, r.seq_len, r.seq_len, 4, r.causal, r.backward));
    ASSERT_GT(r.time_s, 0);
    EXPECT_DOUBLE_EQ(r.tflops, r.flops / r.time_s / 1e12);
  }
}

TEST(AttentionBench, BadOptionsAreRefused) {
  AttentionBenchOptions o;
  o.iterations = 0;
  EXPECT_THROW(static_cast<void>(bench_attention(o)), InputError);
  o.iterations = 1;
  o.seq_lens = {0};
  EXPECT_THROW(static_cast<void>(bench_attention(o)), InputError);
}

}  // namespace
}  // namespace sextant::exec
