// The step's own ops (models/step_ops.hpp) on a small GPT, sized by hand.
#include "sextant/models/step_ops.hpp"

#include <gtest/gtest.h>

#include "../support/layout_suite.hpp"
#include "sextant/models/parameter_server.hpp"

namespace sextant::models {
namespace {

using spec::CollectiveKind;
using spec::OpClass;
using spec::Phase;
using spec::Stream;

// layout_suite::tiny_gpt: 4 blocks, hidden 32, ffn 64, LayerNorm with biases, 16 learned
// positions, a vocabulary of 64 tied to the output layer.
LoweredModel tiny_gpt(int64_t tp, bool sp) {
  LoweringOptions o;
  o.tp = tp;
  o.sequence_parallel = sp;
  o.dtype = spec::Dtype::kFp32;
  return lower(layout_suite::tiny_gpt(), o);
}

spec::Plan plan(int64_t dp, int64_t tp, int64_t pp, int zero, bool sp) {
  return layout_suite::plan_of(dp, tp, pp, zero, sp);
}

TEST(StepOps, PartialGradientSumByHand) {
  // Under sequence parallelism each tp rank sums over tp what it holds whole: per block two
  // LayerNorms (weight and bias, 2 x 2 x 32) and the two row-parallel biases (2 x 32), 192; the
  // embedding's 16 x 32 positions, 512; the final LayerNorm, 64.
  const LoweredModel one_stage = tiny_gpt(2, true);
  auto all = partial_gradient_sum(plan(1, 2, 1, 0, true), one_stage, 0, 4);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(all->elements, 512 + 4 * 192 + 64);
  EXPECT_EQ(all->bytes, 4 * all->elements);
  EXPECT_EQ(all->id, OpId::kSpAllReduce);
  EXPECT_EQ(all->collective, CollectiveKind::kAllReduce);
  EXPECT_EQ(all->group, StepGroup::kTensor);
  EXPECT_EQ(all->stream, Stream::kTpComm);
  // Two stages of two blocks each: the embedding's side and the head's.
  const spec::Plan two = plan(1, 2, 2, 0, true);
  EXPECT_EQ(partial_gradient_sum(two, one_stage, 0, 2)->elements, 512 + 2 * 192);
  EXPECT_EQ(partial_gradient_sum(two, one_stage, 1, 2)->elements, 2 * 192 + 64);
  EXPECT_EQ(partial_gradient_sum(two, one_stage, 1, 2)->bytes, 2 * (2 * 192 + 64));
  // Without sequence parallelism every tp rank sees every token: nothing is partial.
  EXPECT_FALSE(partial_gradient_sum(plan(1, 2, 1, 0, false), tiny_gpt(2, false), 0, 4));
}

TEST(StepOps, TiedTableSumOnTheEndStages) {
  // The table of 64 x 32 (tp 1, vocabulary not padded at multiple 1) is summed by the first and
  // the last stage only, and only with stages.
  const LoweredModel lowered = tiny_gpt(1, false);
  const spec::Plan four = plan(1, 1, 4, 0, false);
  for (int64_t stage : {0, 3}) {
    auto sum = tied_table_sum(four, lowered, stage, 2);
    ASSERT_TRUE(sum.has_value()) << stage;
    EXPECT_EQ(sum->elements, 64 * 32);
    EXPECT_EQ(sum->bytes, 2 * 64 * 32);
    EXPECT_EQ(sum->group, StepGroup::kEmbedding);
    EXPECT_EQ(sum->stream, Stream::kDpComm);
  }
  EXPECT_FALSE(tied_table_sum(four, lowered, 1, 2));
  EXPECT_FALSE(tied_table_sum(plan(2, 1, 1, 0, false), lowered, 0, 2));
}

TEST(StepOps, ReductionsAndGathersFollowTheZeroStage) {
  struct Case {
    int zero;
    OpId reduce;
    CollectiveKind kind;
    OpId gather;
  };
  for (Case c :
       {Case{0, OpId::kDpAllReduce, CollectiveKind::kAllReduce, OpId::kZeroAllGather},
        Case{1, OpId::kDpReduceScatter, CollectiveKind::kReduceScatter, OpId::kZeroAllGather},
        Case{2, OpId::kDpReduceScatter, CollectiveKind::kReduceScatter, OpId::kZeroAllGather},
        Case{3, OpId::kFsdpReduceScatter, CollectiveKind::kReduceScatter, OpId::kFsdpAllGather}}) {
    const spec::Plan p = plan(4, 1, 1, c.zero, false);
    const StepOp r = gradient_reduction(p, 1000, false, 4);
    EXPECT_EQ(r.id, c.reduce) << c.zero;
    EXPECT_EQ(r.collective, c.kind) << c.zero;
    EXPECT_EQ(r.bytes, 4000);
    EXPECT_EQ(r.group, StepGroup::kReplicas);
    EXPECT_EQ(r.stream, Stream::kDpComm);
    const StepOp g = parameter_gather(p, 1000, true, 2);
    EXPECT_EQ(g.id, c.gather) << c.zero;
    EXPECT_EQ(g.op_class, OpClass::kAllGather);
    EXPECT_EQ(g.bytes, 2000);
    EXPECT_EQ(g.group, StepGroup::kExpertReplicas);
  }
}

TEST(StepOps, StageTransfersTravelInTpParts) {
  // tp 2 without sequence parallelism: both tp ranks hold the whole activation of 16 tokens x 32,
  // so each sends half and the receiver all-gathers the halves (Megatron's scatter/gather).
  const LoweredModel lowered = tiny_gpt(2, false);
  const spec::Plan p = plan(1, 2, 2, 0, false);
  const int64_t whole = 16 * 32;
  const StepOp send = stage_transfer(p, lowered, Phase::kFwd, true, whole, 2);
  EXPECT_EQ(send.id, OpId::kPpSendActivation);
  EXPECT_EQ(send.elements, whole / 2);
  EXPECT_EQ(send.bytes, whole);
  EXPECT_EQ(send.stream, Stream::kPpSend);
  EXPECT_EQ(send.group, StepGroup::kPeerStage);
  const StepOp recv = stage_transfer(p, lowered, Phase::kBwd, false, whole, 2);
  EXPECT_EQ(recv.id, OpId::kPpRecvGradient);
  EXPECT_EQ(recv.op_class, OpClass::kRecv);
  EXPECT_EQ(recv.stream, Stream::kPpRecv);
  auto gather = transfer_gather(p, lowered, whole, 2);
  ASSERT_TRUE(gather.has_value());
  EXPECT_EQ(gather->id, OpId::kPpAllGather);
  EXPECT_EQ(gather->bytes, 2 * whole);
  EXPECT_EQ(gather->group, StepGroup::kTensor);
  // Under sequence parallelism each rank already holds only its own rows: sent whole.
  const LoweredModel split = tiny_gpt(2, true);
  const spec::Plan sp = plan(1, 2, 2, 0, true);
  EXPECT_EQ(stage_transfer(sp, split, Phase::kFwd, true, whole / 2, 2).elements, whole / 2);
  EXPECT_FALSE(transfer_gather(sp, split, whole / 2, 2));
}

TEST(StepOps, OptimizerUpdateBytes) {
  // fp32 training: AdamW reads param, grad, m, v and writes param, m, v: 7 x 4 = 28 bytes.
  const StepOp update = optimizer_update(OptimizerPrecision{}, 1000);
  EXPECT_EQ(update.id, OpId::kOptimizerAdamw);
  EXPECT_FALSE(update.collective.has_value());
  EXPECT_EQ(update.elements, 1000);
  EXPECT_EQ(update.bytes, 28000);
}

TEST(StepOps, OffloadCopiesAndTheHostUpdate) {
  // ZeRO-Offload: a shard of 1000 gradients to the host in bf16 (2000 bytes), a shard of 1000
  // parameters fetched back (ZeRO-Infinity), both on the streams of their direction.
  const StepOp to_host = gradients_to_host(1000, 2);
  EXPECT_EQ(to_host.id, OpId::kOffloadGradToHost);
  EXPECT_EQ(to_host.bytes, 2000);
  EXPECT_EQ(to_host.stream, Stream::kOffload);
  const StepOp fetch = parameters_to_device(1000, 2);
  EXPECT_EQ(fetch.id, OpId::kOffloadParamsToDevice);
  EXPECT_EQ(fetch.stream, Stream::kOffloadIn);
  // CPU-Adam for bf16 parameters: AdamW over fp32 masters and moments (16 + 12) and the masters
  // written to the bf16 copy (4 + 2): 34 bytes a parameter.
  const StepOp update = host_update(1000, spec::Dtype::kBf16);
  EXPECT_EQ(update.id, OpId::kOffloadAdamw);
  EXPECT_EQ(update.op_class, OpClass::kOptimizer);
  EXPECT_EQ(update.bytes, 34000);
  // The updated bf16 parameters go back to the device, or to NVMe; on the host they stay.
  spec::Plan p = plan(2, 1, 1, 3, false);
  p.offload.optimizer = spec::OffloadTarget::kHost;
  auto back = updated_parameters_return(p, 1000, spec::Dtype::kBf16);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->id, OpId::kOffloadParamsToDevice);
  EXPECT_EQ(back->bytes, 2000);
  p.offload.params = spec::OffloadTarget::kNvme;
  EXPECT_EQ(updated_parameters_return(p, 1000, spec::Dtype::kBf16)->id, OpId::kOffloadParamsToNvme);
  p.offload.params = spec::OffloadTarget::kHost;
  EXPECT_FALSE(updated_parameters_return(p, 1000, spec::Dtype::kBf16));
}

}  // namespace
}  // namespace sextant::models

