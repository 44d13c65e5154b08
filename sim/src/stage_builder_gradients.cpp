// The data-parallel side of a stage's program: ZeRO gathers, gradient buckets (compressed or
// not), the optimizer step, PipeDream-2BW's weight stash and the parameter servers' exchange.
#include "stage_builder.hpp"

namespace sextant::sim {

void StageBuilder::parameter_server_batches() {
  const int64_t staleness = plan_.parameter_server.staleness;
  const std::vector<models::PassStep> passes = models::pass_steps(plan_, stage_, micro_batches_, 1);
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

void StageBuilder::parameter_server_exchange() {
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

int32_t StageBuilder::dp_local_task(const models::StepOp& op, Picoseconds duration,
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

int32_t StageBuilder::gather_params(size_t layer, Phase phase, int64_t mb, int32_t after) {
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
  const int64_t parts =
      stack_.zero3 == spec::Zero3Impl::kDeepspeed ? lowered_.layers[layer].parameter_modules() : 1;
  const auto l = static_cast<int32_t>(layer);
  int32_t last = -1;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t part = dense / parts + (p < dense % parts ? 1 : 0);
    last =
        step_comm(models::parameter_gather(plan_, part, false, elem_bytes_), phase, mb, after, l);
  }
  if (experts > 0 && plan_.expert_replicas() > 1)
    last =
        step_comm(models::parameter_gather(plan_, experts, true, elem_bytes_), phase, mb, after, l);
  return last;
}

void StageBuilder::gather_parameters_ahead() {
  if (!gathers_updates() || !stack_.param_gather_overlap) return;
  // Megatron gathers the same buckets it reduces, the first forward's first layers first.
  for (size_t b = buckets_.size(); b-- > 0;) {
    if (bucket_ranks(buckets_[b]) == 1 || buckets_[b].params == 0) continue;
    int32_t task = gather_bucket(buckets_[b], Phase::kFwd, 0, -1);
    for (size_t l : buckets_[b].layers) param_gather_[l].push_back(task);
  }
}

void StageBuilder::layer_reduced(size_t layer, int64_t mb) {
  auto it = buckets_of_.find(layer);
  if (it == buckets_of_.end()) return;
  const bool each_pass = gradients_ == models::LayerGradients::kBucketsEachPass;
  for (size_t i : it->second) {
    const models::GradientBucket& b = buckets_[i];
    if (--pending_[i] != 0 || b.after_tied_sum || buckets_in_order()) continue;
    const int32_t reduced = reduce_bucket(b, flush(), each_pass ? mb : micro_batches_ - 1);
    if (!each_pass) continue;
    // The next micro-batch's backward fills the bucket again; without overlap this one's
    // backward goes on once the bucket is reduced.
    pending_[i] = static_cast<int64_t>(b.layers.size());
    if (!stack_.dp_overlap && reduced >= 0) require(reduced);
  }
  if (!buckets_in_order()) return;
  for (; next_bucket_ < buckets_.size() && pending_[next_bucket_] == 0; ++next_bucket_)
    if (!buckets_[next_bucket_].after_tied_sum)
      reduce_bucket(buckets_[next_bucket_], flush(), micro_batches_ - 1);
}

int32_t StageBuilder::reduce_bucket(const models::GradientBucket& b, int32_t after, int64_t mb) {
  const int64_t bytes = b.params * grad_bytes_;
  if (bytes == 0) return -1;
  if (bucket_ranks(b) == 1) {  // nothing to reduce: the bucket only leaves for the host
    if (offload_optimizer()) gradients_to_host(b.params, mb, -1, after);
    return -1;
  }
  if (plan_.compression.any()) {
    compressed_reduce(b, after);
    return -1;
  }
  // DDP all-reduces gradients; ZeRO-1/2 reduce-scatter them (each rank keeps its shard).
  // Under AxoNN's overlap the bucket's weight gradients may still be reduce-scattered over z.
  int32_t reduced = step_comm(models::gradient_reduction(plan_, b.params, b.experts, grad_bytes_),
                              Phase::kBwd, mb, after, -1, depth_scatter_);
  if (offload_optimizer()) gradients_to_host(b.params, mb, -1, reduced);
  return reduced;
}

void StageBuilder::compressed_reduce(const models::GradientBucket& b, int32_t after) {
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

int32_t StageBuilder::codec_task(const models::Op& codec, const std::vector<Dep>& deps) {
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

void StageBuilder::optimizer_step() {
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

void StageBuilder::weight_stash(int64_t params) {
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

}  // namespace sextant::sim
