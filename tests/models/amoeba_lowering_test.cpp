// AmoebaNet-D's cells (spec/amoeba_cell.hpp) as the model file reads them and the lowering counts
// them: a tiny cell network by hand (the whole AmoebaNet-D of the zoo is checked against an
// independent PyTorch build by tests/cli/amoebanet_reference.sh), its pipeline boundaries, and
// the refusals.
#include <gtest/gtest.h>

#include "expect_input_error.hpp"
#include "lowered_ops.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/spec/amoeba_cell.hpp"
#include "sextant/spec/branch_parallel.hpp"
#include "sextant/spec/channel_split.hpp"
#include "sextant/spec/spatial_split.hpp"

namespace sextant::models {
namespace {

using test::find_op;

// 3 channels of 8x8: a 3x3 conv to 8 channels (padding 1, batch norm), two normal cells of 8
// filters, a reduction cell of 16, a global pool and an fc to 10 classes.
spec::Json tiny_amoeba_json() {
  spec::Json normal = {{"type", "amoeba_cell"}, {"filters", 8}, {"blocks", 2}};
  spec::Json reduction = {{"type", "amoeba_cell"}, {"filters", 16}, {"reduction", true}};
  return spec::Json{{"schema", "sextant.model/1"},
                    {"name", "tiny-amoeba"},
                    {"kind", "cnn"},
                    {"cnn",
                     {{"input", {{"channels", 3}, {"height", 8}, {"width", 8}}},
                      {"layers",
                       {{{"type", "conv"},
                         {"out_channels", 8},
                         {"kernel", 3},
                         {"padding", 1},
                         {"bias", false},
                         {"batch_norm", true}},
                        normal,
                        reduction,
                        {{"type", "adaptive_avg_pool"}, {"output", 1}},
                        {{"type", "fc"}, {"out_features", 10}, {"bias", true}}}}}}};
}

LoweredModel lower_amoeba_fp32(const spec::ModelSpec& m) {
  LoweringOptions o;
  o.micro_batch = 1;
  o.dtype = spec::Dtype::kFp32;
  return lower(m, o);
}

// One normal cell's edges at c = 8 (c/4 = 2), by hand: three conv_1x1 edges, each 8 x 8 weights
// and a batch norm's 2 x 8: 3 x 80 = 240; two conv_1x7_7x1 edges, each 1x1 8->2 (16 + 4), 1x7
// 2->2 (28 + 4), 7x1 2->2 (28 + 4), 1x1 2->8 (16 + 16): 2 x 116 = 232; pools and identities none.
constexpr int64_t kNormalEdges = 240 + 232;

TEST(AmoebaLowering, ATinyCellNetworkCountedByHand) {
  const spec::ModelSpec m = spec::model_from_json(tiny_amoeba_json(), "tiny");
  ASSERT_TRUE(m.cnn().has_cells());
  const LoweredModel l = lower_amoeba_fp32(m);
  ASSERT_EQ(l.layers.size(), 6u);  // stem, 2 normal cells, the reduction cell, pool, fc
  // Cell 1 reads the stem's 8 channels twice: reduce1 is ReLU-1x1 8->8-BN (64 + 16), the second
  // input already has 8 channels and stays as it is.
  EXPECT_EQ(l.layers[1].params, 80 + kNormalEdges);
  // reduce1 on 64 pixels: 2 x 64 x 8 x 8 FLOPs.
  EXPECT_DOUBLE_EQ(find_op(l.layers[1].forward, "layer1.reduce1")->flops, 2.0 * 64 * 8 * 8);
  EXPECT_EQ(find_op(l.layers[1].forward, "layer1.reduce2"), nullptr);
  // Cell 2 reads cell 1's output (4 states x 8 = 32 channels) and cell 1's input (8 channels):
  // reduce1 32->8 (256 + 16), the second input as it is.
  EXPECT_EQ(l.layers[2].params, 272 + kNormalEdges);
  // The reduction cell (c = 16, c/4 = 4) reads cell 2's 32 channels and cell 1's 32: both reduced
  // by ReLU-1x1 32->16-BN (512 + 32 each); its edges: conv_3x3 on an input (1x1 16->4 64 + 8,
  // 3x3 4->4 stride 2 144 + 8, 1x1 4->16 64 + 32: 320), conv_1x7_7x1 (64 + 8, 112 + 8, 112 + 8,
  // 64 + 32: 408) and conv_1x1 (256 + 32) on nodes; pools and identities none.
  EXPECT_EQ(l.layers[3].params, 2 * 544 + 320 + 408 + 288);
  // Its strided 3x3 convolution makes 4x4 from 8x8: 2 x 16 pixels x 4 x (4 x 9) FLOPs.
  EXPECT_DOUBLE_EQ(find_op(l.layers[3].forward, "layer3.node1.b.conv2")->flops, 2.0 * 16 * 4 * 36);
  // The fc reads 3 states x 16 = 48 pooled channels.
  EXPECT_EQ(l.layers[5].params, 48 * 10 + 10);
  // Backward runs each forward op again (GEMMs twice).
  EXPECT_DOUBLE_EQ(find_op(l.layers[1].backward, "layer1.reduce1")->flops, 2 * 2.0 * 64 * 8 * 8);
}

TEST(AmoebaLowering, APipelineStageEndingBeforeACellAlsoSendsTheCellsSecondInput) {
  // fp32, one sample. Cell 1 hands cell 2 its output (32 x 8 x 8) and its own input (8 x 8 x 8):
  // (2048 + 512) x 4 B. Cell 2 hands the reduction cell its output and input, both 32 x 8 x 8:
  // 4096 x 4 B. The reduction cell, before the pool, only its output: 48 x 4 x 4 x 4 B.
  const LoweredModel l = lower_amoeba_fp32(spec::model_from_json(tiny_amoeba_json(), "tiny"));
  EXPECT_EQ(l.layers[1].output_bytes, (2048 + 512) * 4);
  EXPECT_EQ(l.layers[2].output_bytes, 4096 * 4);
  EXPECT_EQ(l.layers[3].output_bytes, 48 * 16 * 4);
}

TEST(AmoebaLowering, TheGenotype) {
  // The normal cell joins the previous output's reduction and nodes 1, 2 and 4 (states 0, 3, 4,
  // 6); the reduction cell nodes 2-4. Edges reading an input stride 2 in a reduction cell only.
  EXPECT_EQ(spec::amoeba_output_channels(8, false), 32);
  EXPECT_EQ(spec::amoeba_output_channels(8, true), 24);
  const spec::AmoebaGenotype& r = spec::amoeba_genotype(true);
  EXPECT_EQ(spec::amoeba_edge_stride(true, r.edges[0]), 2);   // reads state 0
  EXPECT_EQ(spec::amoeba_edge_stride(true, r.edges[2]), 1);   // reads node 0
  EXPECT_EQ(spec::amoeba_edge_stride(false, r.edges[0]), 1);  // a normal cell never strides
}

TEST(AmoebaLowering, RefusalsNameTheLayer) {
  spec::Json j = tiny_amoeba_json();
  j["cnn"]["layers"][1]["filters"] = 6;
  EXPECT_INPUT_ERROR(spec::model_from_json(j, "m.json"),
                     "/cnn/layers/1/filters = 6: must be a multiple of 4");
  j = tiny_amoeba_json();
  j["cnn"]["input"]["height"] = 7;
  j["cnn"]["input"]["width"] = 7;
  EXPECT_INPUT_ERROR(spec::model_from_json(j, "m.json"), "needs even rows and columns");
  j = tiny_amoeba_json();
  j["cnn"]["layers"][2]["blocks"] = 2;
  EXPECT_INPUT_ERROR(spec::model_from_json(j, "m.json"), "a reduction cell runs once");
  j = tiny_amoeba_json();
  j["cnn"]["input"]["depth"] = 8;
  EXPECT_INPUT_ERROR(spec::model_from_json(j, "m.json"), "AmoebaNet's cells are 2D");
  // Splits of a sample are not modelled for cells: refused by the one rule of each.
  const spec::ModelSpec m = spec::model_from_json(tiny_amoeba_json(), "tiny");
  EXPECT_NE(spec::spatial_split_problem(m, {2, 1}).find("AmoebaNet's cells"), std::string::npos);
  EXPECT_NE(spec::channel_split_problem(m.cnn(), 2).find("AmoebaNet's cells"), std::string::npos);
  // The round trip keeps the cells.
  EXPECT_EQ(spec::to_json(spec::model_from_json(spec::to_json(m), "again")), spec::to_json(m));
}

TEST(AmoebaLowering, SuperSplitsANormalCellIntoThreeGroupsOfNodes) {
  // Node 3 reads node 0 and node 4 reads node 3: one group; nodes 1 and 2 read only the reduced
  // inputs. Every node of a reduction cell reads node 0 or 1: one group.
  EXPECT_EQ(spec::amoeba_node_groups(false), (std::vector<int>{0, 1, 2, 0, 0}));
  EXPECT_EQ(spec::amoeba_node_groups(true), (std::vector<int>{0, 0, 0, 0, 0}));
  // A normal cell of 8 filters on 8 x 8 (64 pixels), multiply-adds by hand: conv_1x1 64 x 8 x 8 =
  // 4096; conv_1x7_7x1 1x1 8->2 (1024), 1x7 2->2 (64 x 2 x 14 = 1792), 7x1 (1792), 1x1 2->8
  // (1024): 5632. Group 0: node 0's conv_1x1 and node 4's (8192); group 1: node 1's conv_1x7_7x1
  // (5632); group 2: node 2's conv_1x1 and conv_1x7_7x1 (9728).
  spec::CnnLayer cell;
  cell.kind = spec::CnnLayerKind::kAmoebaCell;
  cell.filters = 8;
  const spec::CellPlacement p = spec::amoeba_placement(cell, 8, 8, 2);
  EXPECT_EQ(p.group_macs, (std::vector<double>{8192, 5632, 9728}));
  // Longest first on 2 ranks: group 2 to rank 0, group 0 to rank 1, group 1 to rank 1 (8192 <
  // 9728); the joined reduced input (state 0, no work) to the less loaded rank 0.
  EXPECT_EQ(p.node_owner, (std::vector<int64_t>{1, 1, 0, 1, 1}));
  EXPECT_EQ(p.join_owner, (std::vector<int64_t>{0, 1, 0, 1}));  // states 0, 3, 4, 6
  EXPECT_EQ(p.most_loaded, 1);
}

TEST(AmoebaLowering, ASplitCellLowersItsNodesTheJoinAndTheSum) {
  // The tiny network's first normal cell (layer 1: 8 filters on 8 x 8, as above) on tp rank 0
  // of 2, fp32, one sample: the reductions, node 2 only, the join's gather of the larger part
  // (rank 1: nodes 1 and 4, 16 channels) from both ranks: 2 x 16 x 64 x 4 B; in backward the
  // reduced states' gradients (2 x 8 x 64 x 4 B) summed before the reductions' backward.
  const spec::ModelSpec m = spec::model_from_json(tiny_amoeba_json(), "tiny");
  LoweringOptions o;
  o.micro_batch = 1;
  o.dtype = spec::Dtype::kFp32;
  o.tp = 2;
  o.branch_parallel = true;
  o.branch_rank = 0;
  const LoweredModel lowered = lower(m, o);
  const Layer& cell = lowered.layers[1];
  EXPECT_NE(find_op(cell.forward, "layer1.node2.a"), nullptr);
  EXPECT_EQ(find_op(cell.forward, "layer1.node1.b.conv1"), nullptr);
  EXPECT_NE(find_op(cell.forward, "layer1.reduce1"), nullptr);
  const Op* gather = find_op(cell.forward, OpName("layer1", OpId::kUnitBranchAllGather).str());
  ASSERT_NE(gather, nullptr);
  EXPECT_EQ(gather->bytes, 2 * 16 * 64 * 4);
  const std::string sum = OpName("layer1", OpId::kUnitBranchAllReduce).str();
  const auto at = std::find_if(cell.backward.begin(), cell.backward.end(),
                               [&](const Op& op) { return op.name == sum; });
  ASSERT_NE(at, cell.backward.end());
  EXPECT_EQ(at->bytes, 2 * 8 * 64 * 4);
  // After it, only the reductions' backward (reduce1's ReLU, convolution and batch norm; the
  // second input needs none): three ops.
  EXPECT_EQ(cell.backward.end() - at, 1 + 3);
  // Rank 0 holds reduce1 (64 + 16) and node 2's edges (conv_1x1 80, conv_1x7_7x1 116).
  EXPECT_EQ(cell.params, 80 + 80 + 116);
}

}  // namespace
}  // namespace sextant::models
