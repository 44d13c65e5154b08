// Per-operator splits on a device mesh (issue 60): the resharding rule by hand, an einsum's split
// by hand, and Megatron-LM's collectives derived from per-op splits of a transformer block,
// against the hand-written lowering (an independent reference: models/src/transformer_lowering.cpp
// writes Megatron's f and g operators out by name).
#include <gtest/gtest.h>

#include "sextant/models/block_graph.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/sharded_ops.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/sharding.hpp"

namespace sextant::models {
namespace {

using spec::CollectiveKind;
using spec::DeviceMesh;
using spec::ReshardKind;
using spec::ReshardStep;
using spec::TensorLayout;

const DeviceMesh kMesh{{{"d", 2}, {"t", 4}}};

// A [b=8, s=16, h=32] tensor; `split`: dim -> axes; `partial`: axes.
TensorLayout bsh(OpSplit split, std::vector<std::string> partial = {}) {
  return layout_of({"b", "s", "h"}, {{"b", 8}, {"s", 16}, {"h", 32}}, split, std::move(partial));
}

std::vector<ReshardStep> move(const TensorLayout& from, const TensorLayout& to) {
  return spec::reshard(kMesh, from, to, 2);
}

// 8 x 16 x 32 = 4096 elements, 2 bytes each: 8192 bytes whole.
TEST(Resharding, EachAxisMovesByTheRule) {
  // Partial over t -> whole: an all-reduce of the rank's tensor (b split over d: 4096 bytes).
  EXPECT_EQ(move(bsh({{"b", {"d"}}}, {"t"}), bsh({{"b", {"d"}}})),
            (std::vector<ReshardStep>{{ReshardKind::kAllReduce, "t", "", "", 4096}}));
  // Partial over t -> the sequence split over t: a reduce-scatter of the same 4096 bytes.
  EXPECT_EQ(move(bsh({{"b", {"d"}}}, {"t"}), bsh({{"b", {"d"}}, {"s", {"t"}}})),
            (std::vector<ReshardStep>{{ReshardKind::kReduceScatter, "t", "s", "", 4096}}));
  // The sequence split over t -> whole: an all-gather making 1024 x 4 = 4096 bytes.
  EXPECT_EQ(move(bsh({{"b", {"d"}}, {"s", {"t"}}}), bsh({{"b", {"d"}}})),
            (std::vector<ReshardStep>{{ReshardKind::kAllGather, "t", "s", "", 4096}}));
  // The batch split over d -> the sequence split over d: an all-to-all of the rank's 4096 bytes.
  EXPECT_EQ(move(bsh({{"b", {"d"}}}), bsh({{"s", {"d"}}})),
            (std::vector<ReshardStep>{{ReshardKind::kAllToAll, "d", "b", "s", 4096}}));
  // Whole -> split: a slice, nothing sent.
  EXPECT_EQ(move(bsh({}), bsh({{"h", {"t"}}})),
            (std::vector<ReshardStep>{{ReshardKind::kSlice, "t", "h", "", 0}}));
  EXPECT_TRUE(move(bsh({{"b", {"d"}}}, {"t"}), bsh({{"b", {"d"}}}, {"t"})).empty());
}

TEST(Resharding, ShrinkingStepsRunBeforeTheGathers) {
  // From b over d, partial over t, to b whole, h over t: the reduce-scatter first, on the rank's
  // 4096 bytes (leaving 1024), then the all-gather over d making 1024 x 2 = 2048.
  EXPECT_EQ(move(bsh({{"b", {"d"}}}, {"t"}), bsh({{"h", {"t"}}})),
            (std::vector<ReshardStep>{{ReshardKind::kReduceScatter, "t", "h", "", 4096},
                                      {ReshardKind::kAllGather, "d", "b", "", 2048}}));
  // Two axes on one dimension, added in the target's order: b over d then t, from whole.
  EXPECT_EQ(move(bsh({}), bsh({{"b", {"d", "t"}}})),
            (std::vector<ReshardStep>{{ReshardKind::kSlice, "d", "b", "", 0},
                                      {ReshardKind::kSlice, "t", "b", "", 0}}));
}

TEST(Resharding, WhatTheRuleCannotDoIsRefused) {
  // A partial sum cannot be made, axes must exist and divide, and the dimensions must match.
  EXPECT_THROW(move(bsh({}), bsh({}, {"t"})), InputError);
  EXPECT_THROW(move(bsh({{"b", {"x"}}}), bsh({})), InputError);
  EXPECT_THROW(move(bsh({{"b", {"d"}}, {"s", {"d"}}}), bsh({})), InputError);
  EXPECT_THROW(spec::reshard(DeviceMesh{{{"t", 3}}}, bsh({{"b", {"t"}}}), bsh({}), 2), InputError);
  TensorLayout other = bsh({});
  other.dims[2].extent = 64;
  EXPECT_THROW(move(bsh({}), other), InputError);
}

// A rank's blocks along a dimension split by (d, t) are numbered c_d x 4 + c_t: a new axis splits
// within them (a slice of the rank's block), and only the minor axis can be gathered or exchanged
// without permuting blocks. Where the phase order would break that (b over t -> b over d would
// slice d within the t blocks, then gather t), the rule takes the cheapest route of single steps,
// each on a minor axis. By hand, of the 8192 bytes whole:
// - b over (d, t) -> b over t: t off b onto another dimension (an all-to-all of the rank's 1024),
//   d gathered (1024 x 2), t back onto b (2048): 5120 bytes, where gathering both would move
//   4096 + 8192;
// - b over t -> b over d: t onto another dimension (2048), d sliced onto b, t gathered
//   (1024 x 4): 6144 bytes, against 8192 for gathering t and slicing d;
// - whole -> b over (t, d): two slices in that order, nothing sent;
// - b over (d, t) -> b over (t, d): four all-to-alls of 1024 (t off b, d off b, t back, d back).
TEST(Resharding, AxesComeAndGoAtTheMinorEndOnly) {
  auto route = [](const TensorLayout& from, const TensorLayout& to) {
    const std::vector<ReshardStep> steps = move(from, to);
    TensorLayout at = from;
    for (const ReshardStep& s : steps) at = spec::after_step(kMesh, at, s);
    EXPECT_EQ(at, to);
    std::pair<std::vector<ReshardKind>, int64_t> out{{}, 0};
    for (const ReshardStep& s : steps) {
      out.first.push_back(s.kind);
      out.second += s.bytes;
    }
    return out;
  };
  using K = ReshardKind;
  using Route = std::pair<std::vector<ReshardKind>, int64_t>;
  EXPECT_EQ(route(bsh({{"b", {"d", "t"}}}), bsh({{"b", {"t"}}})),
            (Route{{K::kAllToAll, K::kAllGather, K::kAllToAll}, 5120}));
  EXPECT_EQ(route(bsh({{"b", {"t"}}}), bsh({{"b", {"d"}}})),
            (Route{{K::kAllToAll, K::kSlice, K::kAllGather}, 6144}));
  EXPECT_EQ(move(bsh({}), bsh({{"b", {"t", "d"}}})),
            (std::vector<ReshardStep>{{ReshardKind::kSlice, "t", "b", "", 0},
                                      {ReshardKind::kSlice, "d", "b", "", 0}}));
  EXPECT_EQ(route(bsh({{"b", {"d", "t"}}}), bsh({{"b", {"t", "d"}}})),
            (Route{{K::kAllToAll, K::kAllToAll, K::kAllToAll, K::kAllToAll}, 4096}));
  // Taking the minor t off b by an all-to-all is allowed: the rank's 8192 / 8 = 1024 bytes.
  EXPECT_EQ(move(bsh({{"b", {"d", "t"}}}), bsh({{"b", {"d"}}, {"s", {"t"}}})),
            (std::vector<ReshardStep>{{ReshardKind::kAllToAll, "t", "b", "s", 1024}}));
}

// The steps the rule gives, applied to the layout one by one (after_step), end on the target, for
// every pair of a family of layouts of [b, s, h] on d2 x t4 that the rule moves between.
TEST(Resharding, TheStepsLeadToTheTargetLayout) {
  const std::vector<TensorLayout> family = {
      bsh({}),
      bsh({}, {"t"}),
      bsh({{"b", {"d"}}}),
      bsh({{"b", {"d"}}}, {"t"}),
      bsh({{"b", {"d", "t"}}}),
      bsh({{"b", {"d"}}, {"s", {"t"}}}),
      bsh({{"s", {"d"}}, {"h", {"t"}}}),
      bsh({{"h", {"t"}}}, {"d"}),
      bsh({{"s", {"t"}}}),
  };
  int moved = 0;
  for (const TensorLayout& from : family)
    for (const TensorLayout& to : family) {
      std::vector<ReshardStep> steps;
      try {
        steps = move(from, to);
      } catch (const InputError&) {
        continue;  // a partial sum made, or blocks permuted
      }
      TensorLayout at = from;
      for (const ReshardStep& s : steps) at = spec::after_step(kMesh, at, s);
      EXPECT_EQ(at, to);
      ++moved;
    }
  EXPECT_GE(moved, 50);
}

TEST(ShardedOp, AContractionSplitOverAnAxisLeavesPartialSums) {
  // Y[b,s,f] = X[b,s,h] W[h,f]: 2 x 8 x 16 x 32 x 64 = 524288 FLOPs whole. Split b over d and
  // the contracted h over t: each rank does 1/8 of them, and its Y is a partial sum over t.
  EinsumOp op{"fc",
              {{"b", "s", "h"}, {"h", "f"}},
              {"b", "s", "f"},
              {{"b", 8}, {"s", 16}, {"h", 32}, {"f", 64}},
              -1,
              {}};
  const ShardedOp s = shard_op(kMesh, op, {{"b", {"d"}}, {"h", {"t"}}});
  EXPECT_DOUBLE_EQ(s.flops, 524288.0 / 8);
  EXPECT_EQ(s.output.partial, std::vector<std::string>{"t"});
  EXPECT_EQ(s.operands[1].dim("h")->axes, std::vector<std::string>{"t"});
  // The gradient of W contracts b and s: partial over d, where b is split.
  const ShardedOp dw = shard_op(kMesh, gradient_op(op, 1), {{"b", {"d"}}, {"h", {"t"}}});
  EXPECT_EQ(dw.output.partial, std::vector<std::string>{"d"});
  EXPECT_DOUBLE_EQ(dw.flops, 524288.0 / 8);
  // An axis twice, a dimension the op needs whole, a dimension it lacks: refused.
  EXPECT_THROW(shard_op(kMesh, op, {{"b", {"t"}}, {"h", {"t"}}}), InputError);
  op.whole = {"h"};
  EXPECT_THROW(shard_op(kMesh, op, {{"h", {"t"}}}), InputError);
  EXPECT_THROW(shard_op(kMesh, op, {{"q", {"t"}}}), InputError);
}

struct Comm {
  CollectiveKind kind;
  int64_t bytes;
  bool operator==(const Comm&) const = default;
};

std::vector<Comm> layer_comms(const std::vector<Op>& ops) {
  std::vector<Comm> out;
  for (const Op& op : ops)
    if (op.is_comm() && op.group == CommGroup::kLayer) out.push_back({op.collective, op.bytes});
  return out;
}

std::vector<Comm> walk_comms(const GraphWalk& w, spec::Phase phase) {
  std::vector<Comm> out;
  for (const GraphStep& s : w.steps)
    if (s.kind == GraphStep::Kind::kReshard && s.phase == phase &&
        s.reshard.kind != ReshardKind::kSlice)
      out.push_back({s.reshard.collective(), s.reshard.bytes});
  return out;
}

double walk_flops(const GraphWalk& w, const std::string& node, spec::Phase phase) {
  for (const GraphStep& s : w.steps)
    if (s.kind == GraphStep::Kind::kCompute && s.node == node && s.phase == phase) return s.flops;
  return -1;
}

// GPT-3 1.3B (h 2048, 16 heads, ffn 8192), sequence 2048, micro-batch 2 on each of dp 2 ranks,
// bf16, on a mesh of d = 2 by t = 4.
TEST(PerOpBlock, MegatronsCollectivesFollowFromItsPerOpSplits) {
  const spec::ModelSpec m = zoo_model("gpt3-1.3b");
  const BlockDims dims{4, 2048, 2048, 16, 128, 8192};
  const OpGraph g = transformer_block_graph(dims);
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
    const BlockSplit split = megatron_block_split(dims, "d", "t", sp);
    const GraphWalk w = walk_graph(kMesh, g, split.ops, split.stream, split.stream, 2);
    LoweringOptions o;
    o.micro_batch = 2;
    o.seq_len = 2048;
    o.tp = 4;
    o.sequence_parallel = sp;
    const LoweredModel l = lower(m, o);
    const Layer& block = l.layers[1];
    // Forward: 2 all-reduces (with sp: all-gather, reduce-scatter twice) of b s h = 2 x 2048 x
    // 2048 bf16 = 16 MiB; the lowering writes them out, the walk derives them.
    EXPECT_EQ(walk_comms(w, spec::Phase::kFwd), layer_comms(block.forward));
    EXPECT_EQ(walk_comms(w, spec::Phase::kBwd), layer_comms(block.backward));
    EXPECT_EQ(layer_comms(block.forward).size(), sp ? 4u : 2u);
    EXPECT_EQ(layer_comms(block.forward).front().bytes, 2 * 2048 * 2048 * 2);
    // The GEMMs' FLOPs per rank: the walk's split of each einsum against the lowering's ops.
    const std::map<OpId, std::string> gemms = {{OpId::kAttnQkv, "qkv"},
                                               {OpId::kAttnProj, "proj"},
                                               {OpId::kMlpFc1, "fc1"},
                                               {OpId::kMlpFc2, "fc2"}};
    int found = 0;
    for (const Op& op : block.forward) {
      const auto it = gemms.find(op.id);
      if (it == gemms.end()) continue;
      ++found;
      EXPECT_DOUBLE_EQ(walk_flops(w, it->second, spec::Phase::kFwd), op.flops) << it->second;
    }
    EXPECT_EQ(found, 4);
    // Backward products cost twice the forward (dgrad and wgrad).
    EXPECT_DOUBLE_EQ(walk_flops(w, "fc1", spec::Phase::kBwd),
                     2 * walk_flops(w, "fc1", spec::Phase::kFwd));
  }
}

// Each weight's gradient is a partial sum over d (the batch it contracted is split there): summed
// by an all-reduce of the rank's shard, the data-parallel gradient sum; under tensor parallelism
// the shard is the weight's 1/t: QKV 2048 x 16 x 384 / 4, the projection 16 x 128 x 2048 / 4,
// FC1 and FC2 2048 x 8192 / 4, in bf16.
TEST(PerOpBlock, DataParallelGradientSumsAreEachWeightsShard) {
  const BlockDims dims{4, 2048, 2048, 16, 128, 8192};
  const BlockSplit split = megatron_block_split(dims, "d", "t", false);
  const GraphWalk w =
      walk_graph(kMesh, transformer_block_graph(dims), split.ops, split.stream, split.stream, 2);
  std::map<std::string, int64_t> sums;
  for (const GraphStep& s : w.steps) {
    if (s.kind != GraphStep::Kind::kGradientSum) continue;
    EXPECT_EQ(s.reshard.kind, ReshardKind::kAllReduce) << s.node;
    EXPECT_EQ(s.reshard.axis, "d") << s.node;
    sums[s.node] = s.reshard.bytes;
  }
  const int64_t qkv = 2048 * 16 * 384 / 4 * 2, proj = 16 * 128 * 2048 / 4 * 2,
                fc = 2048 * 8192 / 4 * 2;
  EXPECT_EQ(sums, (std::map<std::string, int64_t>{
                      {"qkv", qkv}, {"proj", proj}, {"fc1", fc}, {"fc2", fc}}));
  EXPECT_EQ(w.param_bytes, qkv + proj + 2 * fc);
}

// A split no uniform layout has: attention data-parallel over t (its batch of 8 over d and t: one
// sequence a rank, whole heads), the MLP tensor-parallel over t; the stream is the batch over d
// (4 sequences a rank). Forward: x1 is sliced for QKV (free); the projection's output is gathered
// over t into the stream's layout (making the rank's 4 x 2048 x 2048 bf16, 32 MiB); FC2's partial
// sum is all-reduced (32 MiB) as in Megatron. Backward: FC1's partial input gradient is
// all-reduced; the stream's gradient is sliced for the projection; QKV's input gradient (one
// sequence a rank) is gathered over t into the norm's layout (32 MiB).
TEST(PerOpBlock, AttentionDataParallelAndTheMlpTensorParallelOverTheSameAxis) {
  const BlockDims dims{8, 2048, 2048, 16, 128, 8192};
  BlockSplit split = megatron_block_split(dims, "d", "t", false);
  for (const char* n : {"qkv", "attention", "proj"}) split.ops[n] = {{"b", {"d", "t"}}};
  const GraphWalk w =
      walk_graph(kMesh, transformer_block_graph(dims), split.ops, split.stream, split.stream, 2);
  const int64_t stream = 4 * 2048 * 2048 * 2;
  EXPECT_EQ(walk_comms(w, spec::Phase::kFwd),
            (std::vector<Comm>{{CollectiveKind::kAllGather, stream},
                               {CollectiveKind::kAllReduce, stream}}));
  EXPECT_EQ(walk_comms(w, spec::Phase::kBwd),
            (std::vector<Comm>{{CollectiveKind::kAllReduce, stream},
                               {CollectiveKind::kAllGather, stream}}));
  // Attention's FLOPs per rank: 4 b s^2 a d / 8.
  EXPECT_DOUBLE_EQ(walk_flops(w, "attention", spec::Phase::kFwd),
                   4.0 * 8 * 2048 * 2048 * 16 * 128 / 8);
  // Its weights are whole on every rank: their gradients are summed over d and t.
  std::vector<std::string> axes;
  for (const GraphStep& s : w.steps)
    if (s.kind == GraphStep::Kind::kGradientSum && s.node == "qkv") axes.push_back(s.reshard.axis);
  EXPECT_EQ(axes, (std::vector<std::string>{"d", "t"}));
}

}  // namespace
}  // namespace sextant::models

