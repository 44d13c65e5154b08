// The identity of every op the lowering, the simulator and the executor name: one enum, one name
// table. The trace carries the name (the contract with `compare`, calibration and the Chrome
// trace); code names ops only through OpId, so a misspelt op is a compile error rather than an
// op one side has and the other does not.
//
// Two kinds of op:
// - fixed ops, one per model part ("attn.qkv", "pp.send_activation"): the name is the table's;
// - scoped ops of a named unit of a multilayer perceptron or a convolutional network, whose
//   layers are numbered ("fc3", "layer2.conv1"): the name is the scope, a dot and the table's
//   suffix ("layer2.conv1.bn"), or the scope alone for the unit's own product (kUnitProduct).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "sextant/spec/trace.hpp"

namespace sextant::models {

// X(enumerator, name): ops with a name of their own.
#define SEXTANT_FIXED_OPS(X)                                                    \
  /* A transformer block's attention half (Megatron-LM's ParallelAttention). */ \
  X(kAttnNorm, "attn.norm")                                                     \
  X(kAttnCast, "attn.cast")                                                     \
  X(kAttnInputGradSum, "attn.input_grad_sum")                                   \
  X(kAttnQkv, "attn.qkv")                                                       \
  X(kAttnQkvBiasGrad, "attn.qkv_bias_grad")                                     \
  X(kAttnRope, "attn.rope")                                                     \
  X(kAttnRepeatKv, "attn.repeat_kv")                                            \
  X(kAttnCorePrep, "attn.core_prep")                                            \
  X(kAttnLayoutCopy, "attn.layout_copy")                                        \
  X(kAttnScores, "attn.scores")                                                 \
  X(kAttnSoftmax, "attn.softmax")                                               \
  X(kAttnDropout, "attn.dropout")                                               \
  X(kAttnContext, "attn.context")                                               \
  X(kAttnCore, "attn.core")                                                     \
  X(kAttnCpMerge, "attn.cp_merge")                                              \
  X(kAttnFp8Cast, "attn.fp8_cast")                                              \
  X(kAttnProj, "attn.proj")                                                     \
  X(kAttnProjBiasGrad, "attn.proj_bias_grad")                                   \
  X(kAttnResidual, "attn.residual")                                             \
  X(kAttnAllReduce, "attn.all_reduce")                                          \
  X(kAttnReduceScatter, "attn.reduce_scatter")                                  \
  X(kAttnAllGather, "attn.all_gather")                                          \
  /* Its MLP half. */                                                           \
  X(kMlpNorm, "mlp.norm")                                                       \
  X(kMlpCast, "mlp.cast")                                                       \
  X(kMlpInputGradSum, "mlp.input_grad_sum")                                     \
  X(kMlpFc1, "mlp.fc1")                                                         \
  X(kMlpFc1BiasGrad, "mlp.fc1_bias_grad")                                       \
  X(kMlpAct, "mlp.act")                                                         \
  X(kMlpFp8Cast, "mlp.fp8_cast")                                                \
  X(kMlpFc2, "mlp.fc2")                                                         \
  X(kMlpFc2BiasGrad, "mlp.fc2_bias_grad")                                       \
  X(kMlpResidual, "mlp.residual")                                               \
  X(kMlpAllReduce, "mlp.all_reduce")                                            \
  X(kMlpReduceScatter, "mlp.reduce_scatter")                                    \
  X(kMlpAllGather, "mlp.all_gather")                                            \
  /* The weights' cast under torch.autocast. */                                 \
  X(kAutocastWeights, "autocast.weights")                                       \
  /* A 3D tensor grid's linear layers (AxoNN): weight gathers, partial sums. */ \
  X(kAttnQkvWeightGather, "attn.qkv.weight_gather")                             \
  X(kAttnQkvAllReduce, "attn.qkv.all_reduce")                                   \
  X(kAttnQkvGradScatter, "attn.qkv.grad_scatter")                               \
  X(kAttnProjWeightGather, "attn.proj.weight_gather")                           \
  X(kAttnProjAllReduce, "attn.proj.all_reduce")                                 \
  X(kAttnProjGradScatter, "attn.proj.grad_scatter")                             \
  X(kMlpFc1WeightGather, "mlp.fc1.weight_gather")                               \
  X(kMlpFc1AllReduce, "mlp.fc1.all_reduce")                                     \
  X(kMlpFc1GradScatter, "mlp.fc1.grad_scatter")                                 \
  X(kMlpFc2WeightGather, "mlp.fc2.weight_gather")                               \
  X(kMlpFc2AllReduce, "mlp.fc2.all_reduce")                                     \
  X(kMlpFc2GradScatter, "mlp.fc2.grad_scatter")                                 \
  /* A mixture of experts' MLP. */                                              \
  X(kMoeRouter, "moe.router")                                                   \
  X(kMoeRoute, "moe.route")                                                     \
  X(kMoePermute, "moe.permute")                                                 \
  X(kMoeFc1, "moe.fc1")                                                         \
  X(kMoeAct, "moe.act")                                                         \
  X(kMoeFc2, "moe.fc2")                                                         \
  X(kMoeUnpermute, "moe.unpermute")                                             \
  X(kMoeSharedFc1, "moe.shared_fc1")                                            \
  X(kMoeSharedAct, "moe.shared_act")                                            \
  X(kMoeSharedFc2, "moe.shared_fc2")                                            \
  X(kMoeDispatch, "moe.dispatch")                                               \
  X(kMoeCombine, "moe.combine")                                                 \
  X(kMoeAllGather, "moe.all_gather")                                            \
  X(kMoeReduceScatter, "moe.reduce_scatter")                                    \
  X(kMoeSharedAllGather, "moe.shared_all_gather")                               \
  X(kMoeSharedReduceScatter, "moe.shared_reduce_scatter")                       \
  X(kMoeRouteAllGather, "moe.route_all_gather")                                 \
  X(kMoeRouteReduceScatter, "moe.route_reduce_scatter")                         \
  /* Context parallelism's transfers. */                                        \
  X(kCpKvSend, "cp.kv_send")                                                    \
  X(kCpKvAllGather, "cp.kv_all_gather")                                         \
  X(kCpKvReduceScatter, "cp.kv_reduce_scatter")                                 \
  X(kCpQkvAllToAll, "cp.qkv_all_to_all")                                        \
  X(kCpOutAllToAll, "cp.out_all_to_all")                                        \
  /* The embedding and the output layer. */                                     \
  X(kEmbedLookup, "embed.lookup")                                               \
  X(kEmbedGradFill, "embed.grad_fill")                                          \
  X(kEmbedPosition, "embed.position")                                           \
  X(kEmbedNorm, "embed.norm")                                                   \
  X(kEmbedAllReduce, "embed.all_reduce")                                        \
  X(kEmbedReduceScatter, "embed.reduce_scatter")                                \
  X(kEmbedAllGather, "embed.all_gather")                                        \
  X(kEmbedTiedAllReduce, "embed.tied_all_reduce")                               \
  X(kHeadNorm, "head.norm")                                                     \
  X(kHeadCast, "head.cast")                                                     \
  X(kHeadLogits, "head.logits")                                                 \
  X(kHeadLoss, "head.loss")                                                     \
  X(kHeadLossCast, "head.loss_cast")                                            \
  X(kHeadLossAllReduce, "head.loss_all_reduce")                                 \
  X(kHeadAllReduce, "head.all_reduce")                                          \
  X(kHeadReduceScatter, "head.reduce_scatter")                                  \
  X(kHeadAllGather, "head.all_gather")                                          \
  /* A multilayer perceptron's or a convolutional network's loss. */            \
  X(kLoss, "loss")                                                              \
  /* Pipeline transfers and PipeDream-2BW's weight stash. */                    \
  X(kPpSendActivation, "pp.send_activation")                                    \
  X(kPpRecvActivation, "pp.recv_activation")                                    \
  X(kPpSendGradient, "pp.send_gradient")                                        \
  X(kPpRecvGradient, "pp.recv_gradient")                                        \
  X(kPpAllGather, "pp.all_gather")                                              \
  X(kPpWeightStash, "pp.weight_stash")                                          \
  /* Gradient reduction and parameter gathers (DDP, ZeRO, FSDP). */             \
  X(kDpAllReduce, "dp.all_reduce")                                              \
  X(kDpReduceScatter, "dp.reduce_scatter")                                      \
  X(kZeroAllGather, "zero.all_gather")                                          \
  X(kFsdpAllGather, "fsdp.all_gather")                                          \
  X(kFsdpReduceScatter, "fsdp.reduce_scatter")                                  \
  X(kFsdpGradCopyIn, "fsdp.grad_copy_in")                                       \
  X(kFsdpParamCopyOut, "fsdp.param_copy_out")                                   \
  X(kSpAllReduce, "sp.all_reduce")                                              \
  /* Compressed gradient exchanges (gradient_compression.hpp). */               \
  X(kDpCompress, "dp.compress")                                                 \
  X(kDpCompressedAllGather, "dp.compressed_all_gather")                         \
  X(kDpDecompress, "dp.decompress")                                             \
  X(kDpPowerSgdPAllReduce, "dp.powersgd_p_all_reduce")                          \
  X(kDpPowerSgdProject, "dp.powersgd_project")                                  \
  X(kDpPowerSgdQAllReduce, "dp.powersgd_q_all_reduce")                          \
  X(kDpSparseExchange, "dp.sparse_exchange")                                    \
  X(kDpSparseMerge, "dp.sparse_merge")                                          \
  X(kDpSparseSplit, "dp.sparse_split")                                          \
  X(kDpSparseGather, "dp.sparse_gather")                                        \
  /* Parameter servers (parameter_server.hpp). */                               \
  X(kDpPsPush, "dp.ps_push")                                                    \
  X(kDpPsSum, "dp.ps_sum")                                                      \
  X(kDpPsPull, "dp.ps_pull")                                                    \
  /* The optimizer step, on the device or offloaded. */                         \
  X(kOptimizerAdamw, "optimizer.adamw")                                         \
  X(kOffloadGradToHost, "offload.grad_to_host")                                 \
  X(kOffloadAdamw, "offload.adamw")                                             \
  X(kOffloadParamsToDevice, "offload.params_to_device")                         \
  X(kOffloadParamsToNvme, "offload.params_to_nvme")                             \
  /* A layer's saved activations to the host after its forward and back. */     \
  X(kOffloadActivationsToHost, "offload.activations_to_host")                   \
  X(kOffloadActivationsToDevice, "offload.activations_to_device")               \
  X(kStepHost, "step.host")

// X(enumerator, suffix): ops of a named unit (an MLP's "fc3", a CNN's "layer2" and its
// convolution "layer2.conv1").
#define SEXTANT_SCOPED_OPS(X)                                                                 \
  X(kUnitProduct, "") /* the unit's own GEMM: an MLP's fc, a CNN's convolution */             \
  X(kUnitAct, "act")                                                                          \
  X(kUnitRelu, "relu")                                                                        \
  X(kUnitBatchNorm, "bn")                                                                     \
  X(kUnitBatchNormAllReduce, "bn_allreduce")                                                  \
  X(kUnitHalo, "halo")                                                                        \
  X(kUnitFilterReduceScatter, "filter_reduce_scatter")                                        \
  X(kUnitFilterAllGather, "filter_all_gather")                                                \
  X(kUnitChannelAllGather, "channel_all_gather")                                              \
  X(kUnitChannelReduceScatter, "channel_reduce_scatter")                                      \
  X(kUnitPool, "pool")                                                                        \
  X(kUnitPoolAllReduce, "pool_allreduce")                                                     \
  X(kUnitFc, "fc")                                                                            \
  X(kUnitFcAllReduce, "fc.all_reduce")                                                        \
  X(kUnitResidual, "residual")                                                                \
  X(kUnitConcat, "concat")                                                                    \
  /* SUPER's branch split (spec/branch_parallel.hpp): a module's join, its input gradient. */ \
  X(kUnitBranchAllGather, "branch_all_gather")                                                \
  X(kUnitBranchAllReduce, "branch_all_reduce")                                                \
  /* A per-op plan's resharding collectives (spec/sharding.hpp), scoped by the op fed. */     \
  X(kUnitReshardAllGather, "reshard_all_gather")                                              \
  X(kUnitReshardReduceScatter, "reshard_reduce_scatter")                                      \
  X(kUnitReshardAllReduce, "reshard_all_reduce")                                              \
  X(kUnitReshardAllToAll, "reshard_all_to_all")

enum class OpId : uint8_t {
#define SEXTANT_OP_ENUMERATOR(id, text) id,
  SEXTANT_FIXED_OPS(SEXTANT_OP_ENUMERATOR) SEXTANT_SCOPED_OPS(SEXTANT_OP_ENUMERATOR)
#undef SEXTANT_OP_ENUMERATOR
      kCount,
};

// Whether `id` is an op of a named unit (needs a scope).
bool op_is_scoped(OpId id);
// A fixed op's name, or a scoped op's suffix ("" for kUnitProduct).
std::string_view op_text(OpId id);

// An op's identity and its name in the traces. Implicit from a fixed OpId; a scoped op takes its
// unit's name. A fixed id with a scope, or a scoped one without, is a logic error (SEXTANT_CHECK).
class OpName {
 public:
  OpName(OpId id);  // NOLINT(google-explicit-constructor): a fixed op reads as its id
  OpName(std::string_view scope, OpId id);
  OpId id() const { return id_; }
  const std::string& str() const { return name_; }
  bool operator==(const OpName&) const = default;

