// The builder of one stage's program (program_builder.hpp), shared by the files that build its
// parts: the step's order (program_builder.cpp), a layer's ops (stage_builder_layers.cpp), the
// gradients, parameters and optimizer (stage_builder_gradients.cpp) and the host copies
// (stage_builder_offload.cpp).
#pragma once

#include <fmt/format.h>

#include <map>
#include <numeric>

#include "sextant/models/gradient_compression.hpp"
#include "sextant/models/optimizer_step.hpp"
#include "sextant/models/parameter_server.hpp"
#include "sextant/models/step_ops.hpp"
#include "sextant/models/step_program.hpp"
#include "sextant/sim/host_issue.hpp"
#include "sextant/sim/layer_cost.hpp"
#include "sextant/sim/program_builder.hpp"
#include "sextant/spec/pipeline_schedule.hpp"

namespace sextant::sim {

using models::OpId;
using spec::Phase;
using spec::Stream;

class StageBuilder {
 public:
  StageBuilder(const spec::Plan& plan, const spec::Stack& stack,
               const models::LoweredModel& lowered, const ComputeModel& compute, int64_t stage,
               const OffloadCost* offload, int64_t batches)
      : plan_(plan),
        stack_(stack),
        lowered_(lowered),
        compute_(compute),
        offload_(offload),
        stage_(stage),
        layers_(stage_layers(plan, lowered, stage)),
        recompute_(models::layer_recompute(plan, lowered)),
        activations_offloaded_(models::layer_activation_offload(plan, lowered)),
        elem_bytes_(spec::dtype_bytes(lowered.dtype)),
        grad_bytes_(spec::dtype_bytes(spec::gradient_dtype(stack, lowered.dtype))),
        gradients_(models::layer_gradients(plan, stack.dp_overlap)),
        micro_batches_(plan.micro_batches()),
        batches_(batches) {
    SEXTANT_CHECK(offload_ != nullptr || !plan.offload.any(),
                  "plan {} offloads: the program needs the offload prices", plan.name());
    SEXTANT_CHECK(batches == 1 || asynchronous() || servers(),
                  "plan {}: only PipeDream(-2BW) and parameter servers run batches back to back",
                  plan.name());
  }

  Program build();

 private:
  bool asynchronous() const { return spec::asynchronous(plan_.schedule); }
  bool servers() const { return plan_.parameter_server.enabled; }
  // Under GEMS a rank and its mirror may finish their two chunks' buckets in different orders:
  // each bucket is issued once it and every bucket before it in the list are ready, the order
  // every member of the group issues them in (the executor's too).
  bool buckets_in_order() const { return plan_.schedule == spec::Schedule::kGems; }

  // Through parameter servers (spec/parameter_server.hpp): the window's batches one after another,
  // each its schedule's units with a flush. Batch b reads the version after b - s updates: its
  // first compute waits for the pull of batch b - s - 1's update.
  void parameter_server_batches();

  // A server's step after the tail's sums, on the data-parallel stream: the push of the rank's
  // gradients, its range's sum and update, and the pull of every range's new version. The
  // compute stream goes on with the next batch; only the batch that reads this version waits.
  void parameter_server_exchange();

  // A step op of the rank's own on the data-parallel stream (a server's work), taking `duration`.
  int32_t dp_local_task(const models::StepOp& op, Picoseconds duration,
                        const std::vector<Dep>& deps);
  bool last_of_batch(int64_t micro_batch) const {
    return micro_batch % micro_batches_ == micro_batches_ - 1;
  }

  // The end of a batch: the gradient reductions not yet issued (models::backward_tail, the
  // executor's order), then the optimizer step.
  void finish_batch();

  bool offload_optimizer() const { return plan_.offload.optimizer != spec::OffloadTarget::kNone; }
  bool offload_params() const { return plan_.offload.params != spec::OffloadTarget::kNone; }
  // ZeRO-3 fetches each layer's parameters before it runs: all-gathered from the data-parallel
  // group, and first copied to the device from the host when offloaded.
  bool fetches_params() const {
    return models::layer_parameters(plan_) == models::LayerParameters::kGatheredEachPass;
  }
  // ZeRO-1/2 over replicas: the updated buckets are all-gathered.
  bool gathers_updates() const {
    return models::layer_parameters(plan_) == models::LayerParameters::kGatheredAfterUpdate;
  }
  // A rank's ZeRO shard of a span of `params` parameters over the replicas (models::zero_shard).
  int64_t shard(int64_t params) const { return models::zero_shard(params, plan_.replicas()); }
  // The ranks a bucket's gradients are summed over: the replicas, or for routed experts under
  // expert parallelism the expert replicas (spec/expert_parallel.hpp).
  int64_t bucket_ranks(const models::GradientBucket& b) const {
    return b.experts ? plan_.expert_replicas() : plan_.replicas();
  }
  // The parameters the rank updates and keeps optimizer state for: its padded ZeRO shards
  // (models::zero_updated_params, the executor's spans), or the stage's.
  int64_t updated_params() const {
    return models::zero_updated_params(plan_, lowered_, stage_, buckets_);
  }

