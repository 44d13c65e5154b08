// Builds a stage's program from the pipeline schedule and the lowered layers: the step's order
// (passes, transfers, the batch's end) and the tasks every part is made of.
#include "sextant/sim/program_builder.hpp"

#include "stage_builder.hpp"

namespace sextant::sim {

Program StageBuilder::build() {
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

void StageBuilder::finish_batch() {
  const int32_t last = flush();
  for (models::TailStep step : models::backward_tail()) {
    switch (step) {
      case models::TailStep::kUntiedBuckets:
        // Without overlap all gradients are reduced after the whole backward, in buckets.
        if (gradients_ == models::LayerGradients::kBucketsAfterBackward)
          for (const models::GradientBucket& b : buckets_)
            if (!b.after_tied_sum) reduce_bucket(b, last, micro_batches_ - 1);
        break;
      case models::TailStep::kTiedTableSum:
        reduce_tied_embeddings(last);
        break;
      case models::TailStep::kTiedBuckets:
        // On the same stream, after the end stages summed the tied table.
        for (const models::GradientBucket& b : buckets_)
          if (b.after_tied_sum) reduce_bucket(b, last, micro_batches_ - 1);
        break;
      case models::TailStep::kPartialGradientSum:
        reduce_sequence_parallel_grads(last);
        break;
    }
  }
  optimizer_step();
}

int32_t StageBuilder::op_id(size_t layer, const models::Op& op, Phase phase) {
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

int32_t StageBuilder::emit(Task t, const std::vector<Dep>& deps) {
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

int32_t StageBuilder::flush() {
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

int32_t StageBuilder::issue_point(Phase phase, int64_t mb) {
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

void StageBuilder::require(int32_t task) {
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

int32_t StageBuilder::named_op(const std::string& name, spec::OpClass cls, int64_t bytes,
                               int32_t layer) {
  OpInfo info;
  info.name = name;
  info.op_class = cls;
  info.bytes = bytes;
  info.layer = layer;
  program_.ops.push_back(std::move(info));
  return static_cast<int32_t>(program_.ops.size() - 1);
}

int32_t StageBuilder::step_comm(const models::StepOp& op, Phase phase, int64_t mb, int32_t after,
                                int32_t layer, int32_t also, PeerSlot peer) {
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

uint8_t StageBuilder::group_slot(models::StepGroup group) {
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

CommClass StageBuilder::step_class(const models::StepOp& op) {
  if (op.group == models::StepGroup::kPeerStage || op.id == OpId::kPpAllGather)
    return CommClass::kPp;
  if (op.id == OpId::kFsdpAllGather || op.id == OpId::kFsdpReduceScatter) return CommClass::kFsdp;
  if (op.group == models::StepGroup::kTensor || op.group == models::StepGroup::kDepth)
    return CommClass::kTp;
  return CommClass::kDp;
}

void StageBuilder::receive(PeerSlot from, int64_t full, Phase phase, int64_t mb, int32_t layer) {
  const int64_t elements = full / elem_bytes_;
  int32_t task =
      step_comm(models::stage_transfer(plan_, lowered_, phase, false, elements, elem_bytes_), phase,
                mb, -1, layer, -1, from);
  require(task);
  if (auto gather = models::transfer_gather(plan_, lowered_, elements, elem_bytes_))
    require(step_comm(*gather, phase, mb, task, layer));
}

void StageBuilder::send(PeerSlot to, int64_t full, Phase phase, int64_t mb, int32_t layer) {
  int32_t before = flush();
  int32_t task = step_comm(
      models::stage_transfer(plan_, lowered_, phase, true, full / elem_bytes_, elem_bytes_), phase,
      mb, before, layer, -1, to);
  // GEMS' orders are built for sends that leave without holding the compute (its own
  // implementation and Sextant's executor post them non-blocking): a blocking send there
  // could wait on a rank that waits on this one.
  if (!stack_.pp_overlap && plan_.schedule != spec::Schedule::kGems) require(task);
}

void StageBuilder::forward_unit(const models::PassStep& p) {
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
    send(downstream(p), boundary_bytes(e), Phase::kFwd, u.micro_batch, static_cast<int32_t>(e - 1));
}

void StageBuilder::backward_unit(const models::PassStep& p) {
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
      layer_reduced(l, u.micro_batch);
    }
  });
  if (p.sends)
    send(upstream(p), boundary_bytes(b), Phase::kBwd, u.micro_batch, static_cast<int32_t>(b));
}

Program build_stage_program(const spec::Plan& plan, const spec::Stack& stack,
                            const models::LoweredModel& lowered, const ComputeModel& compute,
                            int64_t stage, const OffloadCost* offload, int64_t batches) {
  return StageBuilder(plan, stack, lowered, compute, stage, offload, batches).build();
}

}  // namespace sextant::sim
