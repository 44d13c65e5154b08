// A spatially split CNN layer as the lowering gives it: the most loaded rank's block, its halo
// exchange and its statistic all-reduces, counted by hand.
#include <gtest/gtest.h>

#include <string>

#include "lowered_ops.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/spec/model_spec.hpp"
#include "test_models.hpp"

namespace sextant::models {
namespace {

using test::find_op;

LoweredModel lower_small(spec::SpatialSplit split) {
  LoweringOptions o;
  o.micro_batch = 2;
  o.dtype = spec::Dtype::kFp32;
  o.spatial = split;
  return lower(test::small_cnn(32, 64), o);
}

// A test model file (tests/pytorch/) lowered as above: B = 2, fp32.
LoweredModel lower_file(const std::string& name, spec::SpatialSplit split) {
  LoweringOptions o;
  o.micro_batch = 2;
  o.dtype = spec::Dtype::kFp32;
  o.spatial = split;
  return lower(spec::read_model_file(std::string(SEXTANT_SOURCE_DIR) + "/tests/pytorch/" + name),
               o);
}

TEST(SpatialLowering, AConvolutionOnABlockWithItsHalo) {
  // B = 2 samples of 3 x 32 x 32 in fp32 over a 2x2 grid: each rank holds a 16x16 block.
  const LoweredModel whole = lower_small({1, 1});
  const LoweredModel split = lower_small({2, 2});
  ASSERT_EQ(split.layers.size(), 3u);  // convolution, global pool, classifier
  const Layer& conv = split.layers[0];
  // The 3x3 window (padding 1) reads one row and one column from each neighbour; with two ranks
  // per axis one side only: (16 + 1)^2 - 16^2 = 33 elements per channel and sample.
  const Op* halo = find_op(conv.forward, "layer0.conv.halo");
  ASSERT_NE(halo, nullptr);
  EXPECT_EQ(halo->collective, spec::CollectiveKind::kSendRecv);
  EXPECT_EQ(halo->bytes, 2 * 3 * 33 * 4);
  EXPECT_EQ(find_op(whole.layers[0].forward, "layer0.conv.halo"), nullptr);
  // The implicit GEMM over the block's 16 x 16 output pixels: 2 M N K = 2 (2 x 256) 64 (3 x 9),
  // a quarter of the unsplit layer's.
  const Op* gemm = find_op(conv.forward, "layer0.conv");
  ASSERT_NE(gemm, nullptr);
  EXPECT_DOUBLE_EQ(gemm->flops, 2.0 * (2 * 256) * 64 * 27);
  EXPECT_DOUBLE_EQ(find_op(whole.layers[0].forward, "layer0.conv")->flops, 4 * gemm->flops);
  // Batch norm: each channel's sum and sum of squares, fp32, all-reduced over the grid.
  const Op* stats = find_op(conv.forward, "layer0.conv.bn_allreduce");
  ASSERT_NE(stats, nullptr);
  EXPECT_EQ(stats->collective, spec::CollectiveKind::kAllReduce);
  EXPECT_EQ(stats->bytes, 2 * 64 * 4);
  // Backward all-reduces batch norm's two gradient sums (as many bytes); the image needs no
  // gradient, so the first layer sends no halo back.
  EXPECT_EQ(*find_op(conv.backward, "layer0.conv.bn_allreduce"), *stats);
  EXPECT_EQ(find_op(conv.backward, "layer0.conv.halo"), nullptr);
  // The block is what the layer hands on and keeps: its input with the halo, 2 x 3 x (256 + 33)
  // elements, and its 2 x 64 x 256 outputs before and after batch norm.
  EXPECT_EQ(conv.output_bytes, 2 * 64 * 256 * 4);
  EXPECT_EQ(conv.saved_bytes, (2 * 3 * (256 + 33) + 2 * (2 * 64 * 256)) * 4);
  // The global pool sums its block and all-reduces the 2 x 64 partial sums; the classifier then
  // runs whole on every rank.
  const Layer& pool = split.layers[1];
  const Op* sums = find_op(pool.forward, "layer1.pool_allreduce");
  ASSERT_NE(sums, nullptr);
  EXPECT_EQ(sums->bytes, 2 * 64 * 4);
  EXPECT_EQ(find_op(pool.backward, "layer1.pool_allreduce"), nullptr);  // the gradient is whole
  EXPECT_EQ(pool.output_bytes, 2 * 64 * 4);
  EXPECT_EQ(split.layers[2].forward, whole.layers[2].forward);
  EXPECT_EQ(split.layers[2].params, whole.layers[2].params);
}

TEST(SpatialLowering, ALaterLayerSendsItsHalosGradientBack) {
  // A second convolution: its input is the first one's output, whose gradient the halo's owner
  // needs: backward exchanges the same bytes, 2 x 64 x 33 x 4, the other way.
  spec::ModelSpec m = test::small_cnn(32, 64);
  spec::CnnSpec c = m.cnn();
  c.layers.insert(c.layers.begin(), c.layers.front());
  m.body = c;
  LoweringOptions o;
  o.micro_batch = 2;
  o.dtype = spec::Dtype::kFp32;
  o.spatial = {2, 2};
  const Layer second = lower(m, o).layers[1];
  const Op* halo = find_op(second.forward, "layer1.conv.halo");
  ASSERT_NE(halo, nullptr);
  EXPECT_EQ(halo->bytes, 2 * 64 * 33 * 4);
  ASSERT_NE(find_op(second.backward, "layer1.conv.halo"), nullptr);
  EXPECT_EQ(*find_op(second.backward, "layer1.conv.halo"), *halo);
}

TEST(SpatialLowering, ASplitRankHoldsEveryParameterAndAQuarterOfTheWork) {
  // Every rank holds the whole model and, where the rows divide evenly, a quarter of each
  // convolution's work.
  const spec::ModelSpec m = test::small_cnn(56, 32);
  LoweringOptions o;
  o.micro_batch = 4;
  const LoweredModel whole = lower(m, o);
  o.spatial = {4, 1};
  const LoweredModel split = lower(m, o);
  int64_t params_whole = 0, params_split = 0;
  for (const Layer& l : whole.layers) params_whole += l.params;
  for (const Layer& l : split.layers) params_split += l.params;
  EXPECT_EQ(params_split, params_whole);
  EXPECT_DOUBLE_EQ(split.layers[0].forward_flops(), whole.layers[0].forward_flops() / 4);
  // 4 ranks along 56 rows: an inner rank's 14 x 56 block gets a row from each side.
  EXPECT_EQ(split.layers[0].forward[0].bytes, 4 * 3 * (2 * 56) * 2);
}

TEST(SpatialLowering, TheFirstLayerSendsBackOnlyHaloGradientsOfItsOwnWork) {
  // A model that opens with a bottleneck block: its 1x1 convolutions read the image (no halo, no
  // gradient), its 3x3 reads conv1's output, whose halo gradient must go back even in layer 0.
  spec::ModelSpec m = test::small_cnn(16, 8);
  spec::CnnLayer block{spec::CnnLayerKind::kBottleneck, 8, 4, 1};
  std::get<spec::CnnSpec>(m.body).layers.front() = block;
  LoweringOptions o;
  o.micro_batch = 2;
  o.spatial = {2, 1};
  const LoweredModel split = lower(m, o);
  ASSERT_NE(find_op(split.layers[0].forward, "layer0.conv2.halo"), nullptr);
  EXPECT_NE(find_op(split.layers[0].backward, "layer0.conv2.halo"), nullptr);
}

// U-Net split to its per-pixel loss (tests/pytorch/unet-tall-tiny.json over 4 ranks along its
// rows, B = 2, fp32). The maps: 28 -> 26 (kept) -> 13 -> 11 -> 22 (up) -> concat with the kept
// map cropped 26 -> 22 (offset 2) -> 20 -> 20 rows; columns 12 -> 10 -> 5 -> 3 -> 6 -> 4 -> 4.
TEST(SpatialLowering, AUnetsUpConvolutionAndCropFetchTheRowsOtherRanksHold) {
  const LoweredModel split = lower_file("unet-tall-tiny.json", {4, 1});
  ASSERT_EQ(split.layers.size(), 7u);
  // The up-convolution's 22 output rows in blocks [0,5) [5,11) [11,16) [16,22) read input rows
  // [0,3) [2,6) [5,8) [8,11) (row i makes rows 2i and 2i + 1) of 11 held as [0,2) [2,5) [5,8)
  // [8,11): ranks 0 and 1 each fetch one row of 3 columns of the 6 input channels.
  const Op* up = find_op(split.layers[3].forward, "layer3.up_conv.halo");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->collective, spec::CollectiveKind::kSendRecv);
  EXPECT_EQ(up->bytes, 2 * 6 * 3 * 4);
  EXPECT_EQ(*find_op(split.layers[3].backward, "layer3.up_conv.halo"), *up);  // the gradient back
  // The concat's blocks of 22 rows moved by the crop (2) read kept rows [2,7) [7,13) [13,18)
  // [18,24) of 26 held as [0,6) [6,13) [13,19) [19,26): ranks 0 and 3 fetch one row of the crop's
  // 6 columns of the 4 kept channels.
  const Op* crop = find_op(split.layers[4].forward, "layer4.halo");
  ASSERT_NE(crop, nullptr);
  EXPECT_EQ(crop->bytes, 2 * 4 * 6 * 4);
  EXPECT_EQ(*find_op(split.layers[4].backward, "layer4.halo"), *crop);
  // The per-pixel loss scores the most loaded rank's block: ceil(20 / 4) = 5 rows of 4 columns,
  // 3 logits each, in fp32 with the fp32 softmax statistics: 2 x 3 x 20 x (4 + 4) bytes.
  const Op* loss = find_op(split.layers[6].forward, "loss");
  ASSERT_NE(loss, nullptr);
  EXPECT_EQ(loss->bytes, 2 * 3 * 20 * 8);
  // Unsplit, neither fetches.
  const LoweredModel whole = lower_file("unet-tall-tiny.json", {1, 1});
  EXPECT_EQ(find_op(whole.layers[3].forward, "layer3.up_conv.halo"), nullptr);
  EXPECT_EQ(find_op(whole.layers[4].forward, "layer4.halo"), nullptr);
}

// A volume split by planes (tests/pytorch/unet3d-tiny.json over {h 1, w 1, d 2}, B = 2, fp32):
// its first 3x3x3 convolution (padding 1) keeps 8 planes of 10 x 10, each rank making 4 of them
// from 6 (one past its block each side, one of them padding); its 4 -> 2 plane convolution after
// the pool reads 2 planes past a 1-plane output block.
TEST(SpatialLowering, AVolumeSplitByPlanesExchangesWholePlanes) {
  const LoweredModel split = lower_file("unet3d-tiny.json", {1, 1, 2});
  // Layer 0: the neighbour's one plane of 10 x 10 of the 2 image channels.
  const Op* first = find_op(split.layers[0].forward, "layer0.conv.halo");
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->bytes, 2 * 2 * 100 * 4);
  // Layer 2 (4 channels, 4 planes of 5 x 5 to 2 planes of 3 x 3, no padding): rank 0 makes plane
  // 0 from planes 0-2 and holds 0-1; rank 1 makes plane 1 from planes 1-3 and holds 2-3: one
  // plane of 5 x 5 each.
  const Op* second = find_op(split.layers[2].forward, "layer2.conv.halo");
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->bytes, 2 * 4 * 25 * 4);
  // The block of the first convolution's output: 4 of the 8 planes.
  EXPECT_EQ(split.layers[0].output_bytes, 2 * 4 * (4 * 100) * 4);
  // A 2D model's grid has no planes to split.
  LoweringOptions o;
  o.spatial = {1, 1, 2};
  EXPECT_THROW(lower(test::small_cnn(32), o), InputError);
}

TEST(SpatialLowering, AModelThatDoesNotSplitIsRefused) {
  LoweringOptions o;
  o.spatial = {64, 1};
  EXPECT_THROW(lower(test::small_cnn(32), o), InputError);
}

}  // namespace
}  // namespace sextant::models