namespace sextant::models {
namespace {

LoweringOptions per_op_options(spec::OpSplits per_op) {
  LoweringOptions o;
  o.micro_batch = 4;
  o.seq_len = 2048;
  o.tp = 4;
  o.dp = 2;
  o.per_op = std::move(per_op);
  return o;
}

// A plan naming an op's uniform split (qkv: the batch over d, the heads over t) lowers exactly
// as the uniform plan: the per-op lowering changes only what differs.
TEST(PerOpLowering, TheUniformSplitsLowerAsTheUniformPlan) {
  const spec::ModelSpec m = zoo_model("gpt3-1.3b");
  const LoweredModel uniform = lower(m, per_op_options({}));
  const LoweredModel same = lower(m, per_op_options({{"qkv", {{"b", {"d"}}, {"a", {"t"}}}}}));
  ASSERT_EQ(same.layers.size(), uniform.layers.size());
  for (size_t i = 0; i < same.layers.size(); ++i) {
    EXPECT_EQ(same.layers[i].forward, uniform.layers[i].forward) << i;
    EXPECT_EQ(same.layers[i].backward, uniform.layers[i].backward) << i;
    EXPECT_TRUE(same.layers[i].same_work_as(uniform.layers[i])) << i;
  }
}

// GPT-3 1.3B on dp 2 x tp 4, 4 sequences of 2048 a replica. Attention (QKV, the core, the
// projection) data-parallel over t as well (8 sequences over d x t: one a rank), the MLP as
// Megatron's. By hand:
// - the block's layer-group collectives: the projection's output gathered over t into the
//   stream's layout (4 x 2048 x 2048 bf16 = 32 MiB), FC2's all-reduce (32 MiB); backward, FC1's
//   input gradient all-reduced, then QKV's input gradient gathered (32 MiB each);
// - QKV's GEMM on the rank's 2048 tokens with all 6144 columns (the same FLOPs as 8192 tokens x
//   1536 columns);
// - QKV's and the projection's weights and QKV's bias whole on each rank: + 3/4 of (2048 x 6144 +
//   2048 x 2048 + 6144) parameters, whose gradients are partial sums over t (sp_partial_params).
TEST(PerOpLowering, AttentionDataParallelOverTheTensorAxis) {
  const spec::ModelSpec m = zoo_model("gpt3-1.3b");
  const spec::OpSplits per_op = {{"qkv", {{"b", {"d", "t"}}}},
                                 {"attention", {{"b", {"d", "t"}}}},
                                 {"proj", {{"b", {"d", "t"}}}}};
  const Layer uniform = lower(m, per_op_options({})).layers[1];
  const Layer block = lower(m, per_op_options(per_op)).layers[1];
  const int64_t stream = 4 * 2048 * 2048 * 2;
  EXPECT_EQ(layer_comms(block.forward), (std::vector<Comm>{{CollectiveKind::kAllGather, stream},
                                                           {CollectiveKind::kAllReduce, stream}}));
  EXPECT_EQ(layer_comms(block.backward), (std::vector<Comm>{{CollectiveKind::kAllReduce, stream},
                                                            {CollectiveKind::kAllGather, stream}}));
  for (const Op& op : block.forward) {
    if (op.id != OpId::kAttnQkv) continue;
    EXPECT_EQ(op.matmuls, (std::vector<MatmulShape>{{1, 2048, 6144, 2048}}));
    EXPECT_DOUBLE_EQ(op.flops, 2.0 * 8192 * 1536 * 2048);
  }
  const int64_t attention_weights = 2048 * 6144 + 2048 * 2048 + 6144;
  EXPECT_EQ(block.params - uniform.params, attention_weights / 4 * 3);
  EXPECT_EQ(block.sp_partial_params - uniform.sp_partial_params, attention_weights);
  EXPECT_EQ(block.params_total, uniform.params_total);
  // The first all-gather comes right before the first residual, after the projection.
  for (size_t i = 0; i + 1 < block.forward.size(); ++i) {
    if (block.forward[i].op_class == spec::OpClass::kAllGather) {
      EXPECT_EQ(block.forward[i + 1].id, OpId::kAttnResidual);
    }
  }
}

TEST(PerOpLowering, WhatItDoesNotModelIsRefused) {
  const spec::ModelSpec m = zoo_model("gpt3-1.3b");
  // An op the block does not have; a weight split over the replicas; a dimension the op needs
  // whole.
  EXPECT_THROW(lower(m, per_op_options({{"router", {{"b", {"d"}}}}})), InputError);
  EXPECT_THROW(lower(m, per_op_options({{"fc1", {{"b", {"t"}}, {"f", {"d"}}}}})), InputError);
  EXPECT_THROW(lower(m, per_op_options({{"norm1", {{"h", {"t"}}}}})), InputError);
}

}  // namespace
}  // namespace sextant::models

