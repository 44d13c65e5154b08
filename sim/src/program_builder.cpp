// Builds a stage's program from the pipeline schedule and the lowered layers.
#include "sextant/sim/program_builder.hpp"

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
#include "sextant/spec/pipeline_schedule.hpp"

namespace sextant::sim {

using models::OpId;
using spec::Phase;
using spec::Stream;

namespace {

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

  Program build() {
    // Gradients leave in buckets when the data-parallel group reduces them and when the optimizer
    // runs on the host (ZeRO-Offload copies each bucket's shard as it is ready, also on one GPU).
    if (models::bucketed(gradients_)) {
      buckets_ =
          models::gradient_buckets(plan_, lowered_, stage_, stack_.dp_bucket_bytes, grad_bytes_);
      for (size_t b = 0; b < buckets_.size(); ++b) {
        pending_.push_back(static_cast<int64_t>(buckets_[b].layers.size()));
        for (size_t l : buckets_[b].layers) buckets_of_[l].push_back(b);
      }
    }
    gather_parameters_ahead();
    if (servers()) {
      parameter_server_batches();
      return std::move(program_);
    }
    for (const models::PassStep& p : models::pass_steps(plan_, stage_, micro_batches_, batches_)) {
      if (p.unit.forward) {
        forward_unit(p);
      } else {
        backward_unit(p);
        // PipeDream(-2BW): the stage's part of a batch is done; it reduces its gradients and
        // updates while the next batch flows on (no flush).
        const int64_t mb = p.unit.micro_batch;
        if (last_of_batch(mb) && mb + 1 < micro_batches_ * batches_) {
          finish_batch();
          for (size_t b = 0; b < buckets_.size(); ++b)
            pending_[b] = static_cast<int64_t>(buckets_[b].layers.size());
          ++batch_;
        }
      }
    }
    finish_batch();
    return std::move(program_);
  }

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
  void parameter_server_batches() {
    const int64_t staleness = plan_.parameter_server.staleness;
    const std::vector<models::PassStep> passes =
        models::pass_steps(plan_, stage_, micro_batches_, 1);
    for (; batch_ < batches_; ++batch_) {
      if (const int64_t read = batch_ - staleness - 1; read >= 0)
        require(pulls_[static_cast<size_t>(read)]);
      for (models::PassStep p : passes) {
        p.unit.micro_batch += batch_ * micro_batches_;
        if (p.unit.forward) {
          forward_unit(p);
        } else {
          backward_unit(p);
        }
      }
      finish_batch();
    }
  }

  // A server's step after the tail's sums, on the data-parallel stream: the push of the rank's
  // gradients, its range's sum and update, and the pull of every range's new version. The
  // compute stream goes on with the next batch; only the batch that reads this version waits.
  void parameter_server_exchange() {
    const int64_t params = models::stage_params(plan_, lowered_, stage_);
    const int32_t before = issue_point(Phase::kOpt, -1);
    const int32_t push = step_comm(models::ps_push(params, grad_bytes_), Phase::kOpt, -1, before);
    const models::StepOp sum = models::ps_sum(params, plan_.dp, grad_bytes_);
    const int32_t summed = dp_local_task(
        sum, compute_.optimizer_time(sum.elements, sum.bytes / sum.elements), {done(push)});
    const models::OptimizerPrecision precision =
        models::optimizer_precision(stack_, lowered_.dtype, plan_.zero);
    const models::StepOp update = models::ps_update(precision, params, plan_.dp);
    const int32_t updated = dp_local_task(
        update,
        compute_.optimizer_time(update.elements, models::optimizer_bytes_per_param(precision)),
        {done(summed)});
    pulls_.push_back(step_comm(models::ps_pull(params, elem_bytes_), Phase::kOpt, -1, updated));
    host_step_overhead();
  }

  // A step op of the rank's own on the data-parallel stream (a server's work), taking `duration`.
  int32_t dp_local_task(const models::StepOp& op, Picoseconds duration,
                        const std::vector<Dep>& deps) {
    Task t;
    t.kind = TaskKind::kLocal;
    t.stream = Stream::kDpComm;
    t.comm_class = CommClass::kDp;
    t.phase = Phase::kOpt;
    t.micro_batch = -1;
    t.op_begin = named_op(op.id, op.op_class, op.bytes, -1);
    t.duration = duration;
    program_.ops[static_cast<size_t>(t.op_begin)].duration = duration;
    return emit(t, deps);
  }
  bool last_of_batch(int64_t micro_batch) const {
    return micro_batch % micro_batches_ == micro_batches_ - 1;
  }