 private:
  OpId id_;
  std::string name_;
};

// The name of a fixed op as the trace writes it (a scoped id is a logic error).
const std::string& op_name(OpId id);

// The stream an offload op (offload.*) runs on: copies to the device on kOffloadIn, the rest
// (copies to the host or NVMe, the host optimizer step) on kOffload. Any other op is a logic
// error (SEXTANT_CHECK).
spec::Stream offload_stream(OpId id);

// The tensor-parallel collectives of one part of a transformer (Megatron-LM): the row-parallel
// output's all-reduce, or its reduce-scatter and the all-gather before the column-parallel input
// under sequence parallelism.
struct PartCollectives {
  OpId all_reduce, reduce_scatter, all_gather;
};
inline constexpr PartCollectives kAttnCollectives{OpId::kAttnAllReduce, OpId::kAttnReduceScatter,
                                                  OpId::kAttnAllGather};
inline constexpr PartCollectives kMlpCollectives{OpId::kMlpAllReduce, OpId::kMlpReduceScatter,
                                                 OpId::kMlpAllGather};
inline constexpr PartCollectives kEmbedCollectives{OpId::kEmbedAllReduce, OpId::kEmbedReduceScatter,
                                                   OpId::kEmbedAllGather};
inline constexpr PartCollectives kHeadCollectives{OpId::kHeadAllReduce, OpId::kHeadReduceScatter,
                                                  OpId::kHeadAllGather};

// One linear layer of a 3D tensor grid (AxoNN): its product, the weight block's gather over z,
// the partial sums' all-reduce and the weight gradient's reduce-scatter over z.
struct GridLinearOps {
  OpId product, weight_gather, all_reduce, grad_scatter;
};
inline constexpr GridLinearOps kGridQkv{OpId::kAttnQkv, OpId::kAttnQkvWeightGather,
                                        OpId::kAttnQkvAllReduce, OpId::kAttnQkvGradScatter};
inline constexpr GridLinearOps kGridProj{OpId::kAttnProj, OpId::kAttnProjWeightGather,
                                         OpId::kAttnProjAllReduce, OpId::kAttnProjGradScatter};
inline constexpr GridLinearOps kGridFc1{OpId::kMlpFc1, OpId::kMlpFc1WeightGather,
                                        OpId::kMlpFc1AllReduce, OpId::kMlpFc1GradScatter};
inline constexpr GridLinearOps kGridFc2{OpId::kMlpFc2, OpId::kMlpFc2WeightGather,
                                        OpId::kMlpFc2AllReduce, OpId::kMlpFc2GradScatter};
// The grid ops of the linear layer whose product is `product` (a logic error for another op).
const GridLinearOps& grid_linear_ops(OpId product);

}  // namespace sextant::models
