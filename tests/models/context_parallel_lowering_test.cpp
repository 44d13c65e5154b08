// A context-parallel transformer block as the lowering gives it: one rank's s/cp tokens, its
// attention over the whole sequence and the transfers each algorithm needs, counted by hand
// (Transformer Engine's context_parallel.py: AttnFuncWithCPAndKVP2P, ...KVAllGather, ...A2A).
#include <gtest/gtest.h>

#include <vector>

#include "lowered_ops.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::models {
namespace {

using test::find_op;

// llama-tiny: h 64, 4 heads of 16, 2 key/value heads, s 32; two sequences a micro-batch, bf16.
LoweredModel lower_tiny(int64_t cp, spec::ContextAlgorithm algorithm,
                        spec::AttentionKernel attention = spec::AttentionKernel::kFlash2) {
  LoweringOptions o;
  o.micro_batch = 2;
  o.dtype = spec::Dtype::kBf16;
  o.attention = attention;
  o.cp = cp;
  o.cp_algorithm = algorithm;
  return lower(zoo_model("llama-tiny"), o);
}

const Layer& block(const LoweredModel& m) {
  return m.layers[m.split_begin];
}

std::vector<const Op*> all_named(const std::vector<Op>& ops, const std::string& name) {
  std::vector<const Op*> out;
  for (const Op& op : ops)
    if (op.name == name) out.push_back(&op);
  return out;
}

TEST(ContextParallelLowering, EachRankRunsItsShareOfTheTokens) {
  // cp 2: 2 x 32 / 2 = 32 tokens a rank. The QKV GEMM's rows, and every token-wise op's work,
  // halve; so do the activations kept for backward (the flash kernel keeps a log-sum-exp per
  // query row, also halved).
  const LoweredModel whole = lower_tiny(1, spec::ContextAlgorithm::kRing);
  const LoweredModel split = lower_tiny(2, spec::ContextAlgorithm::kRing);
  EXPECT_EQ(split.tokens_per_micro_batch, 32);
  EXPECT_EQ(find_op(block(split).forward, "attn.qkv")->shape[0], 32);
  EXPECT_DOUBLE_EQ(2 * find_op(block(split).forward, "mlp.fc1")->flops,
                   find_op(block(whole).forward, "mlp.fc1")->flops);
  EXPECT_EQ(2 * block(split).saved_bytes, block(whole).saved_bytes);
  EXPECT_EQ(block(split).params, block(whole).params);  // parameters are replicated over cp
}

TEST(ContextParallelLowering, RingAttentionSendsKeyAndValueBlocksBesideEachStep) {
  // cp 4: 8 tokens of each sequence a rank (two chunks of 4 under the causal load balance), 16
  // tokens a micro-batch. The rank's keys and values: 2 x 16 tokens x 2 heads x 16 x 2 B = 2048 B.
  const LoweredModel m = lower_tiny(4, spec::ContextAlgorithm::kRing);
  const int64_t kv = 2 * 16 * 2 * 16 * 2;
  // Forward: 4 attention steps over an 8 x 8 block of each of the 2 x 4 (sequence, head) pairs,
  // 4 b heads sq sk d = 4 x 2 x 4 x 8 x 8 x 16 FLOPs each, the masked half skipped; a transfer of
  // the block in hand beside each step but the last.
  const std::vector<Op>& fw = block(m).forward;
  const std::vector<const Op*> steps = all_named(fw, "attn.core");
  ASSERT_EQ(steps.size(), 4u);
  for (const Op* s : steps) {
    EXPECT_DOUBLE_EQ(s->flops, 4.0 * 2 * 4 * 8 * 8 * 16);
    EXPECT_DOUBLE_EQ(s->kernel_flops, s->flops / 2);
    EXPECT_EQ(s->shape, (std::vector<int64_t>{8, 8, 8, 16}));
    // Only the rank's own block is masked; the others are dense halves of theirs.
    EXPECT_EQ(s->causal, s == steps.front());
  }
  const std::vector<const Op*> sends = all_named(fw, "cp.kv_send");
  ASSERT_EQ(sends.size(), 3u);
  for (size_t i = 0; i < fw.size(); ++i) {
    if (fw[i].name != "cp.kv_send") continue;
    EXPECT_EQ(fw[i].bytes, kv);
    EXPECT_EQ(fw[i].group, CommGroup::kContext);
    EXPECT_EQ(fw[i].collective, spec::CollectiveKind::kSendRecv);
    EXPECT_TRUE(fw[i].beside_next);
    ASSERT_LT(i + 1, fw.size());
    EXPECT_EQ(fw[i + 1].name, "attn.core");  // the step it runs beside
  }
  // The four ranks together do the unsplit attention's work: 4 x 4 steps x 8 x 8 = 32 x 32.
  const LoweredModel whole = lower_tiny(1, spec::ContextAlgorithm::kRing);
  EXPECT_DOUBLE_EQ(4 * 4 * steps[0]->flops, find_op(block(whole).forward, "attn.core")->flops);
  // Backward: the travelling buffer holds the keys and values, then both and the key/value
  // gradient, then the gradient alone: KV, 2 KV, 2 KV, KV = 2 (cp - 1) KV.
  std::vector<int64_t> bytes;
  for (const Op& op : block(m).backward)
    if (op.name == "cp.kv_send") bytes.push_back(op.bytes);
  EXPECT_EQ(bytes, (std::vector<int64_t>{kv, 2 * kv, 2 * kv, kv}));
  EXPECT_EQ(all_named(block(m).backward, "attn.core").size(), 4u);
  // Selective recompute re-runs the attention with its transfers.
  for (const Op* s : sends) EXPECT_TRUE(s->in_core());
}

TEST(ContextParallelLowering, AllGatherAttendsTheRanksQueriesToTheWholeSequence) {
  // cp 2, unfused attention: the keys and values of all 64 tokens gathered (2 x 4096 B), the
  // scores of the rank's 16 queries of each sequence against all 32 keys; backward gathers again
  // and reduce-scatters the key/value gradient.
  const LoweredModel m =
      lower_tiny(2, spec::ContextAlgorithm::kAllGather, spec::AttentionKernel::kUnfused);
  const int64_t kv = 2 * 32 * 2 * 16 * 2;
  const Op* gather = find_op(block(m).forward, "cp.kv_all_gather");
  ASSERT_NE(gather, nullptr);
  EXPECT_EQ(gather->bytes, 2 * kv);
  EXPECT_EQ(gather->collective, spec::CollectiveKind::kAllGather);
  EXPECT_EQ(gather->group, CommGroup::kContext);
  const Op* scores = find_op(block(m).forward, "attn.scores");
  EXPECT_EQ(scores->shape, (std::vector<int64_t>{8, 16, 32, 16}));
  EXPECT_DOUBLE_EQ(scores->flops, 2.0 * 8 * 16 * 32 * 16);
  const std::vector<Op>& bw = block(m).backward;
  ASSERT_NE(find_op(bw, "cp.kv_all_gather"), nullptr);
  const Op* scatter = find_op(bw, "cp.kv_reduce_scatter");
  ASSERT_NE(scatter, nullptr);
  EXPECT_EQ(scatter->bytes, 2 * kv);
  EXPECT_EQ(scatter->collective, spec::CollectiveKind::kReduceScatter);
  // The probabilities kept: 2 sequences x 4 heads x 16 x 32 in bf16, half the unsplit 32 x 32.
  const LoweredModel whole =
      lower_tiny(1, spec::ContextAlgorithm::kAllGather, spec::AttentionKernel::kUnfused);
  EXPECT_EQ(2 * block(m).saved_bytes, block(whole).saved_bytes);
}

TEST(ContextParallelLowering, UlyssesTradesTheSequenceSplitForAHeadSplit) {
  // cp 2: q, k, v of the rank's 32 tokens ((4 + 2 x 2) heads x 16 x 2 B = 8192 B) all-to-all'ed
  // to 2 of the 4 heads over all 64 tokens; the output (4 heads, 4096 B) back after attention.
  const LoweredModel m = lower_tiny(2, spec::ContextAlgorithm::kAllToAll);
  const std::vector<Op>& fw = block(m).forward;
  const Op* in = find_op(fw, "cp.qkv_all_to_all");
  const Op* out = find_op(fw, "cp.out_all_to_all");
  ASSERT_NE(in, nullptr);
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(in->bytes, 32 * 8 * 16 * 2);
  EXPECT_EQ(out->bytes, 32 * 4 * 16 * 2);
  EXPECT_EQ(in->op_class, spec::OpClass::kAllToAll);
  EXPECT_EQ(find_op(fw, "attn.core")->shape, (std::vector<int64_t>{4, 32, 32, 16}));
  // Backward the other way round: the output gradient first, the q, k, v gradients last.
  const std::vector<Op>& bw = block(m).backward;
  std::vector<std::string> order;
  for (const Op& op : bw)
    if (op.group == CommGroup::kContext) order.push_back(op.name);
  EXPECT_EQ(order, (std::vector<std::string>{"cp.out_all_to_all", "cp.qkv_all_to_all"}));
}

TEST(ContextParallelLowering, WhatASplitCannotDoIsRefused) {
  // Ulysses gives each rank whole heads: 2 key/value heads do not split 4 ways.
  EXPECT_THROW(lower_tiny(4, spec::ContextAlgorithm::kAllToAll), InputError);
  // Ring attention merges blockwise flash results.
  try {
    lower_tiny(2, spec::ContextAlgorithm::kRing, spec::AttentionKernel::kUnfused);
    FAIL() << "ring attention over unfused attention was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("fused attention"), std::string::npos) << e.what();
  }
  // 2 x 32 chunks do not divide 32 tokens.
  EXPECT_THROW(lower_tiny(32, spec::ContextAlgorithm::kAllGather), InputError);
}

}  // namespace
}  // namespace sextant::models
