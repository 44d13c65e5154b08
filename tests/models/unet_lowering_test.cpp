// Volumes and U-Net's skip connections (spec CnnSpec::depth, up_conv, concat, skip) as the model
// file reads them and the lowering counts them: a tiny volumetric U-Net by hand, and the 3D U-Net
// of the zoo against its paper.
#include <gtest/gtest.h>

#include "expect_input_error.hpp"
#include "lowered_ops.hpp"
#include "sextant/models/counts.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/channel_split.hpp"
#include "sextant/spec/spatial_split.hpp"

namespace sextant::models {
namespace {

using test::find_op;

// 2 channels of 6x6x6 voxels: a 3x3x3 conv to 4 channels (4x4x4, kept), a 2x2x2 max pool
// (2x2x2), a 1x1x1 conv to 8, a 2x2x2 up-convolution back to 4 channels at 4x4x4, the concat
// with the kept map (8 channels) and a 1x1x1 head to 3 labels per voxel. No biases, no norms.
spec::Json tiny_unet_json() {
  auto conv = [](int64_t out, int64_t k) {
    return spec::Json{
        {"type", "conv"}, {"out_channels", out}, {"kernel", k}, {"bias", false}, {"relu", true}};
  };
  spec::Json kept = conv(4, 3);
  kept["skip"] = true;
  return spec::Json{{"schema", "sextant.model/1"},
                    {"name", "tiny-unet"},
                    {"kind", "cnn"},
                    {"cnn",
                     {{"input", {{"channels", 2}, {"depth", 6}, {"height", 6}, {"width", 6}}},
                      {"layers",
                       {kept,
                        {{"type", "max_pool"}, {"kernel", 2}},
                        conv(8, 1),
                        {{"type", "up_conv"}, {"out_channels", 4}, {"kernel", 2}, {"bias", false}},
                        {{"type", "concat"}},
                        conv(3, 1)}}}}};
}

LoweredModel lower_fp32(const spec::ModelSpec& m, int64_t micro_batch = 1) {
  LoweringOptions o;
  o.micro_batch = micro_batch;
  o.dtype = spec::Dtype::kFp32;
  return lower(m, o);
}

TEST(UnetLowering, ATinyVolumetricUnetCountedByHand) {
  const spec::ModelSpec m = spec::model_from_json(tiny_unet_json(), "tiny");
  ASSERT_TRUE(m.cnn().volumes());
  const LoweredModel l = lower_fp32(m);
  ASSERT_EQ(l.layers.size(), 6u);
  // One sample, fp32. Layer 0: 4x4x4 = 64 output voxels, 4 filters over 2 x 27 inputs:
  // 2 x 64 x 4 x 54 FLOPs, 4 x 2 x 27 weights.
  EXPECT_DOUBLE_EQ(find_op(l.layers[0].forward, "layer0.conv")->flops, 2.0 * 64 * 4 * 54);
  EXPECT_EQ(l.layers[0].params, 4 * 2 * 27);
  // Layer 2: 8 voxels, 8 filters over 4 channels.
  EXPECT_DOUBLE_EQ(find_op(l.layers[2].forward, "layer2.conv")->flops, 2.0 * 8 * 8 * 4);
  // Layer 3, the up-convolution: each of the 8 input voxels meets 4 x 8 outputs' weights over
  // its 8 channels: 2 x 8 x 32 x 8 FLOPs, 8 x 4 x 8 weights.
  EXPECT_DOUBLE_EQ(find_op(l.layers[3].forward, "layer3.up_conv")->flops, 2.0 * 8 * 32 * 8);
  EXPECT_EQ(l.layers[3].params, 8 * 4 * 8);
  // Layer 4, the concat: the joined 8-channel 4x4x4 map read and written, 2 x 8 x 64 x 4 bytes.
  EXPECT_EQ(find_op(l.layers[4].forward, "layer4.concat")->bytes, 2 * 8 * 64 * 4);
  // Layer 5, the head: 64 voxels, 3 filters over 8 channels; the loss over 3 logits a voxel.
  EXPECT_DOUBLE_EQ(find_op(l.layers[5].forward, "layer5.conv")->flops, 2.0 * 64 * 3 * 8);
  const Op* loss = find_op(l.layers[5].forward, "loss");
  ASSERT_NE(loss, nullptr);
  EXPECT_EQ(loss->shape, (std::vector<int64_t>{1, 3, 64}));
  EXPECT_EQ(loss->bytes, 3 * 64 * (4 + 4));
  // A stage ending between the keep and the concat also hands on the kept map (4 x 64 x 4 =
  // 1024 bytes): layer 0's output is that map itself (1024), layer 1's pooled map 4 x 8 x 4 +
  // 1024, layer 2's 8 x 8 x 4 + 1024, layer 3's 4 x 64 x 4 + 1024; after the concat, its own.
  const int64_t kept = 4 * 64 * 4;
  EXPECT_EQ(l.layers[0].output_bytes, kept);
  EXPECT_EQ(l.layers[1].output_bytes, 4 * 8 * 4 + kept);
  EXPECT_EQ(l.layers[2].output_bytes, 8 * 8 * 4 + kept);
  EXPECT_EQ(l.layers[3].output_bytes, 4 * 64 * 4 + kept);
  EXPECT_EQ(l.layers[4].output_bytes, 8 * 64 * 4);
  EXPECT_EQ(l.layers[5].output_bytes, 3 * 64 * 4);
  // The model file round-trips.
  EXPECT_EQ(spec::to_json(spec::model_from_json(spec::to_json(m), "again")), spec::to_json(m));
}

TEST(UnetLowering, TheZoos3dUnetHasThePapersShapeAndParameters) {
  // Cicek et al. 2016: 19,069,955 parameters (convolution weights and biases, up-convolutions
  // without biases). Caffe's BatchNorm layer learns nothing; ours learns a scale and a shift per
  // channel of the 14 normalised 3x3x3 convolutions: 2 x (32 + 64 + 64 + 128 + 128 + 256 + 256 +
  // 512 + 256 + 256 + 128 + 128 + 64 + 64) = 2 x 2336 on top.
  const spec::ModelSpec m = zoo_model("unet3d");
  EXPECT_EQ(parameter_count(m), 19'069'955 + 2 * 2336);
  const LoweredModel l = lower_fp32(m);
  // Its 132x132x116 input segmented at 44x44x28 voxels (the paper's Fig. 1), 3 labels each.
  const Op* loss = find_op(l.layers.back().forward, "loss");
  ASSERT_NE(loss, nullptr);
  EXPECT_EQ(loss->shape, (std::vector<int64_t>{1, 3, 28 * 44 * 44}));
  // The first convolution: 114 x 130 x 130 voxels, 32 filters over 3 x 27 inputs.
  EXPECT_DOUBLE_EQ(find_op(l.layers[0].forward, "layer0.conv")->flops,
                   2.0 * 114 * 130 * 130 * 32 * 81);
}

TEST(UnetLowering, TheZoos2dUnetHasThePapersShape) {
  // Ronneberger et al. 2015, Fig. 1: 3x3 convolutions (weights and biases) 1-64-64, 64-128-128,
  // 128-256-256, 256-512-512, 512-1024-1024; up-convolutions 2c -> c (2x2, biases) for c = 512,
  // 256, 128, 64, each followed by 3x3 convolutions 2c -> c -> c; a 1x1 head 64 -> 2.
  auto conv = [](int64_t in, int64_t out, int64_t k) { return in * out * k * k + out; };
  int64_t expected = conv(1, 64, 3) + conv(64, 64, 3);
  for (int64_t c = 128; c <= 1024; c *= 2) expected += conv(c / 2, c, 3) + conv(c, c, 3);
  for (int64_t c = 512; c >= 64; c /= 2)
    expected += conv(2 * c, c, 2) + conv(2 * c, c, 3) + conv(c, c, 3);
  expected += conv(64, 2, 1);
  const spec::ModelSpec m = zoo_model("unet");
  EXPECT_EQ(expected, 31'030'658);
  EXPECT_EQ(parameter_count(m), expected);
  // 572x572 in, 388x388 out: each level's two valid convolutions take 4 rows (568, 280, 136, 64
  // before the pools, 28 at the bottom), each up level doubles and takes 4 (52, 100, 196, 388).
  const LoweredModel l = lower_fp32(m);
  const Op* loss = find_op(l.layers.back().forward, "loss");
  ASSERT_NE(loss, nullptr);
  EXPECT_EQ(loss->shape, (std::vector<int64_t>{1, 2, 388 * 388}));
  // It splits spatially to its loss: over a 2x2 grid each rank scores a 194x194 block.
  EXPECT_EQ(spec::spatial_split_problem(m, {2, 2}), "");
  LoweringOptions o;
  o.dtype = spec::Dtype::kFp32;
  o.spatial = {2, 2};
  const LoweredModel split = lower(m, o);
  const Op* block_loss = find_op(split.layers.back().forward, "loss");
  ASSERT_NE(block_loss, nullptr);
  EXPECT_EQ(block_loss->shape, (std::vector<int64_t>{1, 2, 194 * 194}));
}

TEST(UnetLowering, ModelFilesWithBrokenSkipsAreRefusedNamingTheLayer) {
  spec::Json orphan = tiny_unet_json();
  orphan["cnn"]["layers"][0].erase("skip");
  EXPECT_INPUT_ERROR(spec::model_from_json(orphan, "m.json"),
                     "/cnn/layers/4 = \"concat\": needs an earlier layer with \"skip\": true");
  spec::Json unjoined = tiny_unet_json();
  unjoined["cnn"]["layers"][5]["skip"] = true;  // the head's map, kept with nothing after it
  EXPECT_INPUT_ERROR(spec::model_from_json(unjoined, "m.json"),
                     "1 map(s) kept with \"skip\" but never joined by a concat");
  // A kept map smaller than the decoder's: the 2x2x2 pool output kept, joined at 4x4x4.
  spec::Json small = tiny_unet_json();
  small["cnn"]["layers"][0].erase("skip");
  small["cnn"]["layers"][1]["skip"] = true;
  EXPECT_INPUT_ERROR(spec::model_from_json(small, "m.json"),
                     "the kept map (2x2x2) is smaller than the current one (4x4x4)");
  spec::Json bottleneck = tiny_unet_json();
  bottleneck["cnn"]["layers"][2] = {
      {"type", "bottleneck"}, {"mid_channels", 2}, {"out_channels", 8}};
  EXPECT_INPUT_ERROR(spec::model_from_json(bottleneck, "m.json"), "not for volumes");
  spec::Json pooled_end = tiny_unet_json();
  pooled_end["cnn"]["layers"].push_back({{"type", "max_pool"}, {"kernel", 2}});
  EXPECT_INPUT_ERROR(spec::model_from_json(pooled_end, "m.json"),
                     "must end with an fc layer (the classifier) or a conv");
}

TEST(UnetLowering, ChannelSplitsOfVolumesAndSkipsAreRefusedUntilModelled) {
  const spec::ModelSpec m = spec::model_from_json(tiny_unet_json(), "tiny");
  EXPECT_NE(spec::channel_split_problem(m.cnn(), 2).find("volumes, U-Net's kept maps"),
            std::string::npos);
  // (A spatial split of it is modelled: spatial_lowering_test.cpp.)
  EXPECT_EQ(spec::spatial_split_problem(m, {2, 1}), "");
  // Unsplit it is planned as data and pipeline parallelism.
  EXPECT_EQ(spec::channel_split_problem(m.cnn(), 1), "");
  // A 2D per-pixel head without skips: its logits would stay split by channel.
  spec::CnnSpec head;
  head.in_channels = 2;
  head.height = head.width = 8;
  spec::CnnLayer conv;
  conv.out_channels = 4;
  conv.kernel = 3;
  head.layers = {conv, conv};
  EXPECT_NE(spec::channel_split_problem(head, 2).find("a per-pixel head"), std::string::npos);
}

}  // namespace
}  // namespace sextant::models