  // A local task on the offload stream (a device-host copy, the host optimizer step) after
  // `deps`.
  int32_t offload_task(OpId name, spec::OpClass cls, int64_t bytes, Picoseconds duration,
                       Phase phase, int64_t mb, int32_t layer, const std::vector<Dep>& deps);
  int32_t offload_task(const models::StepOp& op, Picoseconds duration, Phase phase, int64_t mb,
                       int32_t layer, const std::vector<Dep>& deps);

  // The rank's gradient shard of `params` parameters, copied to the host once reduced
  // (`after`: the reduction, or the compute that produced it).
  void gradients_to_host(int64_t params, int64_t mb, int32_t layer, int32_t after);

  // Where a pass's forward input comes from and its output goes: the ring's previous and next
  // rank, or for GEMS' second replica the next and previous one on that replica's channels.
  static PeerSlot upstream(const models::PassStep& p) {
    return p.runs_up ? PeerSlot::kNextUp : PeerSlot::kPrev;
  }
  static PeerSlot downstream(const models::PassStep& p) {
    return p.runs_up ? PeerSlot::kPrevUp : PeerSlot::kNext;
  }
  bool is_block(size_t layer) const {
    return layer >= lowered_.split_begin && layer < lowered_.split_end &&
           lowered_.layers[layer].kind == models::LayerKind::kBlock;
  }

  int32_t op_id(size_t layer, const models::Op& op, Phase phase);

  Dep done(int32_t task) const {
    const Task& t = program_.tasks[static_cast<size_t>(task)];
    return {static_cast<uint8_t>(t.stream), positions_[static_cast<size_t>(task)] + 1};
  }

  int32_t emit(Task t, const std::vector<Dep>& deps);

  // Ends the compute segment being gathered; returns the last compute task (or -1).
  int32_t flush();

  // The point a task issued now on another stream follows: the last compute, and what the next
  // compute already waits for (a received activation or gradient, a reloaded layer). A framework
  // issues it in program order behind those waits: the compute stream waits on their events and
  // the side stream on the compute stream's (Megatron-LM's p2p receive waits on the current
  // stream; Transformer Engine's and NCCL's side streams wait on it), so a backward's first
  // all-gather cannot start before the gradient it gathers has arrived. Waits with no compute
  // gathered yet become a compute task of no ops that holds them.
  int32_t issue_point(Phase phase, int64_t mb);

  // The next compute op waits for `task`. Waits on one stream merge into the latest (a stream
  // completes in order), so a task has at most one dependency per other stream.
  void require(int32_t task);

  void compute_op(size_t layer, const models::Op& op, Phase phase, int64_t mb);

  int32_t comm(Stream stream, CommClass cls, uint8_t slot, TaskKind kind,
               spec::CollectiveKind collective, int64_t bytes, int32_t op, Phase phase, int64_t mb,
               int32_t after, int32_t also = -1);

  // A layer's collective: in the layer group (tensor-parallel), the spatial group (a spatial
  // split's halo exchanges and partial-sum all-reduces), the context-parallel, the
  // expert-parallel group or a line of a tensor grid. Waits for the compute before it; returns
  // the task.
  int32_t layer_collective(size_t layer, const models::Op& op, Phase phase, int64_t mb);

  // A collective between compute segments: the compute after it waits for it.
  void tp_collective(size_t layer, const models::Op& op, Phase phase, int64_t mb) {
    require(layer_collective(layer, op, phase, mb));
  }

  // A ring attention step (models::Op::beside_next): the transfer of the next block starts once
  // the compute before it is done (its buffer is free again) and runs beside the step's
  // attention; what follows the attention waits for it.
  void ring_step(size_t layer, const models::Op& transfer, const models::Op& attention, Phase phase,
                 int64_t mb);

