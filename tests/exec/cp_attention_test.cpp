// A context-parallel rank's rows: which positions of each sequence it holds, in runs, for the
// learned position embeddings (also on a tensor-parallel rank's slice under sequence parallelism).
#include "sextant/exec/cp_attention.hpp"

#include <gtest/gtest.h>

#include <tuple>
#include <vector>

namespace sextant::exec {
namespace {

using Runs = std::vector<std::tuple<int64_t, int64_t, int64_t>>;

TEST(CpAttention, PositionRunsFollowTheChunksAcrossSequencesAndSlices) {
  // Sequences of 8 over cp 2: 4 chunks of 2; rank 0 holds chunks 0 and 3 (positions 0, 1, 6, 7),
  // rank 1 chunks 1 and 2 (2, 3, 4, 5: one run). Three sequences a micro-batch: 12 rows a rank.
  spec::Plan plan;
  plan.cp = 2;
  plan.cp_algorithm = spec::ContextAlgorithm::kAllGather;
  Groups groups;
  groups.cp_size = 2;
  Context ctx;
  ctx.plan = &plan;
  ctx.groups = &groups;
  groups.cp_rank = 0;
  const CpAttention first(ctx, 3, 8, 4, 4, 8);
  EXPECT_EQ(first.layout().seq, 4);
  EXPECT_EQ(first.position_runs(0, 12),
            (Runs{{0, 0, 2}, {2, 6, 2}, {4, 0, 2}, {6, 6, 2}, {8, 0, 2}, {10, 6, 2}}));
  // The second of two tensor-parallel slices of 6 rows (sequence parallelism): rows 6-11, from
  // the middle of the second sequence; rows counted from the slice.
  EXPECT_EQ(first.position_runs(6, 6), (Runs{{0, 6, 2}, {2, 0, 2}, {4, 6, 2}}));
  // A slice that starts inside a run: rows 3-5.
  EXPECT_EQ(first.position_runs(3, 3), (Runs{{0, 7, 1}, {1, 0, 2}}));
  groups.cp_rank = 1;
  const CpAttention second(ctx, 3, 8, 4, 4, 8);
  EXPECT_EQ(second.position_runs(0, 12), (Runs{{0, 2, 4}, {4, 2, 4}, {8, 2, 4}}));
  EXPECT_FALSE(second.keeps_head_block());
}

}  // namespace
}  // namespace sextant::exec
