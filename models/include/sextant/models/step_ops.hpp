// A training step's own ops, those no layer runs: the stage-to-stage transfers and their
// all-gather, the ZeRO and FSDP parameter gathers and gradient reductions, the sums of a tied
// embedding table and of sequence-parallel partial gradients, the optimizer update, and
// ZeRO-Offload's copies and host update. Each is
// described here once (identity, class, collective, group, stream, size); the simulator's program
// builder prices these descriptions, the planner's estimator adds them up, and the executor runs
// and traces them, so the three name, place and size every such op alike by construction.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "sextant/models/lowering.hpp"
#include "sextant/models/op_id.hpp"
#include "sextant/models/optimizer_step.hpp"
#include "sextant/spec/collective.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/trace.hpp"

namespace sextant::models {

// Who takes part in a step op: the simulator maps it to a group slot or peer, the executor to a
// communicator.
enum class StepGroup : uint8_t {
  kReplicas,        // the replicas summing the rank's gradients (RankLayout::replica_group)
  kExpertReplicas,  // the ranks holding the same routed experts (RankLayout::expert_replica_group)
  kTensor,          // the tp group
  kDepth,           // a 3D tensor grid's z axis (RankLayout::grid_group(.., 2))
  kEmbedding,       // the first and the last pipeline stage: a tied table's two copies
  kPeerStage,       // the neighbouring pipeline stage
  kLocal,           // the rank alone
};

struct StepOp {
  OpId id = OpId::kCount;
  spec::OpClass op_class = spec::OpClass::kOptimizer;
  std::optional<spec::CollectiveKind> collective;  // none: the rank's own work
  StepGroup group = StepGroup::kLocal;
  spec::Stream stream = spec::Stream::kCompute;
  // Per rank: a collective's whole tensor (a gather's output, a reduction's input), a transfer's
  // part, the parameters an update runs over.
  int64_t elements = 0;
  int64_t bytes = 0;  // memory or wire bytes, in the caller's element size
};

// A stage-to-stage transfer of an activation (forward) or its gradient (backward) of
// `whole_elements` per rank: the part each rank sends or receives (pipeline_transfer_parts).
StepOp stage_transfer(const spec::Plan& plan, const LoweredModel& lowered, spec::Phase phase,
                      bool send, int64_t whole_elements, int64_t element_bytes);
// The tp all-gather that joins a transfer's parts on the receiver; none when it came whole.
std::optional<StepOp> transfer_gather(const spec::Plan& plan, const LoweredModel& lowered,
                                      int64_t whole_elements, int64_t element_bytes);

// ZeRO's gather of `elements` parameters from the ranks sharing them: a ZeRO-1/2 bucket after
// the update (zero.all_gather), a ZeRO-3 unit before it runs (fsdp.all_gather). `experts`: the
// routed experts' span, gathered from the expert replicas.
StepOp parameter_gather(const spec::Plan& plan, int64_t elements, bool experts,
                        int64_t element_bytes);
// The data-parallel reduction of `elements` gradients: DDP's all-reduce of a bucket
// (dp.all_reduce), ZeRO-1/2's reduce-scatter of a bucket (dp.reduce_scatter), ZeRO-3's of a unit
// (fsdp.reduce_scatter).
StepOp gradient_reduction(const spec::Plan& plan, int64_t elements, bool experts,
                          int64_t element_bytes);

// The end stages' sum of a tied embedding table's gradients after the backward (Megatron's
// embedding group), before the data-parallel reduction of the table; none on other stages, with
// one stage or without a tied table.
std::optional<StepOp> tied_table_sum(const spec::Plan& plan, const LoweredModel& lowered,
                                     int64_t stage, int64_t element_bytes);
// The sum of the partial gradients of what every tp rank holds whole (norms, row-parallel biases)
// under sequence parallelism: one coalesced all-reduce over tp after the backward (Megatron-LM
// finalize_model_grads); on a 3D tensor grid over z, of what the z slices hold alike (AxoNN's
// depth-parallel gradient sync), the last stage's tied table copy included. None when no stage
// parameter is partial.
std::optional<StepOp> partial_gradient_sum(const spec::Plan& plan, const LoweredModel& lowered,
                                           int64_t stage, int64_t element_bytes);

// What a stage reduces after its last backward pass, in this order, before the optimizer: the
// simulator's program builder (finish_batch) and the executor's GradientSync::finish_backward
// walk this one list, and the estimator's drain prices it (spec::StageDrain::after: the tied sum
// and the tied buckets after the rest). Stacks differ on where the tied sum goes: DeepSpeed's
// pipeline engine sums tied weights before the data-parallel reduction (runtime/pipe/schedule.py,
// TrainSchedule: ReduceTiedGrads, ReduceGrads, OptimizerStep); Megatron-LM's
// finalize_model_grads (megatron/core/distributed) sums the embedding group after it and after
// the sequence-parallel sums, its distributed optimizer keeping the table in a bucket of its own
// so that the two stages' shards line up. Sextant sums first: the tied buckets then reduce the
// summed table and no shard has to line up with another stage's.
enum class TailStep : uint8_t {
  kUntiedBuckets,       // the buckets not reduced during the backward (no dp overlap), in order
  kTiedTableSum,        // tied_table_sum, on the end stages
  kTiedBuckets,         // the buckets holding a tied table (GradientBucket::after_tied_sum)
  kPartialGradientSum,  // partial_gradient_sum, after every data-parallel reduction
};
std::span<const TailStep> backward_tail();

// The device optimizer's update of `updated` parameters, its bytes as optimizer_bytes_per_param
// counts them.
StepOp optimizer_update(const OptimizerPrecision& precision, int64_t updated);

// ZeRO-Offload and ZeRO-Infinity (plan `offload`), on the streams offload_stream gives them:
// a rank's reduced gradient shard of `shard_elements` copied to the host;
StepOp gradients_to_host(int64_t shard_elements, int64_t element_bytes);
// a layer's parameter shard fetched from the host (or NVMe through it) before it runs;
StepOp parameters_to_device(int64_t shard_elements, int64_t element_bytes);
// the host optimizer's update of `updated` parameters (CPU-Adam), its bytes as
// host_optimizer_bytes_per_param counts them for the device's `param_dtype`;
StepOp host_update(int64_t updated, spec::Dtype param_dtype);
// and the updated parameters' way back: to the device, or to NVMe where they live there; none
// when they stay in host memory (plan offload.params host).
std::optional<StepOp> updated_parameters_return(const spec::Plan& plan, int64_t updated,
                                                spec::Dtype param_dtype);

}  // namespace sextant::models
