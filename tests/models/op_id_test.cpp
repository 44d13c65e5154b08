// Op identities: the name table has no duplicates, scoped names render as "<scope>.<suffix>", and
// every op the lowering builds, for every family and split, carries the identity its name says.
#include "sextant/models/op_id.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "sextant/models/lowering.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::models {
namespace {

std::vector<OpId> all_ids() {
  std::vector<OpId> ids;
  for (size_t i = 0; i < static_cast<size_t>(OpId::kCount); ++i)
    ids.push_back(static_cast<OpId>(i));
  return ids;
}

TEST(OpId, NamesAndSuffixesAreUnique) {
  std::set<std::string_view> fixed, suffixes;
  size_t scoped = 0;
  for (OpId id : all_ids()) {
    if (op_is_scoped(id)) {
      ++scoped;
      EXPECT_TRUE(suffixes.insert(op_text(id)).second) << op_text(id);
    } else {
      EXPECT_FALSE(op_text(id).empty());
      EXPECT_EQ(op_name(id), op_text(id));
      EXPECT_TRUE(fixed.insert(op_text(id)).second) << op_text(id);
    }
  }
  EXPECT_EQ(scoped, 22u);  // the SEXTANT_SCOPED_OPS list: product, act, relu, bn, ... branch splits
  EXPECT_GT(fixed.size(), 90u);
}

TEST(OpId, ScopedNamesJoinTheUnitsNameAndTheSuffix) {
  EXPECT_EQ(OpName("layer2.conv1", OpId::kUnitBatchNorm).str(), "layer2.conv1.bn");
  EXPECT_EQ(OpName("layer2.conv1", OpId::kUnitProduct).str(), "layer2.conv1");
  EXPECT_EQ(OpName("layer5", OpId::kUnitFcAllReduce).str(), "layer5.fc.all_reduce");
  EXPECT_EQ(OpName("fc0", OpId::kUnitAct).str(), "fc0.act");
  EXPECT_EQ(OpName(OpId::kAttnQkv).str(), "attn.qkv");
  EXPECT_EQ(OpName(OpId::kAttnQkv).id(), OpId::kAttnQkv);
  // A fixed op takes no scope; a scoped one needs one.
  EXPECT_THROW(static_cast<void>(OpName("block3", OpId::kAttnQkv)), InternalError);
  EXPECT_THROW(static_cast<void>(OpName(OpId::kUnitBatchNorm)), InternalError);
  EXPECT_THROW(static_cast<void>(OpName("", OpId::kUnitBatchNorm)), InternalError);
  EXPECT_THROW(op_name(OpId::kUnitHalo), InternalError);
}

TEST(OpId, GridLinearOpsFollowTheirProduct) {
  EXPECT_EQ(grid_linear_ops(OpId::kAttnQkv).weight_gather, OpId::kAttnQkvWeightGather);
  EXPECT_EQ(grid_linear_ops(OpId::kMlpFc2).grad_scatter, OpId::kMlpFc2GradScatter);
  EXPECT_EQ(op_name(grid_linear_ops(OpId::kAttnProj).all_reduce), "attn.proj.all_reduce");
  EXPECT_THROW(grid_linear_ops(OpId::kAttnNorm), InternalError);
}

// Every op of `lowered` has an identity, and its name is that identity's: the fixed name, or a
// scope and the suffix.
void expect_named_by_id(const LoweredModel& lowered, const std::string& what) {
  size_t ops = 0;
  for (const Layer& layer : lowered.layers)
    for (const std::vector<Op>* pass : {&layer.forward, &layer.backward})
      for (const Op& op : *pass) {
        ++ops;
        ASSERT_NE(op.id, OpId::kCount) << what << ": " << layer.name << " " << op.name;
        if (!op_is_scoped(op.id)) {
          EXPECT_EQ(op.name, op_name(op.id)) << what;
          continue;
        }
        const std::string_view suffix = op_text(op.id);
        const size_t scope = suffix.empty() ? op.name.size() : op.name.size() - suffix.size() - 1;
        ASSERT_LT(0u, scope) << what << ": " << op.name;
        EXPECT_EQ(OpName(op.name.substr(0, scope), op.id).str(), op.name) << what;
      }
  EXPECT_GT(ops, 0u) << what;
}

TEST(OpId, EveryLoweredOpCarriesTheIdentityItsNameSays) {
  LoweringOptions o;
  o.micro_batch = 2;
  o.tp = 2;
  o.sequence_parallel = true;
  expect_named_by_id(lower(zoo_model("gpt-tiny"), o), "gpt-tiny tp 2 sp");
  o.sequence_parallel = false;
  o.attention = spec::AttentionKernel::kFlash2;
  o.autocast = true;
  expect_named_by_id(lower(zoo_model("llama-tiny"), o), "llama-tiny tp 2 flash autocast");
  LoweringOptions moe;
  moe.micro_batch = 2;
  moe.ep = 2;
  expect_named_by_id(lower(zoo_model("moe-tiny"), moe), "moe-tiny ep 2");
  LoweringOptions grid;
  grid.micro_batch = 2;
  grid.tp = 8;
  grid.tp_grid = {2, 2, 2};
  expect_named_by_id(lower(zoo_model("gpt-tiny"), grid), "gpt-tiny grid 2x2x2");
  LoweringOptions cp;
  cp.cp = 2;
  cp.attention = spec::AttentionKernel::kFlash2;
  expect_named_by_id(lower(zoo_model("gpt-tiny"), cp), "gpt-tiny cp 2");
  LoweringOptions cnn;
  cnn.micro_batch = 2;
  cnn.spatial = {2, 1};
  expect_named_by_id(lower(zoo_model("resnet-tiny"), cnn), "resnet-tiny spatial 2x1");
  cnn.spatial = {1, 1};
  cnn.tp = 2;
  expect_named_by_id(lower(zoo_model("resnet-tiny"), cnn), "resnet-tiny tp 2");
  expect_named_by_id(lower(zoo_model("mlp-small"), LoweringOptions{}), "mlp-small");
}

}  // namespace
}  // namespace sextant::models
