// A stage's copies between device and host: offloaded activations out and back, ZeRO-Offload's
// gradients and host optimizer step, and the host's own work of the step.
#include "stage_builder.hpp"

namespace sextant::sim {

int32_t StageBuilder::offload_task(OpId name, spec::OpClass cls, int64_t bytes,
                                   Picoseconds duration, Phase phase, int64_t mb, int32_t layer,
                                   const std::vector<Dep>& deps) {
  return offload_task(models::StepOp{name, cls, std::nullopt, models::StepGroup::kLocal,
                                     models::offload_stream(name), 0, bytes},
                      duration, phase, mb, layer, deps);
}

int32_t StageBuilder::offload_task(const models::StepOp& op, Picoseconds duration, Phase phase,
                                   int64_t mb, int32_t layer, const std::vector<Dep>& deps) {
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

void StageBuilder::gradients_to_host(int64_t params, int64_t mb, int32_t layer, int32_t after) {
  const models::StepOp copy = models::gradients_to_host(shard(params), grad_bytes_);
  std::vector<Dep> deps;
  if (after >= 0) deps.push_back(done(after));
  offload_task(copy, offload_->device_host_copy(copy.bytes), Phase::kBwd, mb, layer, deps);
}

void StageBuilder::activations_to_host(size_t layer, int64_t mb, bool next_in_pass) {
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

int32_t StageBuilder::reload_activations(size_t layer, int64_t mb) {
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

int32_t StageBuilder::host_optimizer_step(int64_t updated) {
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

void StageBuilder::host_step_overhead() {
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

}  // namespace sextant::sim
