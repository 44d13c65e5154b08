// A transformer block on AxoNN's 3D tensor grid as the lowering gives it: one rank's GEMMs and
// collectives counted by hand from the algorithm (spec/tensor_grid.hpp), and the degenerate 1 x t x
// 1 grid, which is Megatron-LM's 1D tensor parallelism, against the 1D lowering.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "lowered_ops.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::models {
namespace {

using test::find_op;

// h 256 in 8 heads of 32, ffn 1024 (GELU), no biases, rotary positions, vocab 1000, 128 tokens.
spec::ModelSpec dense() {
  spec::ModelSpec m;
  m.name = "dense";
  spec::TransformerSpec t;
  t.layers = 2;
  t.hidden = 256;
  t.heads = 8;
  t.kv_heads = 8;
  t.ffn_hidden = 1024;
  t.vocab = 1000;
  t.seq_len = 128;
  t.bias = false;
  t.dropout = false;
  t.position_embedding = spec::PositionEmbedding::kRope;
  m.body = t;
  return m;
}

LoweredModel lower_grid(spec::TensorGrid grid, int64_t micro_batch = 4) {
  LoweringOptions o;
  o.micro_batch = micro_batch;
  o.dtype = spec::Dtype::kBf16;
  o.tp = grid.ranks();
  o.tp_grid = grid;
  return lower(dense(), o);
}

// The collectives of a pass as "name@group" -> bytes, in order of appearance.
std::vector<std::pair<std::string, int64_t>> collectives(const std::vector<Op>& ops) {
  static const std::map<CommGroup, std::string> group = {{CommGroup::kGridX, "x"},
                                                         {CommGroup::kGridY, "y"},
                                                         {CommGroup::kGridZ, "z"},
                                                         {CommGroup::kLayer, "layer"}};
  std::vector<std::pair<std::string, int64_t>> out;
  for (const Op& op : ops)
    if (op.is_comm()) out.emplace_back(op.name + "@" + group.at(op.group), op.bytes);
  return out;
}

TEST(TensorGridLowering, ABlockOnA2x2x2GridCountedByHand) {
  // micro_batch 4 over z 2: a rank's slice holds 2 sequences, T = 256 tokens; bf16 (e = 2).
  // QKV: k 256 (over x: 128), n 768 (over y: 384); projection k 256 (over y), n 256 (over x);
  // FC1 k 256 (x), n 1024 (y: 512); FC2 k 1024 (y: 512), n 256 (x: 128).
  const LoweredModel m = lower_grid({2, 2, 2});
  EXPECT_EQ(m.tokens_per_micro_batch, 256);
  const Layer& block = m.layers[1];
  using V = std::vector<std::pair<std::string, int64_t>>;
  // Forward: each layer's block gathered over z (k/inner * n/outer * e), its partial output
  // all-reduced over its inner axis (T * n/outer * e); the x-split outputs of the projection and
  // FC2 all-gathered over x to the whole T x 256 (T * 256 * e).
  EXPECT_EQ(collectives(block.forward), (V{{"attn.qkv.weight_gather@z", 128 * 384 * 2},
                                           {"attn.qkv.all_reduce@x", 256 * 384 * 2},
                                           {"attn.proj.weight_gather@z", 128 * 128 * 2},
                                           {"attn.proj.all_reduce@y", 256 * 128 * 2},
                                           {"attn.all_gather@x", 256 * 256 * 2},
                                           {"mlp.fc1.weight_gather@z", 128 * 512 * 2},
                                           {"mlp.fc1.all_reduce@x", 256 * 512 * 2},
                                           {"mlp.fc2.weight_gather@z", 512 * 128 * 2},
                                           {"mlp.fc2.all_reduce@y", 256 * 128 * 2},
                                           {"mlp.all_gather@x", 256 * 256 * 2}}));
  // Backward, last layer first: the block gathered again, the input gradient (T * k/inner * e)
  // all-reduced over the outer axis, the weight gradient reduce-scattered over z; the slice taken
  // before QKV and FC1 gathers its gradient over x.
  EXPECT_EQ(collectives(block.backward), (V{{"mlp.fc2.weight_gather@z", 512 * 128 * 2},
                                            {"mlp.fc2.all_reduce@x", 256 * 512 * 2},
                                            {"mlp.fc2.grad_scatter@z", 512 * 128 * 2},
                                            {"mlp.fc1.weight_gather@z", 128 * 512 * 2},
                                            {"mlp.fc1.all_reduce@y", 256 * 128 * 2},
                                            {"mlp.fc1.grad_scatter@z", 128 * 512 * 2},
                                            {"mlp.all_gather@x", 256 * 256 * 2},
                                            {"attn.proj.weight_gather@z", 128 * 128 * 2},
                                            {"attn.proj.all_reduce@x", 256 * 128 * 2},
                                            {"attn.proj.grad_scatter@z", 128 * 128 * 2},
                                            {"attn.qkv.weight_gather@z", 128 * 384 * 2},
                                            {"attn.qkv.all_reduce@y", 256 * 128 * 2},
                                            {"attn.qkv.grad_scatter@z", 128 * 384 * 2},
                                            {"attn.all_gather@x", 256 * 256 * 2}}));
  // The GEMMs: each rank's T rows by its block; the 8 ranks together do the whole micro-batch's
  // 2 * 512 * (256 * 768 + 256 * 256 + 256 * 1024 + 1024 * 256) FLOPs once.
  EXPECT_DOUBLE_EQ(find_op(block.forward, "attn.qkv")->flops, 2.0 * 256 * 384 * 128);
  EXPECT_DOUBLE_EQ(find_op(block.forward, "mlp.fc2")->flops, 2.0 * 256 * 128 * 512);
  double gemm = 0;
  for (const Op& op : block.forward)
    if (op.op_class == spec::OpClass::kGemm) gemm += op.flops;
  EXPECT_DOUBLE_EQ(8 * gemm, 2.0 * 512 * (256 * 768 + 256 * 256 + 256 * 1024 + 1024 * 256));
  // The attention core on heads/y = 4 heads of the slice's 2 sequences: 2 * 4 = 8 products.
  EXPECT_EQ(find_op(block.forward, "attn.scores")->shape, (std::vector<int64_t>{8, 128, 128, 32}));
  // Parameters: the 786,432 weights over the 8 ranks, the two 256-wide LayerNorms (weight and
  // bias) whole on each; those are partial sums over the 2 z slices.
  EXPECT_EQ(block.params, 786'432 / 8 + 2 * 512);
  EXPECT_EQ(block.params_total, 786'432 + 2 * 512);
  EXPECT_EQ(block.sp_partial_params, 2 * 512);
  // Kept for backward (16-bit, no dropout): the two norm inputs whole (2 T 256 e), the QKV and
  // FC1 inputs split over x (2 T 128 e), Q, K, V over y (T 384 e), the projection input (T 128 e),
  // the GELU input and FC2 input (2 T 512 e), and the 8 x 128 x 128 softmax output (e each).
  const int64_t whole = 2 * 256 * 256 * 2;
  const int64_t split = 2 * 256 * 128 * 2 + 256 * 384 * 2 + 256 * 128 * 2 + 2 * 256 * 512 * 2;
  const int64_t core = 8 * 128 * 128 * 2;
  EXPECT_EQ(block.saved_bytes, whole + split + core);
  EXPECT_EQ(block.saved_bytes_selective, whole + split);
  EXPECT_EQ(block.saved_bytes_full, 256 * 256 * 2);
  // The embedding and the output layer: vocabulary-parallel over the slice's x * y = 4 ranks (250
  // rows each), held alike by both slices, so all partial over z.
  EXPECT_EQ(m.vocab_shard, 250);
  EXPECT_EQ(m.layers.front().params, 250 * 256);
  EXPECT_EQ(m.layers.front().sp_partial_params, m.layers.front().params);
  EXPECT_EQ(m.layers.back().sp_partial_params, m.layers.back().params);
}

TEST(TensorGridLowering, TheOneByTByOneGridIsMegatronsTensorParallelism) {
  // x = z = 1: QKV and FC1 column-parallel over y with no forward collective, the projection and
  // FC2 row-parallel with their all-reduce over y, and backward the two input-gradient
  // all-reduces: Megatron-LM's f and g operators (Shoeybi et al. 2019, Fig. 3).
  const LoweredModel grid = lower_grid({1, 4, 1});
  LoweringOptions o;
  o.micro_batch = 4;
  o.dtype = spec::Dtype::kBf16;
  o.tp = 4;
  const LoweredModel flat = lower(dense(), o);
  ASSERT_EQ(grid.layers.size(), flat.layers.size());
  for (size_t i = 0; i < grid.layers.size(); ++i) {
    const Layer& g = grid.layers[i];
    const Layer& f = flat.layers[i];
    EXPECT_DOUBLE_EQ(g.forward_flops(), f.forward_flops()) << g.name;
    EXPECT_DOUBLE_EQ(g.backward_flops(), f.backward_flops()) << g.name;
    EXPECT_EQ(g.params, f.params) << g.name;
    EXPECT_EQ(g.saved_bytes, f.saved_bytes) << g.name;
    EXPECT_EQ(g.saved_bytes_selective, f.saved_bytes_selective) << g.name;
    EXPECT_EQ(g.saved_bytes_full, f.saved_bytes_full) << g.name;
    EXPECT_EQ(g.sp_partial_params, 0) << g.name;
    // The same collectives, as many and as large, in each pass.
    for (const auto& [gp, fp] : {std::pair{&g.forward, &f.forward}, {&g.backward, &f.backward}}) {
      std::multiset<std::pair<int, int64_t>> go, fo;
      for (const Op& op : *gp)
        if (op.is_comm()) go.emplace(static_cast<int>(op.collective), op.bytes);
      for (const Op& op : *fp)
        if (op.is_comm()) fo.emplace(static_cast<int>(op.collective), op.bytes);
      EXPECT_EQ(go, fo) << g.name;
    }
  }
}

TEST(TensorGridLowering, RefusesAGridTheModelDoesNotDivide) {
  EXPECT_THROW(lower_grid({1, 1, 8}, 4), InputError);  // z 8 over 4 sequences
  EXPECT_THROW(lower_grid({1, 16, 1}), InputError);    // y 16 over 8 heads
  LoweringOptions o;
  o.micro_batch = 4;
  o.tp = 4;
  o.tp_grid = {2, 2, 2};  // 8 ranks laid out, 4 given
  EXPECT_THROW(lower(dense(), o), InputError);
}

}  // namespace
}  // namespace sextant::models
