// Training FLOPs per iteration against Narayanan et al. (SC'21), computed in the test from the
// paper's closed forms.
#include <gtest/gtest.h>

#include "sextant/models/counts.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/zoo.hpp"

namespace sextant::models {
namespace {

constexpr double kRelTol = 1e-12;

double narayanan_no_recompute(double B, double s, double l, double h, double V) {
  // SC'21 §5.1 without recomputation: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)).
  return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
}

double narayanan_full_recompute(double B, double s, double l, double h, double V) {
  // SC'21 eq. (3), with the recomputed forward: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

TEST(Flops, MatchesNarayananForGptModels) {
  for (const char* name : {"gpt3-175b", "megatron-1t", "gpt2-124m", "megatron-145b"}) {
    spec::ModelSpec m = zoo_model(name);
    const spec::TransformerSpec& t = m.transformer();
    const double B = 1536, s = static_cast<double>(t.seq_len), l = static_cast<double>(t.layers),
                 h = static_cast<double>(t.hidden), V = static_cast<double>(t.vocab);
    StepFlops none = step_flops(m, 1536, t.seq_len, spec::Recompute::kNone);
    EXPECT_NEAR(none.model / narayanan_no_recompute(B, s, l, h, V), 1.0, kRelTol) << name;
    EXPECT_DOUBLE_EQ(none.hardware, none.model);
    StepFlops full = step_flops(m, 1536, t.seq_len, spec::Recompute::kFull);
    EXPECT_NEAR(full.hardware / narayanan_full_recompute(B, s, l, h, V), 1.0, kRelTol) << name;
    EXPECT_DOUBLE_EQ(full.model, none.model);
  }
}

TEST(Flops, SelectiveRecomputeAddsOnlyTheAttentionCore) {
  spec::ModelSpec m = zoo_model("gpt3-175b");
  const double B = 8, s = 2048, l = 96, h = 12288;
  StepFlops none = step_flops(m, 8, 2048, spec::Recompute::kNone);
  StepFlops sel = step_flops(m, 8, 2048, spec::Recompute::kSelective);
  // The core is QK^T and (softmax)V: 4 B s^2 h FLOPs per layer forward.
  EXPECT_NEAR(sel.hardware - none.hardware, 4 * B * s * s * h * l, 1e-6 * none.hardware);
}

TEST(Flops, TensorParallelRanksSplitTheMatmuls) {
  // Megatron's padded vocabulary (51200) divides by 8, so every layer splits exactly.
  spec::ModelSpec m = zoo_model("megatron-7.5b");
  LoweredModel one = lower(m, {2, 0, spec::Dtype::kBf16, 1, false});
  LoweredModel eight = lower(m, {2, 0, spec::Dtype::kBf16, 8, false});
  for (size_t i = 0; i < one.layers.size(); ++i) {
    EXPECT_NEAR(eight.layers[i].forward_flops() * 8, one.layers[i].forward_flops(),
                1e-9 * one.layers[i].forward_flops())
        << one.layers[i].name;
  }
}

TEST(Flops, ForwardFlopsPerTokenIsAboutTwiceTheParameters) {
  // The "2N" rule of thumb (Kaplan et al. 2020) holds within the attention and embedding terms.
  spec::ModelSpec m = zoo_model("llama2-7b");
  double per_token = forward_flops_per_token(m, 4096);
  double n = static_cast<double>(parameter_count(m));
  EXPECT_GT(per_token, 2 * n * 0.95);
  EXPECT_LT(per_token, 2 * n * 1.35);
}

TEST(Flops, CnnForwardMatchesPublishedMacs) {
  // ResNet-50 at 224x224: 4.09 GMACs (torchvision / fvcore); AlexNet: 0.71 GMACs; VGG-19: 19.6;
  // WRN-50-2: 11.398 (torchvision's Wide_ResNet50_2_Weights "_ops").
  struct Row {
    const char* name;
    double gmacs;
    double tol;
  };
  for (Row r : {Row{"resnet50", 4.09, 0.02}, Row{"alexnet", 0.714, 0.02}, Row{"vgg19", 19.63, 0.01},
                Row{"wrn50-2", 11.398, 0.01}}) {
    spec::ModelSpec m = zoo_model(r.name);
    double macs = forward_flops_per_token(m, 1) / 2;
    EXPECT_NEAR(macs / 1e9 / r.gmacs, 1.0, r.tol) << r.name << ": " << macs / 1e9 << " GMACs";
  }
}

}  // namespace
}  // namespace sextant::models