namespace sextant::models {
namespace {

// Parameter servers' ops by hand: 10 parameters over 4 servers, fp32 gradients and weights.
TEST(ParameterServerOps, BytesOfThePushSumUpdateAndPull) {
  // The push: the rank's whole gradient buffer as an all-to-all, 10 x 4 bytes.
  const StepOp push = ps_push(10, 4);
  EXPECT_EQ(push.bytes, 40);
  EXPECT_EQ(push.collective, spec::CollectiveKind::kAllToAll);
  // The sum over a range of ceil(10 / 4) = 3: 4 parts read and the sum written, 3 x 4 bytes each.
  EXPECT_EQ(ps_sum(10, 4, 4).bytes, 5 * 3 * 4);
  // The update: the optimizer's bytes over the 3, on the data-parallel stream.
  const OptimizerPrecision fp32;
  const StepOp update = ps_update(fp32, 10, 4);
  EXPECT_EQ(update.bytes, 3 * optimizer_bytes_per_param(fp32));
  EXPECT_EQ(update.stream, spec::Stream::kDpComm);
  // The pull: every range of the new version, an all-gather of 10 x 4 bytes (2 in bf16).
  EXPECT_EQ(ps_pull(10, 4).bytes, 40);
  EXPECT_EQ(ps_pull(10, 2).bytes, 20);
  EXPECT_EQ(ps_pull(10, 4).collective, spec::CollectiveKind::kAllGather);
}

}  // namespace
}  // namespace sextant::models