  // The end of a batch: the gradient reductions not yet issued (models::backward_tail, the
  // executor's order), then the optimizer step.
  void finish_batch() {
    const int32_t last = flush();
    for (models::TailStep step : models::backward_tail()) {
      switch (step) {
        case models::TailStep::kUntiedBuckets:
          // Without overlap all gradients are reduced after the whole backward, in buckets.
          if (gradients_ == models::LayerGradients::kBucketsAfterBackward)
            for (const models::GradientBucket& b : buckets_)
              if (!b.after_tied_sum) reduce_bucket(b, last);
          break;
        case models::TailStep::kTiedTableSum:
          reduce_tied_embeddings(last);
          break;
        case models::TailStep::kTiedBuckets:
          // On the same stream, after the end stages summed the tied table.
          for (const models::GradientBucket& b : buckets_)
            if (b.after_tied_sum) reduce_bucket(b, last);
          break;
        case models::TailStep::kPartialGradientSum:
          reduce_sequence_parallel_grads(last);
          break;
      }
    }
    optimizer_step();
  }

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
                       Phase phase, int64_t mb, int32_t layer, const std::vector<Dep>& deps) {
    return offload_task(models::StepOp{name, cls, std::nullopt, models::StepGroup::kLocal,
                                       models::offload_stream(name), 0, bytes},
                        duration, phase, mb, layer, deps);
  }
  int32_t offload_task(const models::StepOp& op, Picoseconds duration, Phase phase, int64_t mb,
                       int32_t layer, const std::vector<Dep>& deps) {
    Task t;
    t.kind = TaskKind::kLocal;
    t.stream = op.stream;
    t.comm_class = CommClass::kOffload;
    t.phase = phase;
    t.micro_batch = static_cast<int32_t>(mb);
    t.op_begin = named_op(op.id, op.op_class, op.bytes, layer);
    program_.ops[static_cast<size_t>(t.op_begin)].duration = duration;
    t.duration = duration;
    return emit(t, deps);
  }

  // The rank's gradient shard of `params` parameters, copied to the host once reduced
  // (`after`: the reduction, or the compute that produced it).
  void gradients_to_host(int64_t params, int64_t mb, int32_t layer, int32_t after) {
    const models::StepOp copy = models::gradients_to_host(shard(params), grad_bytes_);
    std::vector<Dep> deps;
    if (after >= 0) deps.push_back(done(after));
    offload_task(copy, offload_->device_host_copy(copy.bytes), Phase::kBwd, mb, layer, deps);
  }

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

  int32_t op_id(size_t layer, const models::Op& op, Phase phase) {
    auto key = std::make_tuple(layer, &op, phase);
    auto it = op_ids_.find(key);
    if (it != op_ids_.end()) return it->second;
    OpInfo info;
    info.name = op.name;
    info.op_class = op.op_class;
    info.flops = op.flops;
    info.bytes = op.bytes;
    info.shape = op.shape;
    info.layer = static_cast<int32_t>(layer);
    if (!op.is_comm()) info.duration = compute_.op_time(op, phase);
    info.kernels = op.kernels;
    program_.ops.push_back(std::move(info));
    int32_t id = static_cast<int32_t>(program_.ops.size() - 1);
    op_ids_.emplace(key, id);
    return id;
  }

  Dep done(int32_t task) const {
    const Task& t = program_.tasks[static_cast<size_t>(task)];
    return {static_cast<uint8_t>(t.stream), positions_[static_cast<size_t>(task)] + 1};
  }

  int32_t emit(Task t, const std::vector<Dep>& deps) {
    t.dep_begin = static_cast<int32_t>(program_.deps.size());
    program_.deps.insert(program_.deps.end(), deps.begin(), deps.end());
    t.dep_end = static_cast<int32_t>(program_.deps.size());
    auto& stream = program_.streams[static_cast<size_t>(t.stream)];
    positions_.push_back(static_cast<int32_t>(stream.size()));
    int32_t id = static_cast<int32_t>(program_.tasks.size());
    stream.push_back(id);
    program_.tasks.push_back(t);
    return id;
  }

  // Ends the compute segment being gathered; returns the last compute task (or -1).
  int32_t flush() {
    if (pending_ops_.empty()) return last_compute_;
    Task t;
    t.kind = TaskKind::kCompute;
    t.stream = Stream::kCompute;
    t.phase = pending_phase_;
    t.micro_batch = pending_micro_batch_;
    t.op_begin = static_cast<int32_t>(program_.task_ops.size());
    Picoseconds duration = 0;
    HostChain issue;
    const double per_kernel = host_launch_seconds(stack_, compute_.device(), pending_phase_);
    for (int32_t id : pending_ops_) {
      program_.task_ops.push_back(id);
      const OpInfo& op = program_.ops[static_cast<size_t>(id)];
      duration += op.duration;
      if (per_kernel > 0)
        issue = issue.then(host_chain_of_op(ps_to_seconds(op.duration), op.kernels, per_kernel));
    }
    t.op_end = static_cast<int32_t>(program_.task_ops.size());
    t.duration = duration;
    t.host = seconds_to_ps(issue.host_s);
    if (issue.host_s > 0) t.host_critical = seconds_to_ps(issue.critical_s);
    last_compute_ = emit(t, pending_deps_);
    pending_ops_.clear();
    pending_deps_.clear();
    return last_compute_;
  }

  // The point a task issued now on another stream follows: the last compute, and what the next
  // compute already waits for (a received activation or gradient, a reloaded layer). A framework
  // issues it in program order behind those waits: the compute stream waits on their events and
  // the side stream on the compute stream's (Megatron-LM's p2p receive waits on the current
  // stream; Transformer Engine's and NCCL's side streams wait on it), so a backward's first
  // all-gather cannot start before the gradient it gathers has arrived. Waits with no compute
  // gathered yet become a compute task of no ops that holds them.
  int32_t issue_point(Phase phase, int64_t mb) {
    if (!pending_ops_.empty() || pending_deps_.empty()) return flush();
    Task t;
    t.kind = TaskKind::kCompute;
    t.stream = Stream::kCompute;
    t.phase = phase;
    t.micro_batch = static_cast<int32_t>(mb);
    t.op_begin = t.op_end = static_cast<int32_t>(program_.task_ops.size());
    last_compute_ = emit(t, pending_deps_);
    pending_deps_.clear();
    return last_compute_;
  }