  int32_t named_op(OpId id, spec::OpClass cls, int64_t bytes, int32_t layer) {
    return named_op(models::op_name(id), cls, bytes, layer);
  }
  int32_t named_op(const std::string& name, spec::OpClass cls, int64_t bytes, int32_t layer);

  // A step op (models/step_ops.hpp) as an engine task on its stream and in its group (a transfer:
  // to or from `peer`), after `after` and `also`.
  int32_t step_comm(const models::StepOp& op, Phase phase, int64_t mb, int32_t after,
                    int32_t layer = -1, int32_t also = -1, PeerSlot peer = PeerSlot::kPrev);
  static uint8_t group_slot(models::StepGroup group);
  // What waiting for a step op counts as: pipeline time for the stage-to-stage exchange (its
  // all-gather included), FSDP time for ZeRO-3's gathers and scatters, tensor-parallel time for
  // the partial sums, data-parallel time for the other gradient and parameter collectives.
  static CommClass step_class(const models::StepOp& op);

  // Activation (or gradient) crossing the boundary in front of `first_layer`, per rank, whole.
  int64_t boundary_bytes(size_t first_layer) const {
    return lowered_.layers[first_layer - 1].output_bytes;
  }
  // The stage-to-stage transfers travel in parts (models::stage_transfer: Megatron's
  // scatter/gather), joined by an all-gather on the receiver.
  void receive(PeerSlot from, int64_t full, Phase phase, int64_t mb, int32_t layer);

  void send(PeerSlot to, int64_t full, Phase phase, int64_t mb, int32_t layer);

  // ZeRO-3: all-gather a layer's parameters from the data-parallel group: one flat parameter
  // (FSDP), or one coalesced gather per module (DeepSpeed). Returns the last gather.
  int32_t gather_params(size_t layer, Phase phase, int64_t mb, int32_t after);

  // The routed experts' parameters of `layer` whose state the expert replicas shard (ep > 1).
  int64_t expert_params(size_t layer) const {
    return plan_.ep > 1 ? lowered_.layers[layer].expert_params : 0;
  }

  // Runs `layers` (in pass order) with ZeRO-3 parameter gathers when the plan shards parameters;
  // the gathers of the next `zero3_prefetch` layers run while a layer computes. A layer without
  // parameters (a CNN's pools and concats) gathers nothing, as the executor's hooks find no
  // parameters of it.
  template <typename Body>
  void pass(const std::vector<size_t>& order, Phase phase, int64_t mb, Body body) {
    const bool fsdp = fetches_params();
    const size_t ahead = static_cast<size_t>(stack_.zero3_prefetch);
    std::vector<int32_t> gathers(order.size(), -1);
    // A unit that kept its parameters from the forward is not gathered for its backward.
    auto holds_params = [&](size_t i) {
      const models::Layer& layer = lowered_.layers[order[i]];
      return layer.params > 0 && !(phase == Phase::kBwd && layer.kept_for_backward);
    };
    for (size_t i = 0; i < order.size(); ++i) {
      if (fsdp && holds_params(i)) {
        int32_t before = issue_point(phase, mb);
        for (size_t j = i; j <= i + ahead && j < order.size(); ++j)
          if (gathers[j] < 0 && holds_params(j))
            gathers[j] = gather_params(order[j], phase, mb, before);
        require(gathers[i]);
      }
      body(order[i]);
      if (fsdp) flush();  // layer boundary: gathers and reduce-scatters hook on it
    }
  }

  // ZeRO-1/2 with the parameter all-gather overlapped (Megatron's --overlap-param-gather): the
  // parameters updated by the previous step are gathered in buckets while the first micro-batch
  // runs forward, each layer waiting for its bucket. A step in steady state looks the same.
  void gather_parameters_ahead();

  // ZeRO-1/2: all-gather a bucket's updated parameters from the data-parallel group (none for a
  // bucket of parameterless layers, or of weights no replica shards: reduce_bucket's rule).
  int32_t gather_bucket(const models::GradientBucket& b, Phase phase, int64_t mb, int32_t after) {
    if (b.params == 0) return after;
    return step_comm(models::parameter_gather(plan_, b.params, b.experts, elem_bytes_), phase, mb,
                     after);
  }

  bool tp_overlapped(size_t layer, Phase phase) const {
    return tp_overlap_applies(plan_, stack_, is_block(layer), phase);
  }

