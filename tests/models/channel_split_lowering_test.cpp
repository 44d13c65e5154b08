// A CNN whose channels are split over tp ranks (spec/channel_split.hpp), as the lowering gives
// it: each convolution's algorithm, collectives, FLOPs and parameters counted by hand.
#include <gtest/gtest.h>

#include "expect_input_error.hpp"
#include "lowered_ops.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/spec/channel_split.hpp"
#include "sextant/spec/plan.hpp"
#include "test_models.hpp"

namespace sextant::models {
namespace {

using test::find_op;

// 3 -> 8 -> 8 -> 16 channels of 3x3 convolutions (padding 1) on 8x8 images, then a global pool
// and an fc to 10 classes.
spec::ModelSpec three_convs() {
  return test::conv_chain({8, 8, 16}, 8);
}

LoweredModel lower_tp(int64_t tp) {
  LoweringOptions o;
  o.micro_batch = 2;
  o.dtype = spec::Dtype::kFp32;
  o.tp = tp;
  return lower(three_convs(), o);
}

TEST(ChannelSplit, AlgorithmAndBlocks) {
  using A = spec::ChannelAlgorithm;
  EXPECT_EQ(spec::channel_algorithm(true, 100, 10, 2), A::kWholeInput);
  EXPECT_EQ(spec::channel_algorithm(false, 100, 100, 2), A::kStationaryX);  // ties: x
  EXPECT_EQ(spec::channel_algorithm(false, 100, 200, 2), A::kStationaryY);
  // Bytes per rank and pass, times tp, on a 2 x 2 grid at tp 4: x moves 3Y, y 3X, w X + Y.
  // Equal maps: x and y 300, w 200 -> w. Output a quarter of the input: x 75, w 125 -> x.
  // Input a quarter of the output: y 75 -> y. Input half the output: y 150 = w 150 -> y (ties
  // go to y before w). At tp 2 there is no grid: x or y.
  EXPECT_EQ(spec::channel_algorithm(false, 100, 100, 4), A::kStationaryW);
  EXPECT_EQ(spec::channel_algorithm(false, 100, 25, 4), A::kStationaryX);
  EXPECT_EQ(spec::channel_algorithm(false, 25, 100, 4), A::kStationaryY);
  EXPECT_EQ(spec::channel_algorithm(false, 50, 100, 4), A::kStationaryY);
  EXPECT_EQ(spec::channel_algorithm(false, 100, 100, 2), A::kStationaryX);
  // tp 8: a 4 x 2 grid (reduce over 4, gather over 2): w moves X + 3Y against x's and y's 7:
  // equal maps 400 against 700 -> w; an output three times the input, 10X against y's 7X -> y.
  EXPECT_EQ(spec::channel_algorithm(false, 100, 100, 8), A::kStationaryW);
  EXPECT_EQ(spec::channel_algorithm(false, 100, 300, 8), A::kStationaryY);
  // The grids: the smallest divisor of tp not below its square root reduces.
  using G = spec::ChannelFilterGrid;
  auto grid = [](int64_t tp) {
    const G g = spec::channel_filter_grid(tp);
    return std::make_pair(g.reduce_ranks, g.gather_ranks);
  };
  EXPECT_EQ(grid(4), std::make_pair(int64_t{2}, int64_t{2}));
  EXPECT_EQ(grid(8), std::make_pair(int64_t{4}, int64_t{2}));
  EXPECT_EQ(grid(12), std::make_pair(int64_t{4}, int64_t{3}));
  EXPECT_EQ(grid(16), std::make_pair(int64_t{4}, int64_t{4}));
  EXPECT_FALSE(spec::channel_filter_grid(2).any());
  EXPECT_FALSE(spec::channel_filter_grid(7).any());
  // tp rank 5 of 8 sits at place 1 of reduce group 1 and gathers channel blocks 1 and 5.
  EXPECT_EQ(spec::gathered_channel_blocks(8, 5), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(spec::gathered_channel_blocks(4, 2), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(spec::channel_block(16, 4, 3).begin, 12);
  EXPECT_EQ(spec::channel_block(16, 4, 3).count, 4);
  const spec::ModelSpec model = three_convs();
  const spec::CnnSpec& c = model.cnn();
  EXPECT_EQ(spec::channel_split_problem(c, 8), "");
  EXPECT_NE(spec::channel_split_problem(c, 16).find("must divide the 8 channels of layer 0"),
            std::string::npos);
  spec::CnnSpec pooled_first = c;
  pooled_first.layers.insert(pooled_first.layers.begin(),
                             spec::CnnLayer{spec::CnnLayerKind::kMaxPool});
  EXPECT_NE(spec::channel_split_problem(pooled_first, 2).find("starts with a conv"),
            std::string::npos);
  // The plan check asks it; a channel split beside a spatial one is a plan of tp x grid ranks.
  spec::Plan plan;
  plan.tp = 32;
  plan.global_batch = 8;
  plan.micro_batch = 8;
  EXPECT_INPUT_ERROR(spec::validate_plan(plan, three_convs(), 32, "p"), "must divide");
  plan.tp = 2;
  plan.spatial = {2, 1};
  EXPECT_NO_THROW(spec::validate_plan(plan, three_convs(), 4, "p"));
}

TEST(ChannelSplitLowering, EachConvolutionMovesTheSmallerMap) {
  const LoweredModel whole = lower_tp(1), split = lower_tp(2);
  // Layer 0 reads the image, whole on every rank: each computes 4 of the 8 filters, no
  // collective, half the FLOPs: 2 M N K = 2 (2 x 64) 4 (3 x 9).
  const Op* stem = find_op(split.layers[0].forward, "layer0.conv");
  ASSERT_NE(stem, nullptr);
  EXPECT_DOUBLE_EQ(stem->flops, 2.0 * 128 * 4 * 27);
  EXPECT_EQ(split.layers[0].forward.size(), whole.layers[0].forward.size());
  // Layer 1, 8 -> 8 channels: the output is no larger than the input, so stationary-x: every
  // filter over this rank's 4 input channels (K = 4 x 9), then the whole output (2 x 8 x 64 fp32)
  // reduce-scattered; backward all-gathers its gradient.
  const Op* conv1 = find_op(split.layers[1].forward, "layer1.conv");
  ASSERT_NE(conv1, nullptr);
  EXPECT_DOUBLE_EQ(conv1->flops, 2.0 * 128 * 8 * 36);
  const Op* rs = find_op(split.layers[1].forward, "layer1.conv.filter_reduce_scatter");
  ASSERT_NE(rs, nullptr);
  EXPECT_EQ(rs->collective, spec::CollectiveKind::kReduceScatter);
  EXPECT_EQ(rs->bytes, 2 * 8 * 64 * 4);
  const Op* ag = find_op(split.layers[1].backward, "layer1.conv.filter_all_gather");
  ASSERT_NE(ag, nullptr);
  EXPECT_EQ(ag->bytes, 2 * 8 * 64 * 4);
  EXPECT_EQ(find_op(split.layers[1].backward, "layer1.conv.filter_reduce_scatter"), nullptr);
  // Layer 2, 8 -> 16 channels: the input is smaller, so stationary-y: the input (2 x 8 x 64)
  // all-gathered, 8 whole filters per rank (N = 8, K = 8 x 9); backward reduce-scatters the
  // input gradient.
  const Op* g = find_op(split.layers[2].forward, "layer2.conv.channel_all_gather");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->bytes, 2 * 8 * 64 * 4);
  EXPECT_DOUBLE_EQ(find_op(split.layers[2].forward, "layer2.conv")->flops, 2.0 * 128 * 8 * 72);
  ASSERT_NE(find_op(split.layers[2].backward, "layer2.conv.channel_reduce_scatter"), nullptr);
  // Batch norm, ReLU and the pool work on the rank's 8 of 16 channels: half the bytes.
  EXPECT_EQ(find_op(split.layers[2].forward, "layer2.conv.bn")->bytes,
            find_op(whole.layers[2].forward, "layer2.conv.bn")->bytes / 2);
  // The fc reads 8 of the 16 pooled features per sample and all-reduces its 2 x 10 partial
  // logits, forward only (the logits' gradient is whole on every rank).
  const Op* fc = find_op(split.layers[4].forward, "layer4.fc");
  EXPECT_DOUBLE_EQ(fc->flops, 2.0 * 2 * 10 * 8);
  const Op* sums = find_op(split.layers[4].forward, "layer4.fc.all_reduce");
  ASSERT_NE(sums, nullptr);
  EXPECT_EQ(sums->bytes, 2 * 10 * 4);
  EXPECT_EQ(find_op(split.layers[4].backward, "layer4.fc.all_reduce"), nullptr);
  // Parameters per rank: each convolution's weights, biases and batch norm halved; the fc's
  // weight rows halved, its bias whole. The layers' totals are the unsplit model's.
  EXPECT_EQ(split.layers[1].params, (8 * 8 * 9 + 2 * 8) / 2);
  EXPECT_EQ(split.layers[4].params, 8 * 10 + 10);
  for (size_t l = 0; l < whole.layers.size(); ++l)
    EXPECT_EQ(split.layers[l].params_total, whole.layers[l].params) << l;
  // Stage boundaries hold each rank's own channels: sent as they are, never scattered/gathered.
  EXPECT_TRUE(split.tp_splits_activations);
  spec::Plan plan;
  plan.tp = 2;
  EXPECT_EQ(pipeline_transfer_parts(plan, split, 1024), 1);
}

// A plan's own algorithms (Plan::channel_algorithms): one per convolution after the first, in
// order. The byte rule's at tp 2 are x (layer 1, 8 -> 8) and y (layer 2, 8 -> 16), as above, and
// the lowering lists them. Swapped, layer 1 all-gathers its input (2 x 8 x 64 fp32) and layer 2
// reduce-scatters its whole output (2 x 16 x 64 fp32); a list of the wrong length or a w on tp 2
// is refused naming the field.
TEST(ChannelSplitLowering, APlanChoosesEachConvolutionsAlgorithm) {
  using A = spec::ChannelAlgorithm;
  EXPECT_EQ(lower_tp(2).channel_algorithms, (std::vector<A>{A::kStationaryX, A::kStationaryY}));
  EXPECT_TRUE(lower_tp(1).channel_algorithms.empty());
  LoweringOptions o;
  o.micro_batch = 2;
  o.dtype = spec::Dtype::kFp32;
  o.tp = 2;
  o.channel_algorithms = {A::kStationaryY, A::kStationaryX};
  const LoweredModel swapped = lower(three_convs(), o);
  EXPECT_EQ(swapped.channel_algorithms, o.channel_algorithms);
  const Op* gather = find_op(swapped.layers[1].forward, "layer1.conv.channel_all_gather");
  ASSERT_NE(gather, nullptr);
  EXPECT_EQ(gather->bytes, 2 * 8 * 64 * 4);
  EXPECT_EQ(find_op(swapped.layers[1].forward, "layer1.conv.filter_reduce_scatter"), nullptr);
  const Op* scatter = find_op(swapped.layers[2].forward, "layer2.conv.filter_reduce_scatter");
  ASSERT_NE(scatter, nullptr);
  EXPECT_EQ(scatter->bytes, 2 * 16 * 64 * 4);
  o.channel_algorithms = {A::kStationaryY};
  EXPECT_INPUT_ERROR(lower(three_convs(), o), "/channel_algorithms");
  o.channel_algorithms = {A::kStationaryY, A::kStationaryX, A::kStationaryX};
  EXPECT_INPUT_ERROR(lower(three_convs(), o), "the model's 2 convolutions after the first");
  // The plan's own rules: w needs a grid, "whole" is never chosen, tp 1 chooses nothing.
  EXPECT_NE(spec::channel_algorithms_problem({A::kStationaryW}, 2).find("grid"), std::string::npos);
  EXPECT_EQ(spec::channel_algorithms_problem({A::kStationaryW}, 4), "");
  EXPECT_NE(spec::channel_algorithms_problem({A::kWholeInput}, 4).find("never chosen"),
            std::string::npos);
  EXPECT_NE(spec::channel_algorithms_problem({A::kStationaryX}, 1).find("tp > 1"),
            std::string::npos);
}

// tp 4 on its 2 x 2 grid. Layer 1 (8 -> 8 channels, 8x8 maps: the input and output equal) runs
// stationary-w: the channel group's 4 channels (2 x 4 x 64 fp32 = 2048 B) all-gathered over the
// 2 ranks of the gather group; each rank convolves them with its filter group's 4 filters,
// 2 (2 x 64) 4 (4 x 9) FLOPs, and reduce-scatters the 2 x 4 x 64 fp32 = 2048 B of partial
// outputs over the 2 ranks of its reduce group; backward the twins in the same groups. It holds
// 4 x 4 x 9 weights and its 2 channels' batch norm: a quarter of 8 x 8 x 9 + 2 x 8. Layer 2
// (8 -> 16) moves y's 3 x 8 = 24 against w's 8 + 16: a tie, which y takes.
TEST(ChannelSplitLowering, StationaryWGathersAndReducesInItsOwnGroups) {
  const LoweredModel split = lower_tp(4);
  struct Expected {
    bool forward;
    const char* name;
    spec::CollectiveKind kind;
    CommGroup group;
  };
  const Expected ops[] = {
      {true, "layer1.conv.channel_all_gather", spec::CollectiveKind::kAllGather,
       CommGroup::kChannelGather},
      {true, "layer1.conv.filter_reduce_scatter", spec::CollectiveKind::kReduceScatter,
       CommGroup::kFilterReduce},
      {false, "layer1.conv.filter_all_gather", spec::CollectiveKind::kAllGather,
       CommGroup::kFilterReduce},
      {false, "layer1.conv.channel_reduce_scatter", spec::CollectiveKind::kReduceScatter,
       CommGroup::kChannelGather},
  };
  for (const Expected& x : ops) {
    const Op* op = find_op(x.forward ? split.layers[1].forward : split.layers[1].backward, x.name);
    ASSERT_NE(op, nullptr) << x.name;
    EXPECT_EQ(op->collective, x.kind) << x.name;
    EXPECT_EQ(op->group, x.group) << x.name;
    EXPECT_EQ(op->bytes, 2048) << x.name;
  }
  EXPECT_DOUBLE_EQ(find_op(split.layers[1].forward, "layer1.conv")->flops, 2.0 * 128 * 4 * 36);
  EXPECT_EQ(split.layers[1].params, 4 * 4 * 9 + 2 * 2);
  EXPECT_EQ(split.layers[1].params, (8 * 8 * 9 + 2 * 8) / 4);
  EXPECT_TRUE(split.stationary_w);
  EXPECT_FALSE(lower_tp(2).stationary_w);
  const Op* y = find_op(split.layers[2].forward, "layer2.conv.channel_all_gather");
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(y->group, CommGroup::kLayer);
  EXPECT_EQ(y->bytes, 2 * 8 * 64 * 4);
  // The gather precedes the product, the reduce-scatter follows it.
  const std::vector<Op>& f = split.layers[1].forward;
  EXPECT_LT(find_op(f, "layer1.conv.channel_all_gather") - f.data(),
            find_op(f, "layer1.conv") - f.data());
  EXPECT_GT(find_op(f, "layer1.conv.filter_reduce_scatter") - f.data(),
            find_op(f, "layer1.conv") - f.data());
}

// Both splits at once: tp 2 over the channels of each rank's block of a 2x1 grid (rows 0-3 and
// 4-7 of every 8x8 map: 32 pixels a block). A 3x3 window (padding 1) reads one row beyond its
// block from the other grid rank: 8 elements a channel. Derived by hand:
// - layer 0 (3 -> 8, the whole image): the halo of the image's 3 channels, 2 x 3 x 8 x 4 = 192 B
//   over the grid; 4 filters per rank over the block, 2 (2 x 32) 4 27 FLOPs; batch norm's sums of
//   the rank's 4 channels, 2 x 4 fp32 = 32 B, over the grid;
// - layer 1 (8 -> 8, stationary-x): the halo of the rank's 4 channels, 2 x 4 x 8 x 4 = 256 B;
//   the block's partial output of all 8 filters reduce-scattered over tp, 2 x 8 x 32 x 4 = 2048 B;
// - layer 2 (8 -> 16, stationary-y): the block's 8 channels all-gathered over tp first,
//   2 x 8 x 32 x 4 = 2048 B (no halo in it), then the halo of all 8 channels, 2 x 8 x 8 x 4 =
//   512 B; batch norm's sums of the rank's 8 of 16 channels, 2 x 8 x 4 = 64 B;
// - layer 3, the pool: each rank's share of its 8 channels' means, 2 x 8 x 4 = 64 B, summed over
//   the grid; layer 4, the fc: 2 x 10 x 4 = 80 B of partial logits summed over tp.
TEST(ChannelSplitLowering, BesideASpatialSplitTheCollectivesMoveBlocksInTheirOwnGroups) {
  LoweringOptions o;
  o.micro_batch = 2;
  o.dtype = spec::Dtype::kFp32;
  o.tp = 2;
  o.spatial = {2, 1};
  const LoweredModel both = lower(three_convs(), o);
  struct Expected {
    size_t layer;
    const char* name;
    int64_t bytes;
    CommGroup group;
  };
  const Expected ops[] = {
      {0, "layer0.conv.halo", 192, CommGroup::kSpatial},
      {0, "layer0.conv.bn_allreduce", 32, CommGroup::kSpatial},
      {1, "layer1.conv.halo", 256, CommGroup::kSpatial},
      {1, "layer1.conv.filter_reduce_scatter", 2048, CommGroup::kLayer},
      {2, "layer2.conv.channel_all_gather", 2048, CommGroup::kLayer},
      {2, "layer2.conv.halo", 512, CommGroup::kSpatial},
      {2, "layer2.conv.bn_allreduce", 64, CommGroup::kSpatial},
      {3, "layer3.pool_allreduce", 64, CommGroup::kSpatial},
      {4, "layer4.fc.all_reduce", 80, CommGroup::kLayer},
  };
  for (const Expected& x : ops) {
    const Op* op = find_op(both.layers[x.layer].forward, x.name);
    ASSERT_NE(op, nullptr) << x.name;
    EXPECT_EQ(op->bytes, x.bytes) << x.name;
    EXPECT_EQ(op->group, x.group) << x.name;
  }
  EXPECT_DOUBLE_EQ(find_op(both.layers[0].forward, "layer0.conv")->flops, 2.0 * 64 * 4 * 27);
  // Stationary-y gathers before the halo exchange, which then carries every channel.
  const std::vector<Op>& conv2 = both.layers[2].forward;
  EXPECT_LT(find_op(conv2, "layer2.conv.channel_all_gather") - conv2.data(),
            find_op(conv2, "layer2.conv.halo") - conv2.data());
}

}  // namespace
}  // namespace sextant::models