  // The next compute op waits for `task`. Waits on one stream merge into the latest (a stream
  // completes in order), so a task has at most one dependency per other stream.
  void require(int32_t task) {
    flush();
    Dep d = done(task);
    for (Dep& p : pending_deps_) {
      if (p.stream == d.stream) {
        p.count = std::max(p.count, d.count);
        return;
      }
    }
    pending_deps_.push_back(d);
  }

  void compute_op(size_t layer, const models::Op& op, Phase phase, int64_t mb) {
    if (!pending_ops_.empty() && (phase != pending_phase_ || mb != pending_micro_batch_)) flush();
    pending_phase_ = phase;
    pending_micro_batch_ = static_cast<int32_t>(mb);
    pending_ops_.push_back(op_id(layer, op, phase));
  }

  int32_t comm(Stream stream, CommClass cls, uint8_t slot, TaskKind kind,
               spec::CollectiveKind collective, int64_t bytes, int32_t op, Phase phase, int64_t mb,
               int32_t after, int32_t also = -1) {
    Task t;
    t.kind = kind;
    t.stream = stream;
    t.comm_class = cls;
    t.slot = slot;
    t.collective = collective;
    t.bytes = bytes;
    t.op_begin = op;
    t.phase = phase;
    t.micro_batch = static_cast<int32_t>(mb);
    std::vector<Dep> deps;
    if (after >= 0) deps.push_back(done(after));
    if (also >= 0) deps.push_back(done(also));
    return emit(t, deps);
  }

  // A layer's collective: in the layer group (tensor-parallel), the spatial group (a spatial
  // split's halo exchanges and partial-sum all-reduces), the context-parallel, the
  // expert-parallel group or a line of a tensor grid. Waits for the compute before it; returns
  // the task.
  int32_t layer_collective(size_t layer, const models::Op& op, Phase phase, int64_t mb) {
    int32_t before = issue_point(phase, mb);
    const bool context = op.group == models::CommGroup::kContext;
    const bool expert = op.group == models::CommGroup::kExpert;
    const CommClass cls = context                                   ? CommClass::kCp
                          : expert                                  ? CommClass::kEp
                          : op.group == models::CommGroup::kSpatial ? CommClass::kSpatial
                          : op.group == models::CommGroup::kData    ? CommClass::kDp
                                                                    : CommClass::kTp;
    GroupSlot slot = GroupSlot::kTp;
    switch (op.group) {
      case models::CommGroup::kLayer:
        break;
      case models::CommGroup::kContext:
        slot = GroupSlot::kCp;
        break;
      case models::CommGroup::kExpert:
        slot = GroupSlot::kEp;
        break;
      case models::CommGroup::kGridX:
        slot = GroupSlot::kGridX;
        break;
      case models::CommGroup::kGridY:
        slot = GroupSlot::kGridY;
        break;
      case models::CommGroup::kGridZ:
        slot = GroupSlot::kGridZ;
        break;
      case models::CommGroup::kSpatial:
        slot = GroupSlot::kSpatial;
        break;
      case models::CommGroup::kFilterReduce:
        slot = GroupSlot::kFilterReduce;
        break;
      case models::CommGroup::kChannelGather:
        slot = GroupSlot::kChannelGather;
        break;
      case models::CommGroup::kData:
        slot = GroupSlot::kDpLayer;
        break;
    }
    // The z axis of a tensor grid on its own stream (AxoNN's depth group, spec::Stream).
    const Stream stream =
        op.group == models::CommGroup::kGridZ ? Stream::kDepthComm : Stream::kTpComm;
    return comm(stream, cls, static_cast<uint8_t>(slot), TaskKind::kCollective, op.collective,
                op.costed_bytes(), op_id(layer, op, phase), phase, mb, before);
  }

  // A collective between compute segments: the compute after it waits for it.
  void tp_collective(size_t layer, const models::Op& op, Phase phase, int64_t mb) {
    require(layer_collective(layer, op, phase, mb));
  }

  // A ring attention step (models::Op::beside_next): the transfer of the next block starts once
  // the compute before it is done (its buffer is free again) and runs beside the step's
  // attention; what follows the attention waits for it.
  void ring_step(size_t layer, const models::Op& transfer, const models::Op& attention, Phase phase,
                 int64_t mb) {
    const int32_t task = layer_collective(layer, transfer, phase, mb);
    compute_op(layer, attention, phase, mb);
    require(task);
  }

  int32_t named_op(OpId id, spec::OpClass cls, int64_t bytes, int32_t layer) {
    return named_op(models::op_name(id), cls, bytes, layer);
  }
  int32_t named_op(const std::string& name, spec::OpClass cls, int64_t bytes, int32_t layer) {
    OpInfo info;
    info.name = name;
    info.op_class = cls;
    info.bytes = bytes;
    info.layer = layer;
    program_.ops.push_back(std::move(info));
    return static_cast<int32_t>(program_.ops.size() - 1);
  }