  // An all-gather feeding the GEMM after it, split in chunks (tp_overlap_chunks): the
  // GEMM starts on the first chunk while the others arrive; what follows waits for all of them.
  void gathered_gemm(size_t layer, const models::Op& gather, const models::Op& gemm, Phase phase,
                     int64_t mb);

  // A GEMM whose output is reduce-scattered in chunks as it is produced (tp_overlap_chunks): all
  // but the last chunk's reduction run beside the GEMM; the tp stream orders the last after them.
  void scattered_gemm(size_t layer, const models::Op& gemm, const models::Op& scatter, Phase phase,
                      int64_t mb);

  // The grid overlap's split backward GEMMs (split_backward_gemm), kept for op_id's keys.
  const BackwardProducts& backward_products(const models::Op& op) {
    auto it = split_gemms_.find(&op);
    if (it == split_gemms_.end()) it = split_gemms_.emplace(&op, split_backward_gemm(op)).first;
    return it->second;
  }

  // A 3D tensor grid's block under AxoNN's overlap (layer_cost.hpp grid_overlap,
  // for_each_grid_step). Forward, a weight gather issues the next linear layer's (the next
  // block's first, within the forward unit) before the compute waits for its own; backward, the
  // input-gradient all-reduce runs beside the weight-gradient product and the weight gradient's
  // reduce-scatter over z is left running (the bucket reductions and the step's end wait for it).
  void run_grid_ops(size_t layer, std::span<const models::Op> ops, Phase phase, int64_t mb);

  // Issues the first weight gather over z of block `layer`'s forward, for it to take when it
  // starts (the grid overlap's gather across blocks).
  void prefetch_first_gather(size_t layer, int64_t mb);

  // A layer's ops of one pass in order: compute ops join the current segment, tensor-parallel
  // collectives split it (or overlap the GEMM next to them).
  void run_ops(size_t layer, std::span<const models::Op> ops, Phase phase, int64_t mb);

  void forward_unit(const models::PassStep& p);

  void backward_unit(const models::PassStep& p);

  // The bytes `layer` keeps for its backward under its recompute mode: what offloading moves.
  int64_t kept_activation_bytes(size_t layer) const {
    return lowered_.layers[layer].saved_bytes_for(recompute_[layer]);
  }

  // Transformer Engine's activation offload (cpu_offload.py, the double-buffered group handler
  // Megatron-LM's --cpu-offloading uses): once a layer's forward is done its saved activations are
  // copied to the host on the offload stream, and the layer after next waits for that copy (the
  // next one already runs while it moves), so at most two layers' activations are in transit.
  // The wait binds the pass's next layer only (`next_in_pass`): whatever the schedule runs after
  // the pass (another micro-batch's backward) does not wait for this pass's copies.
  void activations_to_host(size_t layer, int64_t mb, bool next_in_pass);

  // A layer's offloaded activations copied back to the device, once per backward unit: issued
  // when the backward of a layer up to `prefetch_layers` above it starts (a prefetch), or when
  // its own starts, and once they are on the host (the copies each way run on streams of their
  // own). Returns the copy task.
  int32_t reload_activations(size_t layer, int64_t mb);

  // The last micro-batch's backward of `layer` is done (under ZeRO-2's kBucketsEachPass, micro-
  // batch `mb`'s): a bucket it completes is reduced now, after the compute that produced the
  // gradients (DDP's and Megatron's overlapped reduction, DeepSpeed's per micro-step one).
  void layer_reduced(size_t layer, int64_t mb);

  // Returns the reduction's last task (-1: none).
  int32_t reduce_bucket(const models::GradientBucket& b, int32_t after, int64_t mb);

  // A compressed bucket (models/gradient_compression.hpp): its exchange's codec kernels and
  // collectives one after another on the data-parallel stream, as a communication hook's work is
  // chained to its bucket (PyTorch DDP register_comm_hook). The codec kernels run beside the
  // backward; like a collective they do not hold the compute stream.
  void compressed_reduce(const models::GradientBucket& b, int32_t after);

  // A codec kernel of a compressed bucket on the data-parallel stream, priced by the compute model.
  int32_t codec_task(const models::Op& codec, const std::vector<Dep>& deps);

