// The order of one stage rank's training step, decided once: the schedule's passes with the
// boundary transfers around each, and what becomes of a layer's gradients after its backward.
// The simulator's program builder maps the passes onto engine tasks and the executor's trainer
// runs them; both hand a layer's gradients on as layer_gradients says. (The ops themselves are
// described in step_ops.hpp, the step's tail in backward_tail there.)
#pragma once

#include <cstdint>
#include <vector>

#include "sextant/spec/pipeline_schedule.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::models {

// One forward or backward pass of a micro-batch through one of the stage's chunks, with its
// transfers: the boundary tensor arrives from a neighbouring stage before it (forward: the
// activation, from upstream; backward: its gradient, from downstream) and the result leaves for
// the other one after it. The model's first chunk reads the tokens and its last computes the
// loss, so neither receives on that side nor sends past it.
struct PassStep {
  spec::ScheduleUnit unit;  // forward or backward, micro-batch, the stage's local chunk
  int64_t model_chunk = 0;  // the model's chunk it is (spec::chunk_stage)
  bool receives = false;    // the boundary tensor comes from a neighbour first
  bool sends = false;       // the pass's result goes to a neighbour after
  // Upstream is the next rank and downstream the previous one: GEMS' second replica runs up the
  // ring (spec::chunk_runs_up); every other chunk's activations travel from rank r to r + 1.
  bool runs_up = false;
};

// The passes of `stage` in the order it runs them for `micro_batches` micro-batches a batch:
// PipeDream(-2BW)'s units over `batches` batches back to back (spec::pipedream_2bw_units), the
// synchronous schedules' for one batch (spec::pipeline_schedule; `batches` must be 1).
std::vector<PassStep> pass_steps(const spec::Plan& plan, int64_t stage, int64_t micro_batches,
                                 int64_t batches);

// Where a stage's parameters are between its updates.
enum class LayerParameters : uint8_t {
  // Whole on every rank of the stage, each updating all of them: no ZeRO, or one replica.
  kWhole,
  // ZeRO-1/2 over replicas: whole for the passes, but each rank updates its shard of every
  // bucket, and the updated buckets are all-gathered after the update (or beside the next
  // forward, under the stack's param_gather_overlap: Megatron's --overlap-param-gather).
  kGatheredAfterUpdate,
  // ZeRO-3: brought to the device before every pass that runs the layer, all-gathered from the
  // replicas' shards (FSDP) after a fetch from the host or NVMe when offloaded (ZeRO-Infinity,
  // also on one replica).
  kGatheredEachPass,
};
LayerParameters layer_parameters(const spec::Plan& plan);

// What becomes of a layer's gradients once a backward pass through it has run.
enum class LayerGradients : uint8_t {
  // Accumulated where they are and read by the device optimizer: one replica; or parameter
  // servers, which sum the replicas' gradients at the step's end (parameter_server.hpp).
  kKept,
  // Reduced in buckets (gradient_buckets) as the backward completes them, beside the rest of the
  // backward: DDP's and Megatron's overlapped reduction, ZeRO-1/2's reduce-scatters; under
  // ZeRO-Offload each reduced shard then goes to the host.
  kBucketsAsCompleted,
  // Reduced in the same buckets after the whole backward (backward_tail's untied buckets): no
  // overlap (stack dp_overlap off).
  kBucketsAfterBackward,
  // ZeRO-2 over replicas with several micro-batches a step: no rank keeps whole gradients, so
  // every micro-batch's buckets are reduce-scattered as its backward completes them, each rank
  // adding its block to the shard it accumulates (DeepSpeed's stage_1_and_2.py
  // reduce_ready_partitions_and_remove_grads reduces at every micro-step when it partitions
  // gradients, stage 1 only at the accumulation boundary; PyTorch FSDP's SHARD_GRAD_OP outside
  // no_sync). Overlapped or not (without dp_overlap the backward waits for each bucket).
  kBucketsEachPass,
  // ZeRO-3 over the replicas: every micro-batch's gradient of the layer is reduce-scattered to
  // the shards' owners right after its backward (FSDP), then copied to the host under
  // ZeRO-Offload.
  kScatteredEachPass,
  // ZeRO-3 on one replica with the optimizer on the host: the layer's gradients go to the host
  // once the step's last backward has made them.
  kToHostWhenComplete,
};
// The rule for `plan` on a stack that overlaps the data-parallel reduction or not.
LayerGradients layer_gradients(const spec::Plan& plan, bool dp_overlap);
// Whether the gradients are reduced in gradient_buckets, during the backward or after it.
bool bucketed(LayerGradients gradients);
// Whether a backward pass of micro-batch `micro_batch` (counted over the step's batches) is the
// last through its chunk, so that the chunk's layers' gradients are complete: the batch's last
// micro-batch, or under GEMS the last of the half its chunk's replica runs
// (spec/pipeline_schedule.hpp: replica 0 takes the first half, replica 1 the second).
bool completes_gradients(const spec::Plan& plan, int64_t micro_batch, int64_t micro_batches);

// What the step does with a layer's gradients right after a backward pass through it, by
// layer_gradients' rule and whether the pass completes them (completes_gradients); the simulator's
// builder and the executor's GradientSync both act on this.
struct GradientHandoff {
  bool scatter = false;        // reduce-scatter this pass's gradients to the shards' owners
  bool to_host = false;        // then copy them (or the reduced shard) to the host optimizer's
  bool count_buckets = false;  // the layer's buckets may now be complete: count it towards them
  // kBucketsEachPass: a bucket the layer completes is reduced into the accumulated shard, and its
  // count starts again for the next micro-batch
  bool accumulate_shard = false;
};
GradientHandoff gradient_handoff(const spec::Plan& plan, LayerGradients gradients,
                                 int64_t micro_batch, int64_t micro_batches);

}  // namespace sextant::models
