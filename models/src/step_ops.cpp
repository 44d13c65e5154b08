// The step's own ops (step_ops.hpp): one description each.
#include "sextant/models/step_ops.hpp"

namespace sextant::models {

using spec::CollectiveKind;
using spec::OpClass;
using spec::Stream;

namespace {

StepOp collective(OpId id, OpClass cls, CollectiveKind kind, StepGroup group, Stream stream,
                  int64_t elements, int64_t element_bytes) {
  return {id, cls, kind, group, stream, elements, elements * element_bytes};
}

StepGroup replicas(bool experts) {
  return experts ? StepGroup::kExpertReplicas : StepGroup::kReplicas;
}

}  // namespace

StepOp stage_transfer(const spec::Plan& plan, const LoweredModel& lowered, spec::Phase phase,
                      bool send, int64_t whole_elements, int64_t element_bytes) {
  const bool forward = phase == spec::Phase::kFwd;
  const OpId id = send ? (forward ? OpId::kPpSendActivation : OpId::kPpSendGradient)
                       : (forward ? OpId::kPpRecvActivation : OpId::kPpRecvGradient);
  const int64_t part = whole_elements / pipeline_transfer_parts(plan, lowered, whole_elements);
  return collective(id, send ? OpClass::kSend : OpClass::kRecv, CollectiveKind::kSendRecv,
                    StepGroup::kPeerStage, send ? Stream::kPpSend : Stream::kPpRecv, part,
                    element_bytes);
}

std::optional<StepOp> transfer_gather(const spec::Plan& plan, const LoweredModel& lowered,
                                      int64_t whole_elements, int64_t element_bytes) {
  if (pipeline_transfer_parts(plan, lowered, whole_elements) == 1) return std::nullopt;
  return collective(OpId::kPpAllGather, OpClass::kAllGather, CollectiveKind::kAllGather,
                    StepGroup::kTensor, Stream::kTpComm, whole_elements, element_bytes);
}

StepOp parameter_gather(const spec::Plan& plan, int64_t elements, bool experts,
                        int64_t element_bytes) {
  return collective(plan.zero == 3 ? OpId::kFsdpAllGather : OpId::kZeroAllGather,
                    OpClass::kAllGather, CollectiveKind::kAllGather, replicas(experts),
                    Stream::kDpComm, elements, element_bytes);
}

StepOp gradient_reduction(const spec::Plan& plan, int64_t elements, bool experts,
                          int64_t element_bytes) {
  if (plan.zero == 0)
    return collective(OpId::kDpAllReduce, OpClass::kAllReduce, CollectiveKind::kAllReduce,
                      replicas(experts), Stream::kDpComm, elements, element_bytes);
  return collective(plan.zero == 3 ? OpId::kFsdpReduceScatter : OpId::kDpReduceScatter,
                    OpClass::kReduceScatter, CollectiveKind::kReduceScatter, replicas(experts),
                    Stream::kDpComm, elements, element_bytes);
}

std::optional<StepOp> tied_table_sum(const spec::Plan& plan, const LoweredModel& lowered,
                                     int64_t stage, int64_t element_bytes) {
  if (lowered.tied_table_params == 0 || plan.pp == 1) return std::nullopt;
  if (stage != 0 && stage != plan.pp - 1) return std::nullopt;
  // On the data-parallel stream: a gradient reduction like the one it precedes, and waiting for
  // it counts as exposed gradient communication.
  return collective(OpId::kEmbedTiedAllReduce, OpClass::kAllReduce, CollectiveKind::kAllReduce,
                    StepGroup::kEmbedding, Stream::kDpComm, lowered.tied_table_params,
                    element_bytes);
}

std::optional<StepOp> partial_gradient_sum(const spec::Plan& plan, const LoweredModel& lowered,
                                           int64_t stage, int64_t element_bytes) {
  const StageLayers layers = stage_layers(plan, lowered, stage);
  int64_t params = 0;
  for (size_t c = 0; c < layers.chunk_begin.size(); ++c)
    for (size_t l = layers.chunk_begin[c]; l < layers.chunk_end[c]; ++l)
      params += lowered.layers[l].sp_partial_params;
  // The last stage's copy of a tied table (stage_params) is one of them on a grid.
  if (plan.tp_grid.z > 1 && plan.pp > 1 && stage == plan.pp - 1)
    params += lowered.tied_table_params;
  if (params == 0) return std::nullopt;
  const bool grid = plan.tp_grid.any();
  return collective(OpId::kSpAllReduce, OpClass::kAllReduce, CollectiveKind::kAllReduce,
                    grid ? StepGroup::kDepth : StepGroup::kTensor,
                    grid ? Stream::kDepthComm : Stream::kTpComm, params, element_bytes);
}

std::span<const TailStep> backward_tail() {
  static constexpr TailStep kTail[] = {TailStep::kUntiedBuckets, TailStep::kTiedTableSum,
                                       TailStep::kTiedBuckets, TailStep::kPartialGradientSum};
  return kTail;
}

namespace {

StepOp offload_copy(OpId id, OpClass cls, int64_t elements, int64_t bytes) {
  return {id, cls, std::nullopt, StepGroup::kLocal, offload_stream(id), elements, bytes};
}

}  // namespace

StepOp gradients_to_host(int64_t shard_elements, int64_t element_bytes) {
  return offload_copy(OpId::kOffloadGradToHost, OpClass::kMemcpy, shard_elements,
                      shard_elements * element_bytes);
}

StepOp parameters_to_device(int64_t shard_elements, int64_t element_bytes) {
  return offload_copy(OpId::kOffloadParamsToDevice, OpClass::kMemcpy, shard_elements,
                      shard_elements * element_bytes);
}

StepOp host_update(int64_t updated, spec::Dtype param_dtype) {
  return offload_copy(OpId::kOffloadAdamw, OpClass::kOptimizer, updated,
                      updated * host_optimizer_bytes_per_param(param_dtype));
}

std::optional<StepOp> updated_parameters_return(const spec::Plan& plan, int64_t updated,
                                                spec::Dtype param_dtype) {
  if (plan.offload.params == spec::OffloadTarget::kHost) return std::nullopt;
  return offload_copy(plan.offload.params == spec::OffloadTarget::kNvme
                          ? OpId::kOffloadParamsToNvme
                          : OpId::kOffloadParamsToDevice,
                      OpClass::kMemcpy, updated, updated * spec::dtype_bytes(param_dtype));
}

StepOp optimizer_update(const OptimizerPrecision& precision, int64_t updated) {
  return {OpId::kOptimizerAdamw,
          OpClass::kOptimizer,
          std::nullopt,
          StepGroup::kLocal,
          Stream::kCompute,
          updated,
          updated * optimizer_bytes_per_param(precision)};
}

}  // namespace sextant::models