namespace sextant::models {
namespace {

// Every compute op a dense block's lowering makes belongs to an op of the block graph (or is the
// layer's own weight cast), under every fusion level, autocast, fp8, GQA and SwiGLU: an op the
// lowering gains and the per-op lowering does not place would keep its uniform work silently.
TEST(PerOpLowering, EveryOpOfADenseBlockBelongsToAGraphOp) {
  for (const char* name : {"gpt3-1.3b", "llama3-8b"}) {
    for (spec::Fusion fusion :
         {spec::Fusion::kEager, spec::Fusion::kFused, spec::Fusion::kCompiled})
      for (bool autocast : {false, true})
        for (bool fp8 : {false, true}) {
          LoweringOptions o = per_op_options({});
          o.fusion = fusion;
          o.autocast = autocast;
          o.fp8_gemms = fp8;
          o.sequence_parallel = true;
          const LoweredModel lowered = lower(zoo_model(name), o);
          const Layer& block = lowered.layers[1];
          for (const auto* ops : {&block.forward, &block.backward, &block.selective_forward})
            for (const Op& op : *ops) {
              if (op.is_comm() || op.id == OpId::kAutocastWeights) continue;
              EXPECT_FALSE(block_op_of(op.id).empty()) << name << " " << op.name;
            }
        }
  }
}

}  // namespace
}  // namespace sextant::models