  // A step op (models/step_ops.hpp) as an engine task on its stream and in its group (a transfer:
  // to or from `peer`), after `after` and `also`.
  int32_t step_comm(const models::StepOp& op, Phase phase, int64_t mb, int32_t after,
                    int32_t layer = -1, int32_t also = -1, PeerSlot peer = PeerSlot::kPrev) {
    SEXTANT_CHECK(op.collective.has_value(), "step op {} is no collective", models::op_name(op.id));
    const int32_t id = named_op(op.id, op.op_class, op.bytes, layer);
    const bool transfer = op.group == models::StepGroup::kPeerStage;
    const TaskKind kind = !transfer                             ? TaskKind::kCollective
                          : op.op_class == spec::OpClass::kSend ? TaskKind::kSend
                                                                : TaskKind::kRecv;
    const uint8_t slot = transfer ? static_cast<uint8_t>(peer) : group_slot(op.group);
    // GEMS' second replica's transfers on its own streams (its channels are theirs).
    Stream stream = op.stream;
    if (transfer && (peer == PeerSlot::kPrevUp || peer == PeerSlot::kNextUp))
      stream = kind == TaskKind::kSend ? Stream::kPpSendUp : Stream::kPpRecvUp;
    return comm(stream, step_class(op), slot, kind, *op.collective, op.bytes, id, phase, mb, after,
                also);
  }
  static uint8_t group_slot(models::StepGroup group) {
    switch (group) {
      case models::StepGroup::kReplicas:
        return static_cast<uint8_t>(GroupSlot::kDp);
      case models::StepGroup::kExpertReplicas:
        return static_cast<uint8_t>(GroupSlot::kExpertDp);
      case models::StepGroup::kTensor:
        return static_cast<uint8_t>(GroupSlot::kTp);
      case models::StepGroup::kDepth:
        return static_cast<uint8_t>(GroupSlot::kGridZ);
      case models::StepGroup::kEmbedding:
        return static_cast<uint8_t>(GroupSlot::kEmbedding);
      case models::StepGroup::kPeerStage:
      case models::StepGroup::kLocal:
        break;
    }
    SEXTANT_CHECK(false, "step group {} has no group slot", static_cast<int>(group));
    return 0;
  }
  // What waiting for a step op counts as: pipeline time for the stage-to-stage exchange (its
  // all-gather included), FSDP time for ZeRO-3's gathers and scatters, tensor-parallel time for
  // the partial sums, data-parallel time for the other gradient and parameter collectives.
  static CommClass step_class(const models::StepOp& op) {
    if (op.group == models::StepGroup::kPeerStage || op.id == OpId::kPpAllGather)
      return CommClass::kPp;
    if (op.id == OpId::kFsdpAllGather || op.id == OpId::kFsdpReduceScatter) return CommClass::kFsdp;
    if (op.group == models::StepGroup::kTensor || op.group == models::StepGroup::kDepth)
      return CommClass::kTp;
    return CommClass::kDp;
  }

  // Activation (or gradient) crossing the boundary in front of `first_layer`, per rank, whole.
  int64_t boundary_bytes(size_t first_layer) const {
    return lowered_.layers[first_layer - 1].output_bytes;
  }
  // The stage-to-stage transfers travel in parts (models::stage_transfer: Megatron's
  // scatter/gather), joined by an all-gather on the receiver.
  void receive(PeerSlot from, int64_t full, Phase phase, int64_t mb, int32_t layer) {
    const int64_t elements = full / elem_bytes_;
    int32_t task =
        step_comm(models::stage_transfer(plan_, lowered_, phase, false, elements, elem_bytes_),
                  phase, mb, -1, layer, -1, from);
    require(task);
    if (auto gather = models::transfer_gather(plan_, lowered_, elements, elem_bytes_))
      require(step_comm(*gather, phase, mb, task, layer));
  }

  void send(PeerSlot to, int64_t full, Phase phase, int64_t mb, int32_t layer) {
    int32_t before = flush();
    int32_t task = step_comm(
        models::stage_transfer(plan_, lowered_, phase, true, full / elem_bytes_, elem_bytes_),
        phase, mb, before, layer, -1, to);
    // GEMS' orders are built for sends that leave without holding the compute (its own
    // implementation and Sextant's executor post them non-blocking): a blocking send there
    // could wait on a rank that waits on this one.
    if (!stack_.pp_overlap && plan_.schedule != spec::Schedule::kGems) require(task);
  }

