// AxoNN's 3D tensor grid in the plan: its field, its rules and where its ranks sit.
#include "sextant/spec/tensor_grid.hpp"

#include <gtest/gtest.h>

#include "expect_input_error.hpp"
#include "sextant/spec/rank_layout.hpp"

namespace sextant::spec {
namespace {

// 8 heads of 32 (hidden 256), ffn 1024, in 4 layers.
ModelSpec dense() {
  ModelSpec m;
  m.name = "dense";
  TransformerSpec t;
  t.layers = 4;
  t.hidden = 256;
  t.heads = 8;
  t.kv_heads = 8;
  t.ffn_hidden = 1024;
  t.vocab = 1000;
  t.seq_len = 128;
  m.body = t;
  return m;
}

Plan grid_plan(int64_t x, int64_t y, int64_t z, int64_t micro_batch = 4) {
  Plan p;
  p.dp = 2;
  p.tp = x * y * z;
  p.tp_grid = {x, y, z};
  p.micro_batch = micro_batch;
  p.global_batch = 2 * micro_batch;
  return p;
}

TEST(TensorGrid, DecodesNamesAndRoundTrips) {
  const Plan p = plan_from_json(Json::parse(R"({"schema": "sextant.plan/1", "dp": 2, "tp": 8,
      "pp": 1, "zero": 0, "micro_batch": 2, "global_batch": 4, "tp_grid": [2, 2, 2]})"),
                                "p.json");
  EXPECT_EQ(p.tp_grid, (TensorGrid{2, 2, 2}));
  EXPECT_EQ(p.world_size(), 16);  // the grid lays out the tp ranks: dp x tp
  EXPECT_EQ(p.name(), "dp2.tp8.pp1.z0.mb2.g2x2x2");
  EXPECT_EQ(plan_from_json(to_json(p), "again").tp_grid, p.tp_grid);
  // No grid: Megatron-LM's 1D tensor parallelism, and no field written.
  Plan flat = p;
  flat.tp_grid = {};
  EXPECT_FALSE(to_json(flat).contains("tp_grid"));
}

TEST(TensorGrid, RefusesWhatItDoesNotCombineWith) {
  auto decode = [](const std::string& extra) {
    return plan_from_json(
        Json::parse(R"({"schema": "sextant.plan/1", "dp": 2, "tp": 8, "pp": 1, "zero": 0,
        "micro_batch": 2, "global_batch": 4)" +
                    extra + "}"),
        "p.json");
  };
  EXPECT_INPUT_ERROR(decode(R"(, "tp_grid": [2, 2])"), "must be [x, y, z]");
  EXPECT_INPUT_ERROR(decode(R"(, "tp_grid": [2, 2, 4])"), "x*y*z (16) must equal tp (8)");
  EXPECT_INPUT_ERROR(decode(R"(, "tp_grid": [2, 2, 2], "sequence_parallel": true)"),
                     "without sequence parallelism");
  EXPECT_INPUT_ERROR(decode(R"(, "tp_grid": [2, 2, 2], "zero": 3)"), "already shards");
  EXPECT_INPUT_ERROR(decode(R"(, "tp_grid": [2, 2, 0])"), "/tp_grid");
}

TEST(TensorGrid, AgainstAModelNamesTheAxisThatDoesNotDivide) {
  const ModelSpec m = dense();
  EXPECT_NO_THROW(validate_plan(grid_plan(2, 4, 2), m, 32, "p"));
  // y splits the heads and the ffn, x the hidden size, z the micro-batch's sequences.
  EXPECT_INPUT_ERROR(validate_plan(grid_plan(1, 16, 1), m, 32, "p"), "must divide the 8 heads");
  EXPECT_INPUT_ERROR(validate_plan(grid_plan(3, 1, 1), m, 6, "p"), "x (3) must divide hidden");
  EXPECT_INPUT_ERROR(validate_plan(grid_plan(1, 1, 8, 4), m, 16, "p"),
                     "z (8) must divide micro_batch (4)");
  // z shards each rank's block of every weight by its elements: hidden 6 in 3 heads, y 3, gives
  // a QKV block of 6 x 18 / 3 = 36 elements, which 8 does not divide.
  ModelSpec small = dense();
  TransformerSpec& t = std::get<TransformerSpec>(small.body);
  t.hidden = 6;
  t.heads = 3;
  t.kv_heads = 3;
  t.ffn_hidden = 6;
  EXPECT_EQ(tensor_grid_model_problem(small, {1, 3, 8}, 8),
            "z (8) must divide the elements of each rank's weight block (36 is one)");
  EXPECT_EQ(tensor_grid_model_problem(small, {1, 3, 4}, 8), "");
  // The 1D rule (tp divides the heads) does not apply to a grid: 16 ranks over 8 heads.
  EXPECT_NO_THROW(validate_plan(grid_plan(2, 4, 2), m, 32, "p"));
  ModelSpec cnn;
  cnn.name = "cnn";
  cnn.body = CnnSpec{};
  EXPECT_EQ(tensor_grid_model_problem(cnn, {2, 1, 1}, 1),
            "splits a transformer's linear layers: use tp_grid only with transformers");
}

TEST(TensorGrid, RanksNumberXFastestAndTheSliceIsTheLayerGroup) {
  // dp 2, tp 8 as 2 x 2 x 2: tp index = gx + 2 (gy + 2 gz), rank = tp index + 8 dp index.
  const RankLayout layout(grid_plan(2, 2, 2));
  // Rank 13: dp 1, tp index 5 = (gx 1, gy 0, gz 1).
  EXPECT_EQ(layout.grid_group(13, 0), (std::vector<int64_t>{12, 13}));
  EXPECT_EQ(layout.grid_group(13, 1), (std::vector<int64_t>{13, 15}));
  EXPECT_EQ(layout.grid_group(13, 2), (std::vector<int64_t>{9, 13}));
  // Its z slice (gz 1): the x * y ranks holding the same sequences.
  EXPECT_EQ(layout.layer_group(13), (std::vector<int64_t>{12, 13, 14, 15}));
  EXPECT_EQ(layout.tp_group(13).size(), 8u);
  // Without a grid the layer group and every axis are the tp group.
  Plan flat = grid_plan(2, 2, 2);
  flat.tp_grid = {};
  const RankLayout plain(flat);
  EXPECT_EQ(plain.layer_group(13), plain.tp_group(13));
  EXPECT_EQ(plain.grid_group(13, 1), plain.tp_group(13));
}

}  // namespace
}  // namespace sextant::spec