namespace sextant::models {
namespace {

// The collectives of a pass, by name and bytes.
using Named = std::vector<std::pair<std::string, int64_t>>;
Named comms(const std::vector<Op>& ops) {
  Named out;
  for (const Op& op : ops)
    if (op.is_comm()) out.emplace_back(op.name, op.bytes);
  return out;
}

// AlexNet's classifier (fc 9216 -> 4096 -> 4096 -> 1000; ReLU after the first two) on 16
// replicas of 32 images each, in bf16, split as Krizhevsky's "one weird trick" splits it
// (FlexFlow's parameter dimension): layer9's and layer10's outputs over d, layer11's inputs over d.
// By hand (512 images, 2 bytes an element):
// - layer9 reads every replica's images: its input all-gathered over d (512 x 9216 whole); GEMM
//   512 x 256 x 9216; its weight's block 9216 x 256 and bias 256;
// - layer10 reads layer9's outputs whole: gathered over d (512 x 4096); GEMM 512 x 256 x 4096;
// - layer11 contracts its inputs as layer10 split them: a partial sum, reduce-scattered over d
//   onto the batch before the loss (512 x 1000 whole); GEMM 512 x 1000 x 256;
// - backward, after the loss: the logits' gradient gathered over d (512 x 1000); layer10's input
//   gradient a partial sum, reduce-scattered onto layer9's outputs (512 x 4096); the features'
//   gradient reduce-scattered onto the batch at the end of layer9's (512 x 9216);
// - the three layers' parameters are each replica's own: out of the buckets.
TEST(PerOpLowering, ACnnsClassifierSplitsItsWeightsOverTheReplicas) {
  const spec::ModelSpec m = zoo_model("alexnet");
  LoweringOptions o;
  o.micro_batch = 32;
  o.dp = 16;
  const LoweredModel uniform = lower(m, o);
  o.per_op = {
      {"layer9", {{"f1", {"d"}}}}, {"layer10", {{"f2", {"d"}}}}, {"layer11", {{"f2", {"d"}}}}};
  const LoweredModel split = lower(m, o);
  const Layer &l9 = split.layers[9], &l10 = split.layers[10], &l11 = split.layers[11];
  EXPECT_EQ(comms(l9.forward), (Named{{"layer9.reshard_all_gather", 512 * 9216 * 2}}));
  EXPECT_EQ(comms(l10.forward), (Named{{"layer10.reshard_all_gather", 512 * 4096 * 2}}));
  EXPECT_EQ(comms(l11.forward), (Named{{"logits.reshard_reduce_scatter", 512 * 1000 * 2}}));
  EXPECT_EQ(l11.forward.back().id, OpId::kLoss);
  EXPECT_EQ(comms(l11.backward), (Named{{"layer11.reshard_all_gather", 512 * 1000 * 2}}));
  EXPECT_EQ(l11.backward.front().id, OpId::kLoss);  // the gather follows the loss's backward
  EXPECT_EQ(comms(l10.backward), Named{});
  EXPECT_EQ(comms(l9.backward), (Named{{"layer9.reshard_reduce_scatter", 512 * 4096 * 2},
                                       {"fc_input.reshard_reduce_scatter", 512 * 9216 * 2}}));
  for (const auto& [layer, shape] : {std::pair{&l9, MatmulShape{1, 512, 256, 9216}},
                                     std::pair{&l10, MatmulShape{1, 512, 256, 4096}},
                                     std::pair{&l11, MatmulShape{1, 512, 1000, 256}}})
    for (const Op& op : layer->forward) {
      if (op.id == OpId::kUnitFc) {
        EXPECT_EQ(op.matmuls, std::vector<MatmulShape>{shape});
      }
    }
  EXPECT_EQ(l9.params, 9216 * 256 + 256);
  EXPECT_EQ(l10.params, 4096 * 256 + 256);
  EXPECT_EQ(l11.params, 256 * 1000 + 1000);
  for (const Layer* l : {&l9, &l10, &l11}) EXPECT_EQ(l->replica_whole_params, l->params);
  // The buckets reduce everything else: the uniform buckets less the three layers' whole.
  spec::Plan plan;
  plan.dp = 16;
  plan.micro_batch = 32;
  plan.global_batch = 512;
  int64_t was = 0, now = 0;
  for (const GradientBucket& b : gradient_buckets(plan, uniform, 0, 25 << 20, 2)) was += b.params;
  for (const GradientBucket& b : gradient_buckets(plan, split, 0, 25 << 20, 2)) now += b.params;
  EXPECT_EQ(was - now,
            uniform.layers[9].params + uniform.layers[10].params + uniform.layers[11].params);
  // Refused: a split of the features a layer with a ReLU contracts (it would rectify a partial
  // sum), a layer that is not an fc, and tensor parallelism beside.
  o.per_op = {{"layer10", {{"f1", {"d"}}}}};
  EXPECT_THROW(lower(m, o), InputError);
  o.per_op = {{"layer3", {{"b", {"d"}}}}};
  EXPECT_THROW(lower(m, o), InputError);
  o.per_op = {{"layer9", {{"f1", {"d"}}}}};
  o.tp = 2;
  EXPECT_THROW(lower(m, o), InputError);
}

// An MLP's layers are fc ops too: mlp-small (64 -> 256 -> 256 -> 256 -> 16, fp32) on dp 4, 8
// samples a replica, its classifier fc3 with its 16 outputs over d. By hand: fc3's input gathered
// over d (32 x 256 x 4 B), its output blocks exchanged onto the replicas' rows (an all-to-all of
// the rank's 32 x 4 x 4 B); backward, the logits' gradient exchanged back, and the input's
// gradient, partial over d, reduce-scattered onto fc2's rows as fc2's backward opens; fc3 holds
// 256 x 4 weights and 4 biases of its own, which no bucket carries.
TEST(PerOpLowering, AnMlpsLayersSplitAsFcLayers) {
  LoweringOptions o;
  o.micro_batch = 8;
  o.dp = 4;
  o.dtype = spec::Dtype::kFp32;
  o.per_op = {{"fc3", {{"f4", {"d"}}}}};
  const LoweredModel split = lower(zoo_model("mlp-small"), o);
  const Layer &fc2 = split.layers[2], &fc3 = split.layers[3];
  EXPECT_EQ(comms(fc3.forward), (Named{{"fc3.reshard_all_gather", 32 * 256 * 4},
                                       {"logits.reshard_all_to_all", 32 * 4 * 4}}));
  EXPECT_EQ(comms(fc3.backward), (Named{{"fc3.reshard_all_to_all", 32 * 4 * 4}}));
  // (fc2 wants its output's gradient on its rows: the reduce-scatter opens its backward.)
  EXPECT_EQ(comms(fc2.backward), (Named{{"fc2.reshard_reduce_scatter", 32 * 256 * 4}}));
  for (const Op& op : fc3.forward) {
    if (op.id == OpId::kUnitProduct) {
      EXPECT_EQ(op.matmuls, (std::vector<MatmulShape>{{1, 32, 4, 256}}));
    }
  }
  EXPECT_EQ(fc3.params, 256 * 4 + 4);
  EXPECT_EQ(fc3.replica_whole_params, fc3.params);
}

// Llama-2 7B's output layer (h 4096, vocabulary 32000, untied) on dp 4 x tp 2, 2 sequences of
// 1024 a replica, bf16, its logits' vocabulary split over d x t (FlexFlow's parameter dimension:
// each rank a block of 4000 rows of the output weights). By hand:
// - the input gathered over d (every replica's 8192 tokens: 8192 x 4096 x 2 B) before the
//   logits; its gradient, partial over d and t, reduce-scattered over d onto the replica's 2048
//   tokens, then all-reduced over t (the stream is whole on each tp rank without SP);
// - the logits GEMM on 8192 tokens x 4000 columns x 4096;
// - the cross-entropy vocabulary-parallel over d and over t: per axis each token's max, then its
//   sums of exponentials and target logit (8192 x 4 and 8192 x 8 B);
// - the weights: 4000 x 4096 a rank, whole on each replica's gradient (no bucket carries them).
TEST(PerOpLowering, TheLogitsVocabularySplitOverTheReplicas) {
  const spec::ModelSpec m = zoo_model("llama2-7b");
  LoweringOptions o;
  o.micro_batch = 2;
  o.seq_len = 1024;
  o.tp = 2;
  o.dp = 4;
  const Layer uniform = lower(m, o).layers.back();
  o.per_op = {{"logits", {{"V", {"d", "t"}}}}};
  const Layer head = lower(m, o).layers.back();
  auto grouped = [](const std::vector<Op>& ops) {
    std::vector<std::tuple<std::string, CommGroup, int64_t>> out;
    for (const Op& op : ops)
      if (op.is_comm()) out.emplace_back(op.name, op.group, op.bytes);
    return out;
  };
  using Grouped = std::vector<std::tuple<std::string, CommGroup, int64_t>>;
  const int64_t tokens = 8192, input = tokens * 4096 * 2;
  EXPECT_EQ(grouped(head.forward),
            (Grouped{{"logits.reshard_all_gather", CommGroup::kData, input},
                     {"head.loss_all_reduce", CommGroup::kData, tokens * 4},
                     {"head.loss_all_reduce", CommGroup::kData, tokens * 8},
                     {"head.loss_all_reduce", CommGroup::kLayer, tokens * 4},
                     {"head.loss_all_reduce", CommGroup::kLayer, tokens * 8}}));
  EXPECT_EQ(grouped(head.backward),
            (Grouped{{"head_input.reshard_reduce_scatter", CommGroup::kData, input},
                     {"head_input.reshard_all_reduce", CommGroup::kLayer, input / 4}}));
  for (const Op& op : head.forward) {
    if (op.id == OpId::kHeadLogits) {
      EXPECT_EQ(op.matmuls, (std::vector<MatmulShape>{{1, tokens, 4000, 4096}}));
    }
  }
  EXPECT_EQ(uniform.params - head.params, 16000 * 4096 - 4000 * 4096);
  EXPECT_EQ(head.replica_whole_params, 4000 * 4096);
  // Refused: the hidden size the logits contract, any change under tied embeddings, ZeRO-3.
  o.per_op = {{"logits", {{"h", {"t"}}}}};
  EXPECT_THROW(lower(m, o), InputError);
  o.per_op = {{"logits", {{"V", {"d"}}}}};
  EXPECT_THROW(lower(zoo_model("gpt3-1.3b"), o), InputError);
  o.zero3 = true;
  EXPECT_THROW(lower(m, o), InputError);
}

}  // namespace
}  // namespace sextant::models