  // The first and the last stage sum the gradients of the tied embedding table (Megatron's
  // embedding-group all-reduce) after their backward pass, before the optimizer.
  void reduce_tied_embeddings(int32_t after) {
    if (auto sum = models::tied_table_sum(plan_, lowered_, stage_, grad_bytes_))
      step_comm(*sum, Phase::kBwd, micro_batches_ - 1, after);
  }

  // Under sequence parallelism the gradients of the parameters every tp rank holds whole are
  // partial sums: one coalesced all-reduce over the tp group after the backward (Megatron-LM
  // finalize_model_grads); the optimizer waits for it. On a tensor grid those the z slices hold
  // alike are summed over z (AxoNN's depth-parallel gradient sync).
  void reduce_sequence_parallel_grads(int32_t after) {
    if (auto sum = models::partial_gradient_sum(plan_, lowered_, stage_, grad_bytes_))
      require(step_comm(*sum, Phase::kBwd, micro_batches_ - 1, after));
  }

  // ZeRO-Offload's step (DeepSpeed stage_1_and_2.py / stage3.py with offload_optimizer): once
  // every gradient shard is on the host, CPU-Adam updates the fp32 master weights (after reading
  // the states from NVMe and before writing them back, when they live there), and the updated
  // 16-bit shard returns to the device, or stays on the host when the parameters are offloaded.
  // Returns the task the parameters are ready after.
  int32_t host_optimizer_step(int64_t updated);

  void optimizer_step();

  // PipeDream-2BW in fp32: the newest version of the `params` the rank updates copied to the free
  // buffer before the update writes the next version there (models::weight_stash_copy_bytes_
  // per_param; nothing in mixed precision). Under ZeRO-1/2 only the rank's shard: the gather
  // after the update brings the rest of the new version. On the compute stream, before the
  // optimizer step.
  void weight_stash(int64_t params);

  // The host's own work of the step (ClusterSpec step_overhead_us), once per step, on the compute
  // stream's current segment.
  void host_step_overhead();

  const spec::Plan& plan_;
  const spec::Stack& stack_;
  const models::LoweredModel& lowered_;
  const ComputeModel& compute_;
  const OffloadCost* offload_;
  int64_t stage_;
  StageLayers layers_;
  std::vector<spec::Recompute> recompute_;   // per lowered layer (models::layer_recompute)
  std::vector<bool> activations_offloaded_;  // per lowered layer (layer_activation_offload)
  int32_t last_offload_ = -1;                // the latest activation copy to the host
  std::map<size_t, int32_t> reloads_;        // layer -> its reload in this backward unit
  std::map<std::pair<int64_t, size_t>, int32_t> copied_out_;  // (micro-batch, layer) -> its copy
                                                              // to the host, until reloaded
  int64_t elem_bytes_;
  int64_t grad_bytes_;                // per gradient element, in the stack's gradient dtype
  models::LayerGradients gradients_;  // where a layer's gradients go after its backward
  int64_t micro_batches_;
  int64_t batches_;    // batches run back to back (PipeDream-2BW's window; otherwise 1)
  int64_t batch_ = 0;  // the batch being built
  // layer -> its overlapped ZeRO-1/2 gathers (a dense and an expert bucket's under ep)
  std::map<size_t, std::vector<int32_t>> param_gather_;
  std::vector<int32_t> pulls_;  // per batch: the parameter servers' pull of its update

  Program program_;
  std::vector<int32_t> positions_;  // position of each task in its stream
  std::map<std::tuple<size_t, const models::Op*, Phase>, int32_t> op_ids_;
  std::map<const models::Op*, BackwardProducts> split_gemms_;  // backward_products
  std::map<const models::Op*, int32_t> prefetched_;  // a weight gather over z issued ahead
  size_t forward_end_ = 0;                           // the forward unit's end layer
  int32_t depth_scatter_ = -1;  // the latest weight gradient's reduce-scatter left running
  std::vector<int32_t> pending_ops_;
  std::vector<Dep> pending_deps_;
  Phase pending_phase_ = Phase::kFwd;
  int32_t pending_micro_batch_ = -1;
  int32_t last_compute_ = -1;
  std::vector<models::GradientBucket> buckets_;       // data-parallel gradient buckets (not ZeRO-3)
  std::map<size_t, std::vector<size_t>> buckets_of_;  // layer -> its buckets
  std::vector<int64_t> pending_;                      // per bucket: layers still in backward
  size_t next_bucket_ = 0;  // buckets_in_order(): the next bucket to issue
};

}  // namespace sextant::sim
