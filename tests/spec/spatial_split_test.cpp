// The geometry of a spatial split (spec/spatial_split.hpp), its plan format and rank layout, each
// checked against a hand count.
#include "sextant/spec/spatial_split.hpp"

#include <gtest/gtest.h>

#include <string>

#include "expect_input_error.hpp"
#include "sextant/spec/rank_layout.hpp"
#include "test_models.hpp"

namespace sextant::spec {
namespace {

TEST(SpatialSplit, ShardsAndHalosByHand) {
  EXPECT_EQ(shard_extent(224, 4), 56);
  EXPECT_EQ(shard_extent(7, 2), 4);  // rows 0-3 and 4-6: the step waits for the larger
  // A window reads `padding` rows before the shard and kernel - padding - stride after it.
  EXPECT_EQ(window_halo(3, 1, 1), (Halo{1, 1}));   // a same-size 3x3 convolution
  EXPECT_EQ(window_halo(7, 2, 3), (Halo{3, 2}));   // ResNet's stem
  EXPECT_EQ(window_halo(3, 2, 1), (Halo{1, 0}));   // strided 3x3 convolution, max pool 3/2/1
  EXPECT_EQ(window_halo(1, 2, 0), (Halo{0, 0}));   // ResNet's strided 1x1 projection
  EXPECT_EQ(window_halo(2, 2, 0), (Halo{0, 0}));   // VGG's 2x2 max pool
  EXPECT_EQ(window_halo(11, 4, 2), (Halo{2, 5}));  // AlexNet's first convolution
  // ResNet's stem (7/2/3, 224 -> 112) over 2x2: the corner rank (1, 1) makes output rows and
  // columns 56-111 from input 109-225, its block 112-223 grown by 3 rows and 3 columns above and
  // left (the rest is padding): 115^2 - 112^2 = 681 (two edges of 336 and the 9-element corner
  // block of its diagonal neighbour).
  EXPECT_EQ(halo_elements({224, 224, 112, 112, 7, 2, 3}, {2, 2}), 681);
  // Rank (0, 0) reads 2 rows and columns past its block (and padding before it): 2 x 112 from each
  // neighbour and the 2x2 corner.
  EXPECT_EQ(halo_received({224, 224, 112, 112, 7, 2, 3}, {2, 2}, 0), 2 * (2 * 112) + 2 * 2);
  // 4 ranks along the rows of a 56x56 map: an inner rank's 14x56 block gets a row on each side.
  EXPECT_EQ(halo_elements({56, 56, 56, 56, 3, 1, 1}, {4, 1}), 2 * 56);
  EXPECT_EQ(halo_elements({56, 56, 56, 56, 3, 1, 1}, {1, 1}), 0);  // unsplit
  // Maps that do not divide evenly (ResNet-50's 14 -> 7 rows over 2 ranks: shards 0-6 and 7-13,
  // outputs 0-2 and 3-6): the strided 3x3 of rank 1 reads input rows 5-13, two rows of rank 0
  // (a halo of window_halo's 1 row only where shards align with the stride); the strided 1x1
  // projection reads rows 6-12, one of rank 0's, over the 13 columns its windows span (0-12: the
  // last column is never read).
  EXPECT_EQ(halo_elements({14, 14, 7, 7, 3, 2, 1}, {2, 1}), 2 * 14);
  EXPECT_EQ(halo_elements({14, 14, 7, 7, 1, 2, 0}, {2, 1}), 13);
}

// The executor's partition and the rows a window reads, by hand.
TEST(SpatialSplit, ShardRowsAndWindowInputs) {
  // 7 rows over 2: floor(7/2) = 3, so rows 0-2 and 3-6; 5 over 4: 1, 1, 1, 2 (every rank holds
  // one, which ceil-sized shards of 2 would not: 2, 2, 1, 0).
  EXPECT_EQ(shard_rows(7, 2, 0), (Rows{0, 3}));
  EXPECT_EQ(shard_rows(7, 2, 1), (Rows{3, 7}));
  for (int64_t i = 0; i < 4; ++i) EXPECT_GE(shard_rows(5, 4, i).size(), 1);
  EXPECT_EQ(shard_rows(5, 4, 3), (Rows{3, 5}));
  // The largest range is shard_extent's.
  EXPECT_EQ(shard_rows(7, 2, 1).size(), shard_extent(7, 2));
  // ResNet's stem (7/2/3) making output rows 56-111 of 112 reads input rows 56*2-3 = 109 to
  // 111*2-3+7 = 226: 3 rows before its shard [112, 224) and 2 past the map (the padding).
  EXPECT_EQ(window_input_rows({56, 112}, 7, 2, 3), (Rows{109, 226}));
  // A same-size 3x3: one row each side, the halo window_halo(3, 1, 1) names.
  EXPECT_EQ(window_input_rows({4, 8}, 3, 1, 1), (Rows{3, 9}));
}

// A volume's blocks over a d x h x w grid (planes outermost), and a halo across planes by hand.
TEST(SpatialSplit, VolumeBlocksAndPlaneHalos) {
  // 8 planes of 10 x 10 over 2 x 2 x 1 (d, h, w): rank 3 is plane block 1, row block 1.
  const SpatialSplit grid{2, 1, 2};
  const MapBlock b = shard_block(MapExtent{10, 10, 8}, grid, 3);
  EXPECT_EQ(b.planes, (Rows{4, 8}));
  EXPECT_EQ(b.rows, (Rows{5, 10}));
  EXPECT_EQ(b.cols, (Rows{0, 10}));
  EXPECT_EQ(b.elements(), 4 * 5 * 10);
  // A 2D map has one plane whatever the grid.
  EXPECT_EQ(shard_block(10, 10, {2, 1}, 1).planes, (Rows{0, 1}));
  // A padded 3x3x3 convolution over 8 x 10 x 10 split by planes only ({1, 1, 2}): rank 0 makes
  // planes 0-3 from planes -1 to 4, of which plane 4 (10 x 10) is rank 1's; the rows and columns
  // reach into the padding only.
  const Window conv{10, 10, 10, 10, 3, 1, 1, 8, 8};
  EXPECT_EQ(window_input_block(conv, {1, 1, 2}, 0).planes, (Rows{-1, 5}));
  EXPECT_EQ(halo_received(conv, {1, 1, 2}, 0), 100);
  EXPECT_EQ(halo_elements(conv, {1, 1, 2}), 100);
  // Over {2, 1, 2} rank 0 (planes 0-3, rows 0-4) also reads row 5 of its planes (rank 1's: 4 x 10)
  // and plane 4's rows 0-5 (rank 2's rows 0-4 and rank 3's corner row 5: 6 x 10).
  EXPECT_EQ(halo_received(conv, {2, 1, 2}, 0), 6 * 10 + 4 * 10);
}

// U-Net's up-convolution and crop under a split read blocks of their inputs that are not windows.
TEST(SpatialSplit, UpConvolutionAndCropInputsByHand) {
  // A 2x2 up-convolution of stride 2: input row i makes output rows 2i and 2i + 1, so output rows
  // [5, 11) come from input rows 2 (row 5) to 5 (row 10); [0, 5) from rows 0-2.
  EXPECT_EQ(up_window_input_rows({5, 11}, 11, 2, 2), (Rows{2, 6}));
  EXPECT_EQ(up_window_input_rows({0, 5}, 11, 2, 2), (Rows{0, 3}));
  // Overlapping 3x3 of stride 2: row i makes rows 2i to 2i + 2, so row 4 comes from rows 1 and 2
  // and rows [4, 6) from rows 1-2; the last output rows stop at the input's end.
  EXPECT_EQ(up_window_input_rows({4, 6}, 5, 3, 2), (Rows{1, 3}));
  EXPECT_EQ(up_window_input_rows({9, 11}, 5, 3, 2), (Rows{4, 5}));
  // 2 ranks of a 5x5 input up to 10x10 (rows [0, 5) and [5, 10); input rows [0, 2) and [2, 5)):
  // rank 0 reads input rows 0-2, one (5 columns) held by rank 1; rank 1 reads its own rows.
  const Window up{5, 5, 10, 10, 2, 2, 0};
  EXPECT_EQ(fetched_elements(
                [&](int64_t q) {
                  return up_window_input_block(up, {2, 1}, q);
                },
                {5, 5}, {2, 1}, 0),
            5);
  EXPECT_EQ(fetched_elements(
                [&](int64_t q) {
                  return up_window_input_block(up, {2, 1}, q);
                },
                {5, 5}, {2, 1}, 1),
            0);
  // The crop of a 26-row kept map to 22 rows (offset 2) over 4 ranks: rank 0's output rows
  // [0, 5) read kept rows [2, 7), of which row 6 is rank 1's ([6, 13)).
  const MapBlock crop = crop_input_block({26, 10}, {22, 6}, {4, 1}, 0);
  EXPECT_EQ(crop.rows, (Rows{2, 7}));
  EXPECT_EQ(crop.cols, (Rows{2, 8}));
  EXPECT_EQ(most_fetched_elements(
                [](int64_t q) {
                  return crop_input_block({26, 10}, {22, 6}, {4, 1}, q);
                },
                {26, 10}, {4, 1}),
            6);
  // The halos are the same count over window_input_block.
  const Window conv{56, 56, 56, 56, 3, 1, 1};
  EXPECT_EQ(halo_elements(conv, {4, 1}), most_fetched_elements(
                                             [&](int64_t q) {
                                               return window_input_block(conv, {4, 1}, q);
                                             },
                                             {56, 56}, {4, 1}));
}

ModelSpec transformer() {
  ModelSpec m;
  m.name = "t";
  TransformerSpec t;
  t.layers = 2;
  t.hidden = 64;
  t.heads = t.kv_heads = 1;
  t.ffn_hidden = 256;
  t.vocab = 100;
  t.seq_len = t.max_positions = 16;
  m.body = t;
  return m;
}

TEST(SpatialSplit, WhichModelsSplit) {
  const ModelSpec cnn = test::small_cnn(8);  // 3x3 convolution on 8x8, pool, classifier
  EXPECT_EQ(spatial_split_problem(cnn, {1, 1}), "");
  EXPECT_EQ(spatial_split_problem(cnn, {2, 2}), "");
  // Eight ranks along 8 rows: one row each, and the 1-row halo is the neighbour's own row.
  EXPECT_EQ(spatial_split_problem(cnn, {8, 1}), "");
  EXPECT_NE(spatial_split_problem(cnn, {16, 1}).find("layer 0 (conv) makes a 8x8 feature map"),
            std::string::npos);
  // A 2x2 max pool first: its 4 output rows cannot go to 8 ranks.
  ModelSpec pooled = cnn;
  CnnLayer pool;
  pool.kind = CnnLayerKind::kMaxPool;
  pool.kernel = pool.stride = 2;
  pooled.body = [&] {
    CnnSpec c = cnn.cnn();
    c.layers.insert(c.layers.begin(), pool);
    return c;
  }();
  EXPECT_EQ(spatial_split_problem(pooled, {4, 4}), "");
  EXPECT_NE(spatial_split_problem(pooled, {8, 1}).find("layer 0 (max_pool) makes a 4x4"),
            std::string::npos);
  // The classifier must follow a global pool, whose partial sums the ranks all-reduce.
  ModelSpec flat = cnn;
  flat.body = [&] {
    CnnSpec c = cnn.cnn();
    c.layers.erase(c.layers.begin() + 1);
    return c;
  }();
  EXPECT_EQ(spatial_split_problem(flat, {1, 1}), "");
  EXPECT_NE(spatial_split_problem(flat, {2, 1}).find("needs an adaptive_avg_pool"),
            std::string::npos);
  EXPECT_NE(spatial_split_problem(transformer(), {2, 1}).find("applies to CNNs only"),
            std::string::npos);
  // A per-pixel head (U-Net) splits to its loss, with no pool to end the split; its windows
  // still need a row each and a halo from the adjacent rank: unet-tiny's 7 -> 5 rows 3x3
  // convolution reads 2 rows past a block, and 4 ranks of 7 rows hold 1 or 2.
  const ModelSpec unet =
      read_model_file(std::string(SEXTANT_SOURCE_DIR) + "/tests/pytorch/unet-tiny.json");
  EXPECT_EQ(spatial_split_problem(unet, {2, 2}), "");
  EXPECT_NE(spatial_split_problem(unet, {4, 1}).find("layer 2 (conv) makes a 5x5 feature map"),
            std::string::npos);
  // unet-tall-tiny's maps (28 rows to 13 at the pool, 11 before the up-convolution) take 4.
  const ModelSpec tall =
      read_model_file(std::string(SEXTANT_SOURCE_DIR) + "/tests/pytorch/unet-tall-tiny.json");
  EXPECT_EQ(spatial_split_problem(tall, {4, 1}), "");
  // Volumes split their planes too: unet3d-tiny's 8 planes go to 2 ranks (4 at the pool, 2 at
  // its valid 3x3x3 convolutions, which read 2 planes past a block), not to 4 (the 4 -> 2 plane
  // convolution would leave ranks without a plane).
  const ModelSpec volume =
      read_model_file(std::string(SEXTANT_SOURCE_DIR) + "/tests/pytorch/unet3d-tiny.json");
  EXPECT_EQ(spatial_split_problem(volume, {2, 2, 2}), "");
  EXPECT_NE(
      spatial_split_problem(volume, {1, 1, 4}).find("layer 2 (conv) makes a 2x3x3 feature map"),
      std::string::npos);
}

Json split_plan() {
  return Json::parse(R"({"schema": "sextant.plan/1", "dp": 2, "tp": 1, "pp": 1, "zero": 0,
                         "micro_batch": 4, "global_batch": 8, "spatial": {"h": 2, "w": 2}})");
}

TEST(SpatialSplit, PlanFormatAndRules) {
  const Plan p = plan_from_json(split_plan(), "p.json");
  EXPECT_EQ(p.spatial, (SpatialSplit{2, 2}));
  EXPECT_EQ(p.world_size(), 8);     // dp 2 x a 2x2 grid
  EXPECT_EQ(p.replicas(), 8);       // every rank holds the whole model
  EXPECT_EQ(p.micro_batches(), 1);  // the grid splits samples, not the batch: 8 / (2 x 4)
  EXPECT_EQ(p.name(), "dp2.tp1.pp1.z0.mb4.hw2x2");
  EXPECT_EQ(to_json(plan_from_json(to_json(p), "round trip")), to_json(p));
  Json unsplit = split_plan();
  unsplit.erase("spatial");
  EXPECT_FALSE(to_json(plan_from_json(unsplit, "p")).contains("spatial"));
  Json bad = split_plan();
  bad["spatial"]["h"] = 0;
  EXPECT_INPUT_ERROR(plan_from_json(bad, "p.json"), "/spatial/h");
  bad = split_plan();
  bad["spatial"]["d"] = 0;
  EXPECT_INPUT_ERROR(plan_from_json(bad, "p.json"), "/spatial/d");
  // A volume's planes split too (d): 2 x 2 x 2 grid ranks per replica.
  Json volume = split_plan();
  volume["spatial"]["d"] = 2;
  const Plan v = plan_from_json(volume, "v.json");
  EXPECT_EQ(v.spatial, (SpatialSplit{2, 2, 2}));
  EXPECT_EQ(v.world_size(), 16);
  EXPECT_EQ(v.name(), "dp2.tp1.pp1.z0.mb4.dhw2x2x2");
  EXPECT_EQ(spatial_text(v.spatial), "2x2x2");
  EXPECT_EQ(to_json(plan_from_json(to_json(v), "round trip")), to_json(v));
  EXPECT_INPUT_ERROR(validate_plan(v, test::small_cnn(), 16, "v.json"),
                     "/spatial = 2x2x2: d splits a volume's planes");
  // ZeRO shards over the replicas, the grid's ranks among them: dp 2 x 2 x 2 = 8 shards.
  Json zero = split_plan();
  zero["zero"] = 3;
  const Plan z = plan_from_json(zero, "z.json");
  EXPECT_EQ(z.replicas(), 8);
  EXPECT_EQ(z.name(), "dp2.tp1.pp1.z3.mb4.hw2x2");
  bad = split_plan();
  bad["compression"] = {{"kind", "onebit"}};
  EXPECT_INPUT_ERROR(plan_from_json(bad, "p.json"),
                     "/compression/kind = onebit: runs without a spatial split");
  // Against a model and a rank count.
  validate_plan(p, test::small_cnn(), 8, "p.json");
  EXPECT_INPUT_ERROR(validate_plan(p, test::small_cnn(), 2, "p.json"),
                     "dp*tp*pp*spatial must equal the number of ranks (2)");
  EXPECT_INPUT_ERROR(validate_plan(p, test::small_cnn(1), 8, "p.json"),
                     "/spatial = 2x2: layer 0 (conv)");
  EXPECT_INPUT_ERROR(validate_plan(p, transformer(), 8, "p.json"), "applies to CNNs only");
  Plan recomputed = p;
  recomputed.recompute = Recompute::kFull;
  EXPECT_INPUT_ERROR(validate_plan(recomputed, test::small_cnn(), 8, "p.json"),
                     "applies to transformer blocks only");
}

TEST(SpatialSplit, SplitRanksAreInnermost) {
  Plan p;
  p.dp = 2;
  p.pp = 2;
  p.spatial = {2, 1};
  const RankLayout layout(p);
  ASSERT_EQ(layout.world_size(), 8);
  // rank = s + 2 (tp + 1 (dp + 2 pp)): dp 1, stage 1, grid rank 1 is 1 + 2 (1 + 2) = 7.
  EXPECT_EQ(layout.rank({1, 0, 1, 1}), 7);
  const RankCoord c = layout.coord(7);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.spatial, 1);
  EXPECT_EQ(layout.spatial_group(7), (std::vector<int64_t>{6, 7}));
  // The layer group is the tensor-parallel one (here rank 7 alone): halos and the sums of a
  // spatial split run in the spatial group.
  EXPECT_EQ(layout.layer_group(7), (std::vector<int64_t>{7}));
  EXPECT_EQ(layout.dp_group(7), (std::vector<int64_t>{5, 7}));
  // The ranks summing stage 1's gradients: both replicas, each with its two grid ranks.
  EXPECT_EQ(layout.replica_group(7), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(layout.pp_next(7), 3);
  // Unsplit, the layer group is the tensor-parallel one and the replicas the dp group.
  Plan q;
  q.dp = 2;
  q.tp = 2;
  const RankLayout plain(q);
  EXPECT_EQ(plain.layer_group(3), plain.tp_group(3));
  EXPECT_EQ(plain.replica_group(3), plain.dp_group(3));
  // tp 2 has no stationary-w grid: both of its groups are the tp group.
  EXPECT_EQ(plain.channel_filter_group(3, 0), plain.tp_group(3));
  EXPECT_EQ(plain.channel_filter_group(3, 1), plain.tp_group(3));
}

TEST(ChannelFilterGrid, GroupsOfStationaryW) {
  // tp 8 (a 4 x 2 grid) beside a 2x1 spatial grid, dp 2: rank = s + 2 (t + 8 d). Rank 27 is
  // s 1, tp index 5, dp 1. Its reduce group: tp indices 4-7 (5 - 5 % 4 = 4, consecutive), ranks
  // 1 + 2 (t + 8) = 25, 27, 29, 31; its gather group: tp indices 1 and 5 (5 % 4 + 4 k), ranks 19
  // and 27.
  Plan p;
  p.dp = 2;
  p.tp = 8;
  p.spatial = {2, 1};
  const RankLayout layout(p);
  ASSERT_EQ(layout.coord(27).tp, 5);
  EXPECT_EQ(layout.channel_filter_group(27, 0), (std::vector<int64_t>{25, 27, 29, 31}));
  EXPECT_EQ(layout.channel_filter_group(27, 1), (std::vector<int64_t>{19, 27}));
}

}  // namespace
}  // namespace sextant::spec
