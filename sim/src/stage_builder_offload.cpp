// A stage's copies between device and host: offloaded activations out and back, ZeRO-Offload's
// gradients and host optimizer step, and the host's own work of the step.
#include "stage_builder.hpp"

namespace sextant::sim {

// A local task on the offload stream (a device-host copy, the host optimizer step) after
// `deps`.
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

// The rank's gradient shard of `params` parameters, copied to the host once reduced
// (`after`: the reduction, or the compute that produced it).
void StageBuilder::gradients_to_host(int64_t params, int64_t mb, int32_t layer, int32_t after) {
  const models::StepOp copy = models::gradients_to_host(shard(params), grad_bytes_);
  std::vector<Dep> deps;
  if (after >= 0) deps.push_back(done(after));
  offload_task(copy, offload_->device_host_copy(copy.bytes), Phase::kBwd, mb, layer, deps);
}

// Transformer Engine's activation offload (cpu_offload.py, the double-buffered group handler
// Megatron-LM's --cpu-offloading uses): once a layer's forward is done its saved activations are
// copied to the host on the offload stream, and the layer after next waits for that copy (the
// next one already runs while it moves), so at most two layers' activations are in transit.
// The wait binds the pass's next layer only (`next_in_pass`): whatever the schedule runs after
// the pass (another micro-batch's backward) does not wait for this pass's copies.
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

// A layer's offloaded activations copied back to the device, once per backward unit: issued
// when the backward of a layer up to `prefetch_layers` above it starts (a prefetch), or when
// its own starts, and once they are on the host (the copies each way run on streams of their
// own). Returns the copy task.
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

// ZeRO-Offload's step (DeepSpeed stage_1_and_2.py / stage3.py with offload_optimizer): once
// every gradient shard is on the host, CPU-Adam updates the fp32 master weights (after reading
// the states from NVMe and before writing them back, when they live there), and the updated
// 16-bit shard returns to the device, or stays on the host when the parameters are offloaded.
// Returns the task the parameters are ready after.
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

// The host's own work of the step (ClusterSpec step_overhead_us), once per step, on the compute
// stream's current segment.
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
