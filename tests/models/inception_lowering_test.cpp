// Inception-v3's modules (spec/inception_module.hpp) as the model file reads them and the
// lowering counts them: the zoo model against torchvision's published size and cost, a module by
// hand, the maps, the op names the executor shares, and the refusals. The executor trains
// tests/pytorch/inception-tiny.json against an independent PyTorch build (cnn_reference.py).
#include <gtest/gtest.h>

#include "expect_input_error.hpp"
#include "lowered_ops.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/branch_parallel.hpp"
#include "sextant/spec/channel_split.hpp"
#include "sextant/spec/inception_module.hpp"
#include "sextant/spec/spatial_split.hpp"

namespace sextant::models {
namespace {

using test::find_op;

LoweredModel lower_one_sample(const spec::ModelSpec& m) {
  LoweringOptions o;
  o.micro_batch = 1;
  o.dtype = spec::Dtype::kFp32;
  return lower(m, o);
}

int64_t total_params(const LoweredModel& l) {
  int64_t n = 0;
  for (const Layer& layer : l.layers) n += layer.params;
  return n;
}

TEST(InceptionLowering, TheZooModelHasTorchvisionsSizeAndCost) {
  const LoweredModel l = lower_one_sample(zoo_model("inception-v3"));
  // torchvision's inception_v3 lists 27,161,264 parameters with its auxiliary classifier, which
  // the zoo model leaves out: conv 768->128 1x1 (98,304 + BN 256), conv 128->768 5x5 (2,457,600 +
  // BN 1,536), fc 768->1000 (769,000) = 3,326,696. 27,161,264 - 3,326,696 = 23,834,568.
  EXPECT_EQ(total_params(l), 27'161'264 - 3'326'696);
  // torchvision lists 5.71 GFLOPS (multiply-adds, 299x299, printed to 2 decimals): the forward
  // GEMM FLOPs are twice that, to the rounding (0.005 / 5.71 < 0.1%).
  double flops = 0;
  for (const Layer& layer : l.layers)
    for (const Op& op : layer.forward) flops += op.flops;
  EXPECT_NEAR(flops / 2, 5.71e9, 0.001 * 5.71e9);
}

TEST(InceptionLowering, ModuleACountedByHand) {
  // Mixed_5b, module a on the stem's 192 channels with pool_features 32 (the 8th lowered layer
  // after the stem's five convolutions and two pools). Convolutions: 1x1 192->64 (12,288);
  // 1x1 192->48 (9,216), 5x5 48->64 (76,800); 1x1 192->64 (12,288), 3x3 64->96 (55,296),
  // 3x3 96->96 (82,944); the pool's 1x1 192->32 (6,144): 254,976. Batch norms: 2 x (64 + 48 + 64
  // + 64 + 96 + 96 + 32) = 928. Total 255,904.
  const LoweredModel l = lower_one_sample(zoo_model("inception-v3"));
  const Layer& a = l.layers[7];
  EXPECT_EQ(a.params, 255'904);
  // Its 5x5 on 35x35 pixels: 2 x 1,225 x 64 x (48 x 25) FLOPs, under the name the executor uses.
  const Op* five = find_op(a.forward, spec::inception_step_scope("layer7", 1, 1));
  ASSERT_NE(five, nullptr);
  EXPECT_DOUBLE_EQ(five->flops, 2.0 * 1225 * 64 * 48 * 25);
  // Module e's split outputs are joined under their branch's scope (Mixed_7b: layer 16).
  EXPECT_NE(find_op(l.layers[16].forward, spec::inception_split_scope("layer16", 1, 1, 0)),
            nullptr);
  EXPECT_NE(find_op(l.layers[16].forward,
                    OpName(spec::inception_branch_scope("layer16", 1), OpId::kUnitConcat).str()),
            nullptr);
}

TEST(InceptionLowering, TheMapsThroughTheModules) {
  // 299 -> 149 -> 147 -> 147 -> 73 -> 73 -> 71 -> 35 through the stem; a: 35 (256, 288, 288
  // channels); b: 17 (384 + 96 + 288 = 768); c: 17 (4 x 192); d: 8 (320 + 192 + 768 = 1280);
  // e: 8 (320 + 2 x 768 + 192 = 2048).
  const std::vector<spec::CnnMap> maps = spec::cnn_layer_maps(zoo_model("inception-v3").cnn());
  const std::vector<std::array<int64_t, 2>> expected{{256, 35}, {288, 35}, {288, 35}, {768, 17},
                                                     {768, 17}, {768, 17}, {768, 17}, {768, 17},
                                                     {1280, 8}, {2048, 8}, {2048, 8}};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(maps[7 + i].c, expected[i][0]) << "module " << i;
    EXPECT_EQ(maps[7 + i].h, expected[i][1]) << "module " << i;
  }
  EXPECT_EQ(spec::inception_output_channels(spec::InceptionModule::kE, 1280, 0, 16), 128);
}

spec::Json tiny_inception_json() {
  return spec::Json{{"schema", "sextant.model/1"},
                    {"name", "tiny-inception"},
                    {"kind", "cnn"},
                    {"cnn",
                     {{"input", {{"channels", 3}, {"height", 9}, {"width", 9}}},
                      {"layers",
                       {{{"type", "conv"}, {"out_channels", 8}, {"kernel", 3}, {"bias", false}},
                        {{"type", "inception"}, {"module", "a"}, {"width", 4}, {"divisor", 16}},
                        {{"type", "inception"}, {"module", "b"}, {"divisor", 16}},
                        {{"type", "adaptive_avg_pool"}, {"output", 1}},
                        {{"type", "fc"}, {"out_features", 10}, {"bias", true}}}}}}};
}

TEST(InceptionLowering, RefusalsNameTheLayer) {
  spec::Json j = tiny_inception_json();
  j["cnn"]["layers"][1]["divisor"] = 3;
  EXPECT_INPUT_ERROR(spec::model_from_json(j, "m.json"),
                     "/cnn/layers/1/divisor = 3: must divide every channel count");
  j = tiny_inception_json();
  j["cnn"]["layers"][2]["width"] = 8;
  EXPECT_INPUT_ERROR(spec::model_from_json(j, "m.json"), "only modules a (pool_features)");
  j = tiny_inception_json();
  j["cnn"]["layers"][1].erase("width");
  EXPECT_INPUT_ERROR(spec::model_from_json(j, "m.json"), "/cnn/layers/1/width");
  j = tiny_inception_json();
  j["cnn"]["layers"][2]["blocks"] = 2;
  EXPECT_INPUT_ERROR(spec::model_from_json(j, "m.json"), "a reduction module (b, d) runs once");
  j = tiny_inception_json();
  j["cnn"]["layers"][1]["module"] = "f";
  EXPECT_INPUT_ERROR(spec::model_from_json(j, "m.json"), "/cnn/layers/1/module");
  j = tiny_inception_json();
  j["cnn"]["input"]["depth"] = 8;
  EXPECT_INPUT_ERROR(spec::model_from_json(j, "m.json"), "Inception's modules are 2D");
  // A reduction needs 3 rows: 4 make 2 after the stem's 3x3, too few for module b's window.
  j = tiny_inception_json();
  j["cnn"]["input"]["height"] = 4;
  EXPECT_INPUT_ERROR(spec::model_from_json(j, "m.json"), "the feature map shrinks");
  // Splits of a sample are not modelled for multi-branch units: refused by the one rule of each.
  const spec::ModelSpec m = spec::model_from_json(tiny_inception_json(), "tiny");
  EXPECT_NE(spec::spatial_split_problem(m, {2, 1}).find("Inception's modules"), std::string::npos);
  EXPECT_NE(spec::channel_split_problem(m.cnn(), 2).find("Inception's modules"), std::string::npos);
  // The round trip keeps the modules.
  EXPECT_EQ(spec::to_json(spec::model_from_json(spec::to_json(m), "again")), spec::to_json(m));
}

}  // namespace
}  // namespace sextant::models