  // ZeRO-3: all-gather a layer's parameters from the data-parallel group: one flat parameter
  // (FSDP), or one coalesced gather per module (DeepSpeed). Returns the last gather.
  int32_t gather_params(size_t layer, Phase phase, int64_t mb, int32_t after) {
    if (offload_params()) {
      // ZeRO-Infinity: the rank's shard comes from host memory (or NVMe through it) first.
      const models::StepOp fetch =
          models::parameters_to_device(shard(lowered_.layers[layer].params), elem_bytes_);
      const Picoseconds d = offload_->params_fetch(fetch.bytes, plan_.offload.params);
      std::vector<Dep> deps;
      if (after >= 0) deps.push_back(done(after));
      after = offload_task(fetch, d, phase, mb, static_cast<int32_t>(layer), deps);
      if (plan_.replicas() == 1) return after;
    }
    // Under expert parallelism the routed experts' shards are gathered from the ranks holding
    // the same experts, after the rest (TorchTitan's FSDP2 over dp_shard / ep for the experts).
    const int64_t experts = expert_params(layer);
    const int64_t dense = lowered_.layers[layer].params - experts;
    const int64_t parts = stack_.zero3 == spec::Zero3Impl::kDeepspeed
                              ? lowered_.layers[layer].parameter_modules()
                              : 1;
    const auto l = static_cast<int32_t>(layer);
    int32_t last = -1;
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t part = dense / parts + (p < dense % parts ? 1 : 0);
      last =
          step_comm(models::parameter_gather(plan_, part, false, elem_bytes_), phase, mb, after, l);
    }
    if (experts > 0 && plan_.expert_replicas() > 1)
      last = step_comm(models::parameter_gather(plan_, experts, true, elem_bytes_), phase, mb,
                       after, l);
    return last;
  }

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
  void gather_parameters_ahead() {
    if (!gathers_updates() || !stack_.param_gather_overlap) return;
    // Megatron gathers the same buckets it reduces, the first forward's first layers first.
    for (size_t b = buckets_.size(); b-- > 0;) {
      if (bucket_ranks(buckets_[b]) == 1 || buckets_[b].params == 0) continue;
      int32_t task = gather_bucket(buckets_[b], Phase::kFwd, 0, -1);
      for (size_t l : buckets_[b].layers) param_gather_[l].push_back(task);
    }
  }

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
                     int64_t mb) {
    const int64_t first = gather.bytes / tp_overlap_chunks(gather.collective, plan_.tp);
    int32_t before = issue_point(phase, mb);
    const int32_t l = static_cast<int32_t>(layer);
    int32_t head = comm(Stream::kTpComm, CommClass::kTp, static_cast<uint8_t>(GroupSlot::kTp),
                        TaskKind::kCollective, gather.collective, first,
                        named_op(gather.name, gather.op_class, first, l), phase, mb, before);
    int32_t rest =
        comm(Stream::kTpComm, CommClass::kTp, static_cast<uint8_t>(GroupSlot::kTp),
             TaskKind::kCollective, gather.collective, gather.bytes - first,
             named_op(gather.name, gather.op_class, gather.bytes - first, l), phase, mb, head);
    require(head);
    compute_op(layer, gemm, phase, mb);
    require(rest);
  }

  // A GEMM whose output is reduce-scattered in chunks as it is produced (tp_overlap_chunks): all
  // but the last chunk's reduction run beside the GEMM; the tp stream orders the last after them.
  void scattered_gemm(size_t layer, const models::Op& gemm, const models::Op& scatter, Phase phase,
                      int64_t mb) {
    const int64_t last_bytes = scatter.bytes / tp_overlap_chunks(scatter.collective, plan_.tp);
    const int64_t early_bytes = scatter.bytes - last_bytes;
    const int32_t l = static_cast<int32_t>(layer);
    int32_t before = issue_point(phase, mb);
    comm(Stream::kTpComm, CommClass::kTp, static_cast<uint8_t>(GroupSlot::kTp),
         TaskKind::kCollective, scatter.collective, early_bytes,
         named_op(scatter.name, scatter.op_class, early_bytes, l), phase, mb, before);
    compute_op(layer, gemm, phase, mb);
    int32_t gemm_task = flush();
    int32_t last =
        comm(Stream::kTpComm, CommClass::kTp, static_cast<uint8_t>(GroupSlot::kTp),
             TaskKind::kCollective, scatter.collective, last_bytes,
             named_op(scatter.name, scatter.op_class, last_bytes, l), phase, mb, gemm_task);
    require(last);
  }

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
  void run_grid_ops(size_t layer, std::span<const models::Op> ops, Phase phase, int64_t mb) {
    const GridOverlap grid = grid_overlap(plan_, stack_, is_block(layer));
    const bool forward = phase != Phase::kBwd && grid.forward;
    for_each_grid_step(ops, grid, phase, [&](GridStepKind kind, size_t i, size_t other) {
      const models::Op& op = ops[i];
      switch (kind) {
        case GridStepKind::kWeightGather: {
          if (!forward) {
            tp_collective(layer, op, phase, mb);
            break;
          }
          auto it = prefetched_.find(&op);
          int32_t task = -1;
          if (it != prefetched_.end()) {
            task = it->second;
            prefetched_.erase(it);
          } else {
            task = layer_collective(layer, op, phase, mb);
          }
          if (other < ops.size()) {
            prefetched_[&ops[other]] = layer_collective(layer, ops[other], phase, mb);
          } else if (phase == Phase::kFwd && layer + 1 < forward_end_ && is_block(layer + 1)) {
            prefetch_first_gather(layer + 1, mb);
          }
          require(task);
          break;
        }
        case GridStepKind::kWeightScatter:
          depth_scatter_ = layer_collective(layer, op, phase, mb);
          break;
        case GridStepKind::kSplitGemm: {
          const BackwardProducts& halves = backward_products(op);
          compute_op(layer, halves.dgrad, phase, mb);
          const int32_t reduced = layer_collective(layer, ops[other], phase, mb);
          compute_op(layer, halves.wgrad, phase, mb);
          require(reduced);
          break;
        }
        case GridStepKind::kCollective:
          tp_collective(layer, op, phase, mb);
          break;
        case GridStepKind::kCompute:
          compute_op(layer, op, phase, mb);
          break;
      }
    });
  }

  // Issues the first weight gather over z of block `layer`'s forward, for it to take when it
  // starts (the grid overlap's gather across blocks).
  void prefetch_first_gather(size_t layer, int64_t mb) {
    const std::vector<models::Op>& next = lowered_.layers[layer].forward;
    for (const models::Op& op : next)
      if (is_depth_gather(op)) {
        prefetched_[&op] = layer_collective(layer, op, Phase::kFwd, mb);
        return;
      }
  }

  // A layer's ops of one pass in order: compute ops join the current segment, tensor-parallel
  // collectives split it (or overlap the GEMM next to them).
  void run_ops(size_t layer, std::span<const models::Op> ops, Phase phase, int64_t mb) {
    const GridOverlap grid = grid_overlap(plan_, stack_, is_block(layer));
    if (grid.in(phase)) {
      run_grid_ops(layer, ops, phase, mb);
      return;
    }
    for_each_pass_step(ops, tp_overlapped(layer, phase), [&](PassStepKind kind, size_t i) {
      switch (kind) {
        case PassStepKind::kRingStep:
          ring_step(layer, ops[i], ops[i + 1], phase, mb);
          break;
        case PassStepKind::kGatheredGemm:
          gathered_gemm(layer, ops[i], ops[i + 1], phase, mb);
          break;
        case PassStepKind::kScatteredGemm:
          scattered_gemm(layer, ops[i], ops[i + 1], phase, mb);
          break;
        case PassStepKind::kCollective:
          tp_collective(layer, ops[i], phase, mb);
          break;
        case PassStepKind::kCompute:
          compute_op(layer, ops[i], phase, mb);
          break;
      }
    });
  }

  void forward_unit(const models::PassStep& p) {
    const spec::ScheduleUnit& u = p.unit;
    size_t b = layers_.chunk_begin[static_cast<size_t>(u.chunk)];
    size_t e = layers_.chunk_end[static_cast<size_t>(u.chunk)];
    if (p.receives)
      receive(upstream(p), boundary_bytes(b), Phase::kFwd, u.micro_batch, static_cast<int32_t>(b));
    std::vector<size_t> order;
    for (size_t l = b; l < e; ++l) order.push_back(l);
    last_offload_ = -1;  // the double buffer is the pass's own
    forward_end_ = e;
    pass(order, Phase::kFwd, u.micro_batch, [&](size_t l) {
      auto gather = param_gather_.find(l);
      if (gather != param_gather_.end()) {
        // The first forward of this step waits for its parameters.
        for (int32_t task : gather->second) require(task);
        param_gather_.erase(gather);
      }
      run_ops(l, lowered_.layers[l].forward, Phase::kFwd, u.micro_batch);
      if (activations_offloaded_[l]) activations_to_host(l, u.micro_batch, l + 1 < e);
    });
    if (p.sends)
      send(downstream(p), boundary_bytes(e), Phase::kFwd, u.micro_batch,
           static_cast<int32_t>(e - 1));
  }

  void backward_unit(const models::PassStep& p) {
    const spec::ScheduleUnit& u = p.unit;
    size_t b = layers_.chunk_begin[static_cast<size_t>(u.chunk)];
    size_t e = layers_.chunk_end[static_cast<size_t>(u.chunk)];
    const models::GradientHandoff handoff =
        models::gradient_handoff(plan_, gradients_, u.micro_batch, micro_batches_);
    if (p.receives)
      receive(downstream(p), boundary_bytes(e), Phase::kBwd, u.micro_batch,
              static_cast<int32_t>(e - 1));
    std::vector<size_t> order;
    for (size_t l = e; l-- > b;) order.push_back(l);
    reloads_.clear();
    pass(order, Phase::kBwd, u.micro_batch, [&](size_t l) {
      const models::Layer& layer = lowered_.layers[l];
      // Offloaded activations: the layer's own reload (issued ahead, or now), then the
      // prefetches of the `prefetch_layers` below it, nearest first, which run beside this
      // layer's backward (spec::Offload::prefetch_layers).
      if (activations_offloaded_[l]) require(reload_activations(l, u.micro_batch));
      for (size_t k = 1; k <= static_cast<size_t>(plan_.offload.prefetch_layers) && l >= b + k; ++k)
        if (activations_offloaded_[l - k]) reload_activations(l - k, u.micro_batch);
      if (is_block(l) && recompute_[l] == spec::Recompute::kFull) {
        run_ops(l, models::recomputed_forward(layer), Phase::kRecompute, u.micro_batch);
      } else if (is_block(l) && recompute_[l] == spec::Recompute::kSelective) {
        run_ops(l, layer.selective_forward, Phase::kRecompute, u.micro_batch);
      }
      run_ops(l, layer.backward, Phase::kBwd, u.micro_batch);
      if (handoff.scatter && layer.params == 0) {
        // Nothing to reduce (pass: nothing gathered either).
      } else if (handoff.scatter) {
        int32_t before = flush();
        const int64_t experts = expert_params(l);
        const auto at = static_cast<int32_t>(l);
        int32_t reduced =
            step_comm(models::gradient_reduction(plan_, layer.params - experts, false, grad_bytes_),
                      Phase::kBwd, u.micro_batch, before, at);
        if (experts > 0 && plan_.expert_replicas() > 1)
          reduced = step_comm(models::gradient_reduction(plan_, experts, true, grad_bytes_),
                              Phase::kBwd, u.micro_batch, before, at);
        if (!stack_.dp_overlap) require(reduced);  // the backward waits for its reductions
        if (handoff.to_host)
          gradients_to_host(layer.params, u.micro_batch, static_cast<int32_t>(l), reduced);
      } else if (handoff.to_host) {
        // One rank holds every gradient: its layer's gradients go to the host once complete.
        gradients_to_host(layer.params, u.micro_batch, static_cast<int32_t>(l), flush());
      } else if (handoff.count_buckets) {
        layer_reduced(l);
      }
    });
    if (p.sends)
      send(upstream(p), boundary_bytes(b), Phase::kBwd, u.micro_batch, static_cast<int32_t>(b));
  }

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
  void activations_to_host(size_t layer, int64_t mb, bool next_in_pass) {
    const int32_t produced = flush();
    if (last_offload_ >= 0 && next_in_pass) require(last_offload_);
    std::vector<Dep> deps;
    if (produced >= 0) deps.push_back(done(produced));
    const int64_t bytes = kept_activation_bytes(layer);
    last_offload_ = offload_task(OpId::kOffloadActivationsToHost, spec::OpClass::kMemcpy, bytes,
                                 offload_->device_host_copy(bytes), Phase::kFwd, mb,
                                 static_cast<int32_t>(layer), deps);
    copied_out_[{mb, layer}] = last_offload_;
  }

  // A layer's offloaded activations copied back to the device, once per backward unit: issued
  // when the backward of a layer up to `prefetch_layers` above it starts (a prefetch), or when
  // its own starts, and once they are on the host (the copies each way run on streams of their
  // own). Returns the copy task.
  int32_t reload_activations(size_t layer, int64_t mb) {
    auto it = reloads_.find(layer);
    if (it != reloads_.end()) return it->second;
    const int32_t before = issue_point(Phase::kBwd, mb);
    std::vector<Dep> deps;
    if (before >= 0) deps.push_back(done(before));
    if (auto out = copied_out_.find({mb, layer}); out != copied_out_.end()) {
      deps.push_back(done(out->second));
      copied_out_.erase(out);
    }
    const int64_t bytes = kept_activation_bytes(layer);
    const int32_t task = offload_task(OpId::kOffloadActivationsToDevice, spec::OpClass::kMemcpy,
                                      bytes, offload_->device_host_copy(bytes), Phase::kBwd, mb,
                                      static_cast<int32_t>(layer), deps);
    reloads_.emplace(layer, task);
    return task;
  }

  // The last micro-batch's backward of `layer` is done: a bucket it completes is reduced now,
  // after the compute that produced the gradients (DDP's and Megatron's overlapped reduction).
  void layer_reduced(size_t layer) {
    auto it = buckets_of_.find(layer);
    if (it == buckets_of_.end()) return;
    for (size_t i : it->second) {
      const models::GradientBucket& b = buckets_[i];
      if (--pending_[i] == 0 && !b.after_tied_sum && !buckets_in_order()) reduce_bucket(b, flush());
    }
    if (!buckets_in_order()) return;
    for (; next_bucket_ < buckets_.size() && pending_[next_bucket_] == 0; ++next_bucket_)
      if (!buckets_[next_bucket_].after_tied_sum) reduce_bucket(buckets_[next_bucket_], flush());
  }

  void reduce_bucket(const models::GradientBucket& b, int32_t after) {
    const int64_t bytes = b.params * grad_bytes_;
    if (bytes == 0) return;
    if (bucket_ranks(b) == 1) {  // nothing to reduce: the bucket only leaves for the host
      if (offload_optimizer()) gradients_to_host(b.params, micro_batches_ - 1, -1, after);
      return;
    }
    if (plan_.compression.any()) {
      compressed_reduce(b, after);
      return;
    }
    // DDP all-reduces gradients; ZeRO-1/2 reduce-scatter them (each rank keeps its shard).
    // Under AxoNN's overlap the bucket's weight gradients may still be reduce-scattered over z.
    int32_t reduced = step_comm(models::gradient_reduction(plan_, b.params, b.experts, grad_bytes_),
                                Phase::kBwd, micro_batches_ - 1, after, -1, depth_scatter_);
    if (offload_optimizer()) gradients_to_host(b.params, micro_batches_ - 1, -1, reduced);
  }

  // A compressed bucket (models/gradient_compression.hpp): its exchange's codec kernels and
  // collectives one after another on the data-parallel stream, as a communication hook's work is
  // chained to its bucket (PyTorch DDP register_comm_hook). The codec kernels run beside the
  // backward; like a collective they do not hold the compute stream.
  void compressed_reduce(const models::GradientBucket& b, int32_t after) {
    int32_t last = after;
    bool first = true;
    for (const models::Op& op :
         models::compressed_exchange_ops(plan_.compression, b, plan_.replicas(), grad_bytes_)) {
      const int32_t also = first ? depth_scatter_ : -1;  // as reduce_bucket's
      first = false;
      if (op.is_comm()) {
        const int32_t id = named_op(op.name, op.op_class, op.bytes, -1);
        last = comm(Stream::kDpComm, CommClass::kDp, static_cast<uint8_t>(GroupSlot::kDp),
                    TaskKind::kCollective, op.collective, op.bytes, id, Phase::kBwd,
                    micro_batches_ - 1, last, also);
      } else {
        std::vector<Dep> deps;
        if (last >= 0) deps.push_back(done(last));
        if (also >= 0) deps.push_back(done(also));
        last = codec_task(op, deps);
      }
    }
  }

  // A codec kernel of a compressed bucket on the data-parallel stream, priced by the compute model.
  int32_t codec_task(const models::Op& codec, const std::vector<Dep>& deps) {
    Task t;
    t.kind = TaskKind::kLocal;
    t.stream = Stream::kDpComm;
    t.comm_class = CommClass::kDp;
    t.phase = Phase::kBwd;
    t.micro_batch = static_cast<int32_t>(micro_batches_ - 1);
    t.op_begin = named_op(codec.name, codec.op_class, codec.bytes, -1);
    t.duration = compute_.op_time(codec, Phase::kBwd);
    program_.ops[static_cast<size_t>(t.op_begin)].duration = t.duration;
    return emit(t, deps);
  }

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
  int32_t host_optimizer_step(int64_t updated) {
    std::vector<Dep> deps;
    for (Stream s : {Stream::kDpComm, Stream::kTpComm, Stream::kDepthComm}) {
      const auto n = static_cast<int32_t>(program_.streams[static_cast<size_t>(s)].size());
      if (n > 0) deps.push_back({static_cast<uint8_t>(s), n});
    }
    if (int32_t last = flush(); last >= 0) deps.push_back(done(last));
    spec::Dtype param_dtype = spec::parameter_dtype(stack_, lowered_.dtype);
    int32_t step = offload_task(models::host_update(updated, param_dtype),
                                offload_->host_step(updated, param_dtype, plan_.offload.optimizer),
                                Phase::kOpt, -1, -1, deps);
    const auto back = models::updated_parameters_return(plan_, updated, param_dtype);
    if (!back) return step;
    return offload_task(*back, offload_->params_return(back->bytes, plan_.offload.params),
                        Phase::kOpt, -1, -1, {done(step)});
  }

  void optimizer_step() {
    if (servers()) {
      parameter_server_exchange();
      return;
    }
    const int64_t params = models::stage_params(plan_, lowered_, stage_);
    if (offload_optimizer()) {
      const int32_t ready = host_optimizer_step(updated_params());
      host_step_overhead();
      if (gathers_updates() && !stack_.param_gather_overlap)
        for (const models::GradientBucket& b : buckets_) gather_bucket(b, Phase::kOpt, -1, ready);
      return;
    }
    // ZeRO shards the optimizer state (and the update) over the data-parallel group (the routed
    // experts' over the expert replicas).
    const int64_t updated = plan_.zero >= 1 ? updated_params() : params;
    // PipeDream's last stage reads only its newest version: nothing to stash.
    const bool newest_only = plan_.schedule == spec::Schedule::kPipeDream && stage_ == plan_.pp - 1;
    if (asynchronous() && !newest_only) weight_stash(updated);
    const models::OptimizerPrecision precision =
        models::optimizer_precision(stack_, lowered_.dtype, plan_.zero);
    const models::StepOp update = models::optimizer_update(precision, updated);
    OpInfo info;
    info.name = models::op_name(update.id);
    info.op_class = update.op_class;
    info.bytes = update.bytes;
    info.duration = compute_.optimizer_time(updated, models::optimizer_bytes_per_param(precision));
    program_.ops.push_back(info);
    int32_t id = static_cast<int32_t>(program_.ops.size() - 1);
    flush();
    // Waits for every gradient collective (on a tensor grid also the reduce-scatters over z).
    for (Stream s : {Stream::kDpComm, Stream::kDepthComm}) {
      const auto n = static_cast<int32_t>(program_.streams[static_cast<size_t>(s)].size());
      if (n > 0 || s == Stream::kDpComm) pending_deps_.push_back({static_cast<uint8_t>(s), n});
    }
    pending_phase_ = Phase::kOpt;
    pending_micro_batch_ = -1;
    pending_ops_.push_back(id);
    host_step_overhead();
    int32_t opt = flush();
    program_.tasks[static_cast<size_t>(opt)].optimizer = true;
    // Mid-window (PipeDream-2BW) the next batch has started: the gather runs beside it, for the
    // batch after it, and is not left to the start of a next step.
    const bool gather_now = !stack_.param_gather_overlap || batch_ + 1 < batches_;
    if (gathers_updates() && gather_now) {
      for (const models::GradientBucket& b : buckets_)
        if (bucket_ranks(b) > 1) gather_bucket(b, Phase::kOpt, -1, opt);
    }
  }

  // PipeDream-2BW in fp32: the newest version of the `params` the rank updates copied to the free
  // buffer before the update writes the next version there (models::weight_stash_copy_bytes_
  // per_param; nothing in mixed precision). Under ZeRO-1/2 only the rank's shard: the gather
  // after the update brings the rest of the new version. On the compute stream, before the
  // optimizer step.
  void weight_stash(int64_t params) {
    const int64_t per_param = models::weight_stash_copy_bytes_per_param(
        models::optimizer_precision(stack_, lowered_.dtype, plan_.zero).model_params);
    if (per_param == 0) return;
    OpInfo info;
    info.name = models::op_name(OpId::kPpWeightStash);
    info.op_class = spec::OpClass::kMemcpy;
    info.bytes = params * per_param;
    info.duration = compute_.optimizer_time(params, per_param);
    program_.ops.push_back(info);
    flush();
    pending_phase_ = Phase::kOpt;
    pending_micro_batch_ = -1;
    pending_ops_.push_back(static_cast<int32_t>(program_.ops.size() - 1));
    flush();
  }

  // The host's own work of the step (ClusterSpec step_overhead_us), once per step, on the compute
  // stream's current segment.
  void host_step_overhead() {
    const Picoseconds host = compute_.step_overhead();
    if (host <= 0) return;
    OpInfo step;
    step.name = models::op_name(OpId::kStepHost);
    step.op_class = spec::OpClass::kHost;
    step.duration = host;
    program_.ops.push_back(step);
    if (pending_ops_.empty()) {
      pending_phase_ = Phase::kOpt;
      pending_micro_batch_ = -1;
    }
    pending_ops_.push_back(static_cast<int32_t>(program_.ops.size() - 1));
    flush();
  }

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

}  // namespace

Program build_stage_program(const spec::Plan& plan, const spec::Stack& stack,
                            const models::LoweredModel& lowered, const ComputeModel& compute,
                            int64_t stage, const OffloadCost* offload, int64_t batches) {
  return StageBuilder(plan, stack, lowered, compute, stage, offload, batches).build();
}

}  // namespace sextant::sim
