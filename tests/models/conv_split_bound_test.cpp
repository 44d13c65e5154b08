// Per-op convolution splits bounded in bytes (issue 60; models/conv_split_bound.hpp): the
// convolutions the lowering records against ResNet-50's architecture (He et al. 2016, Table 1;
// torchvision's parameter count), the bound by hand, and its least exchange against the one
// resharding rule (spec/sharding.hpp).
#include "sextant/models/conv_split_bound.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "sextant/models/lowering.hpp"
#include "sextant/models/sharded_ops.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/sharding.hpp"

namespace sextant::models {
namespace {

LoweredModel resnet50(int64_t micro_batch) {
  LoweringOptions o;
  o.micro_batch = micro_batch;
  o.dtype = spec::Dtype::kBf16;
  return lower(zoo_model("resnet50"), o);
}

// The bound of `conv` (a failure, and an empty bound, when there is none).
ConvSplitBound named(const std::vector<ConvSplitBound>& bounds, const std::string& conv) {
  auto it = std::find_if(bounds.begin(), bounds.end(),
                         [&](const ConvSplitBound& b) { return b.conv == conv; });
  if (it != bounds.end()) return *it;
  ADD_FAILURE() << "no convolution " << conv;
  return {};
}

// conv5_x's first 3x3 convolution (torchvision's v1.5 strides it): 512 channels of 14 x 14 in,
// 7 x 7 out, 512 x 512 x 3 x 3 filters, no bias, batch norm's scale and shift.
constexpr int64_t kIn = 14 * 14 * 512, kOut = 7 * 7 * 512, kParams = 512 * 512 * 9 + 2 * 512;

TEST(ConvSplitBound, TheLoweringRecordsEveryConvolutionOnce) {
  const LoweredModel lowered = resnet50(32);
  int64_t convs = 0, params = 0;
  for (const Layer& layer : lowered.layers) {
    for (const ConvShape& c : layer.convolutions) {
      ++convs;
      params += c.params;
      if (layer.name == "layer15" && c.unit == "conv2") {
        EXPECT_EQ(c.input, kIn);
        EXPECT_EQ(c.output, kOut);
        EXPECT_EQ(c.params, kParams);
      }
    }
  }
  // 1 stem + 16 bottlenecks x 3 + 4 downsamples = 53 convolutions; torchvision's 25,557,032
  // parameters less the classifier's 2048 x 1000 + 1000.
  EXPECT_EQ(convs, 53);
  EXPECT_EQ(params, 25'557'032 - 2'049'000);
}

// Every parameter of a CNN is a convolution's (with its batch norm) or a classifier layer's: the
// ResNet blocks' convolutions (add_conv) and the Inception modules' and AmoebaNet cells' (their
// unit builder) are all recorded.
TEST(ConvSplitBound, EveryParameterIsAConvolutionsOrTheClassifiers) {
  for (const char* name : {"resnet50", "inception-v3", "vgg19", "amoebanet-d", "unet"}) {
    LoweringOptions o;
    o.micro_batch = 2;
    const LoweredModel lowered = lower(zoo_model(name), o);
    int64_t convs = 0, fc = 0, all = 0;
    for (const Layer& layer : lowered.layers) {
      all += layer.params;
      for (const ConvShape& c : layer.convolutions) convs += c.params;
      if (std::any_of(layer.forward.begin(), layer.forward.end(),
                      [](const Op& op) { return op.id == OpId::kUnitFc; }))
        fc += layer.params;
    }
    EXPECT_GT(convs, 0) << name;
    EXPECT_EQ(convs + fc, all) << name;
  }
}

TEST(ConvSplitBound, ByHandAtThirtyTwoImagesAndAtOne) {
  // 64 replicas, bf16 maps, fp32 gradients. Moved: 2 (R - 1) b min(in, out) x 2 bytes; saved:
  // 2 (R - 1) / R x params x 4 bytes = 18,590,745.6 bytes.
  const std::vector<ConvSplitBound> at32 = conv_split_bounds(resnet50(32), 32, 64, 2, 4);
  const ConvSplitBound b32 = named(at32, "layer15.conv2");
  EXPECT_DOUBLE_EQ(b32.least_moved_bytes, 2.0 * 63 * 32 * kOut * 2);  // 202,309,632
  EXPECT_DOUBLE_EQ(b32.most_saved_bytes, 2.0 * 63 / 64 * kParams * 4);
  EXPECT_FALSE(b32.could_pay());
  EXPECT_TRUE(std::none_of(at32.begin(), at32.end(), [](auto& b) { return b.could_pay(); }));
  // One image a replica: 6,322,176 bytes moved against the same 18.6 MB saved.
  const std::vector<ConvSplitBound> at1 = conv_split_bounds(resnet50(1), 1, 64, 2, 4);
  const ConvSplitBound b1 = named(at1, "layer15.conv2");
  EXPECT_DOUBLE_EQ(b1.least_moved_bytes, 2.0 * 63 * kOut * 2);
  EXPECT_TRUE(b1.could_pay());
  EXPECT_EQ(closest_to_paying(at1).conv, "layer15.conv2");
  // Net of each that could pay: at 32 images none, so nothing; at one image at least this one's.
  EXPECT_EQ(most_net_saved_bytes(at32), 0.0);
  EXPECT_GE(most_net_saved_bytes(at1), b1.most_saved_bytes - b1.least_moved_bytes);
  // The stem (3 channels in, 64 x 112 x 112 out, 9,536 parameters) never could.
  EXPECT_FALSE(named(at1, "layer0.conv").could_pay());
}

TEST(ConvSplitBound, TheLeastExchangeIsTheReshardingRulesReduceScatter) {
  // Splitting the channels it contracts leaves each rank partial sums of the group's R x b
  // outputs; the rule reduce-scatters them back onto the batch over d: the whole tensor's
  // R x b x out x 2 bytes, of which a rank sends (R - 1) / R; backward all-gathers the gradient
  // as many. Twice that is the bound's least exchange for this convolution (out < in).
  const int64_t r = 4, b = 8;
  const spec::DeviceMesh mesh{{{"d", r}}};
  const std::map<std::string, int64_t> extents{{"b", r * b}, {"o", kOut}};
  const std::vector<spec::ReshardStep> steps =
      spec::reshard(mesh, layout_of({"b", "o"}, extents, {}, {"d"}),
                    layout_of({"b", "o"}, extents, {{"b", {"d"}}}), 2);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].kind, spec::ReshardKind::kReduceScatter);
  const double sent = static_cast<double>(steps[0].bytes) * (r - 1) / r;
  const ConvSplitBound bound = named(conv_split_bounds(resnet50(b), b, r, 2, 4), "layer15.conv2");
  EXPECT_DOUBLE_EQ(bound.least_moved_bytes, 2 * sent);
}

TEST(ConvSplitBound, NothingToSplitOverOneReplicaOrWithoutConvolutions) {
  EXPECT_TRUE(conv_split_bounds(resnet50(8), 8, 1, 2, 4).empty());
  LoweringOptions o;
  o.micro_batch = 2;
  EXPECT_TRUE(conv_split_bounds(lower(zoo_model("gpt2-124m"), o), 2, 8, 2, 4).empty());
}

}  // namespace
}  // namespace sextant::models