namespace sextant::models {
namespace {

// Mixed_5b (module a on 192 channels of 35x35, pool_features 32), its branches' multiply-adds
// by hand: 1x1 192->64: 1225 x 64 x 192 = 15,052,800; 1x1 192->48 (11,289,600) and 5x5 48->64
// (1225 x 64 x 48 x 25 = 94,080,000): 105,369,600; 1x1 192->64 (15,052,800), 3x3 64->96
// (67,737,600) and 3x3 96->96 (101,606,400): 184,396,800; the pool's 1x1 192->32: 7,526,400.
const std::vector<double> kMixed5bMacs{15'052'800, 105'369'600, 184'396'800, 7'526'400};

spec::CnnLayer mixed_5b() {
  return zoo_model("inception-v3").cnn().layers[7];
}

TEST(BranchParallel, TheBranchesCostByHandAndGoToTheLeastLoadedRank) {
  EXPECT_EQ(spec::inception_branch_macs(mixed_5b(), {192, 1, 35, 35}), kMixed5bMacs);
  // What each branch makes: 64, 64, 96 and 32 channels of 35 x 35; module e (Mixed_7b on 1280
  // channels of 8 x 8) joins its 1x3 and 3x1 outputs inside two branches: 320, 768, 768, 192.
  std::vector<int64_t> channels;
  for (const spec::BranchOutput& o : spec::inception_branch_outputs(mixed_5b(), {192, 1, 35, 35})) {
    channels.push_back(o.map.c);
    EXPECT_EQ(o.map.h, 35);
  }
  EXPECT_EQ(channels, (std::vector<int64_t>{64, 64, 96, 32}));
  channels.clear();
  const spec::CnnLayer e = zoo_model("inception-v3").cnn().layers[16];
  for (const spec::BranchOutput& o : spec::inception_branch_outputs(e, {1280, 1, 8, 8}))
    channels.push_back(o.map.c);
  EXPECT_EQ(channels, (std::vector<int64_t>{320, 768, 768, 192}));
  // Longest first: the double 3x3 (184.4M) to rank 0, the 5x5 (105.4M) to rank 1, then the 1x1
  // (15.1M) and the pool (7.5M) to rank 1, still the less loaded (120.4M, then 127.9M).
  EXPECT_EQ(spec::branch_owners(kMixed5bMacs, 2), (std::vector<int64_t>{1, 1, 0, 1}));
  EXPECT_EQ(spec::most_loaded_rank(kMixed5bMacs, {1, 1, 0, 1}, 2), 0);
  // Four ranks: one branch each, costliest to rank 0.
  EXPECT_EQ(spec::branch_owners(kMixed5bMacs, 4), (std::vector<int64_t>{2, 1, 0, 3}));
  EXPECT_EQ(spec::branch_gather_block({96, 160}), 160);
}

LoweredModel lower_split(int64_t rank) {
  LoweringOptions o;
  o.micro_batch = 1;
  o.dtype = spec::Dtype::kFp32;
  o.tp = 2;
  o.branch_parallel = true;
  o.branch_rank = rank;
  return lower(zoo_model("inception-v3"), o);
}

TEST(BranchParallel, EachRankLowersItsBranchesAndTheJoinsCollectives) {
  const LoweredModel mine = lower_split(0), theirs = lower_split(1);
  // Rank 0 holds the double 3x3: 1x1 192->64 (12,288), 3x3 64->96 (55,296), 3x3 96->96 (82,944)
  // and their batch norms (2 x 256): 151,040 of the module's 255,904; rank 1 the rest.
  EXPECT_EQ(mine.layers[7].params, 151'040);
  EXPECT_EQ(theirs.layers[7].params, 255'904 - 151'040);
  EXPECT_NE(find_op(mine.layers[7].forward, spec::inception_step_scope("layer7", 2, 1)), nullptr);
  EXPECT_EQ(find_op(mine.layers[7].forward, spec::inception_step_scope("layer7", 1, 1)), nullptr);
  EXPECT_NE(find_op(theirs.layers[7].forward, spec::inception_step_scope("layer7", 1, 1)), nullptr);
  // The join: blocks of the larger part (rank 1's 64 + 64 + 32 = 160 channels, against rank 0's
  // 96) from each of the 2 ranks, 35 x 35 fp32: 2 x 160 x 1225 x 4 B.
  const std::string gather = OpName("layer7", OpId::kUnitBranchAllGather).str();
  ASSERT_NE(find_op(mine.layers[7].forward, gather), nullptr);
  EXPECT_EQ(find_op(mine.layers[7].forward, gather)->bytes, 2 * 160 * 1225 * 4);
  EXPECT_EQ(find_op(mine.layers[7].backward, gather), nullptr);  // every rank holds the gradient
  // Backward sums the ranks' parts of the input gradient: 192 x 1225 x 4 B, after the branches.
  const std::string sum = OpName("layer7", OpId::kUnitBranchAllReduce).str();
  ASSERT_NE(find_op(mine.layers[7].backward, sum), nullptr);
  EXPECT_EQ(mine.layers[7].backward.back().name, sum);
  EXPECT_EQ(find_op(mine.layers[7].backward, sum)->bytes, 192 * 1225 * 4);
  // The stem's layers are whole on both ranks; without a rank, each module's most loaded one.
  EXPECT_EQ(mine.layers[0].params, theirs.layers[0].params);
  LoweringOptions most = LoweringOptions{};
  most.micro_batch = 1;
  most.dtype = spec::Dtype::kFp32;
  most.tp = 2;
  most.branch_parallel = true;
  EXPECT_EQ(lower(zoo_model("inception-v3"), most).layers[7].params, 151'040);
}

TEST(BranchParallel, RefusalsAndThePlanFormat) {
  spec::Plan p;
  p.tp = 2;
  p.branch_parallel = true;
  EXPECT_EQ(spec::branch_parallel_problem(zoo_model("inception-v3"), p), "");
  EXPECT_NE(spec::branch_parallel_problem(zoo_model("resnet50"), p).find("has none"),
            std::string::npos);
  p.tp = 8;
  EXPECT_NE(spec::branch_parallel_problem(zoo_model("inception-v3"), p).find("2 to 4"),
            std::string::npos);
  p.tp = 2;
  p.spatial = {2, 1};
  EXPECT_NE(spec::branch_parallel_problem(zoo_model("inception-v3"), p).find("whole"),
            std::string::npos);
  p.spatial = {};
  p.dp = 4;
  p.global_batch = 8;
  EXPECT_EQ(p.name(), "dp4.tp2.pp1.z0.mb1.super");
  EXPECT_EQ(spec::to_json(p).at("branch_parallel"), true);
  EXPECT_EQ(spec::to_json(spec::plan_from_json(spec::to_json(p), "again")), spec::to_json(p));
  // Checked against the model with the rest of the plan.
  EXPECT_INPUT_ERROR(spec::validate_plan(p, zoo_model("resnet50"), 8, "p.json"),
                     "branch_parallel = true: splits the branches");
}

}  // namespace
}  // namespace sextant::models
