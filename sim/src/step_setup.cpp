// Plan x cluster -> stack, dtypes and lowering options.
#include "sextant/sim/step_setup.hpp"

#include "sextant/spec/stack_on_cluster.hpp"

namespace sextant::sim {

StepPrecision step_precision(const spec::ClusterSpec& cluster, const spec::Plan& plan,
                             const spec::Stack& stack) {
  const bool gpu = cluster.device.kind == spec::DeviceKind::kGpu;
  spec::Dtype precision = gpu ? spec::Dtype::kBf16 : spec::Dtype::kFp32;
  if (plan.dtype) {
    precision = *plan.dtype;
  } else {
    if (stack.precision) precision = *stack.precision;
    // A GPU without bf16 (Volta: V100) runs a bf16 stack in fp16 mixed precision (Megatron-LM's
    // --fp16, torch.cuda.amp's default dtype); a plan that asks for bf16 is refused.
    if (gpu && precision == spec::Dtype::kBf16 &&
        !cluster.device.peak_tflops.contains(spec::Dtype::kBf16) &&
        cluster.device.peak_tflops.contains(spec::Dtype::kFp16))
      precision = spec::Dtype::kFp16;
  }
  // An fp8 recipe (Transformer Engine) runs the GEMMs in fp8 and keeps activations in bf16.
  return {precision == spec::Dtype::kFp8 ? spec::Dtype::kBf16 : precision, precision};
}

bool copies_gradients_in(const spec::Plan& plan, const spec::Stack& stack) {
  return plan.zero == 3 && stack.grad_copy_in;
}

int64_t param_copy_bytes(const spec::Plan& plan, const spec::Stack& stack, spec::Dtype dtype) {
  if (plan.zero != 3 || !stack.param_copy_out) return 0;
  const int64_t param = spec::dtype_bytes(spec::parameter_dtype(stack, dtype));
  // FSDP2's foreach_all_gather_copy_out (torch/distributed/fsdp/_fully_shard/
  // _fsdp_collectives.py): the gathered parameters read and written once. The shard's cast and
  // copy into the all-gather buffer run on FSDP2's copy-in stream, beside the compute: not here.
  if (plan.replicas() > 1) return 2 * param;
  // One rank (_fsdp_param_group.py wait_for_unshard, world_size == 1): the fp32 shard cast to the
  // parameter dtype, then copied into the unsharded parameter. Measured in
  // traces/samples/kineto-llama3-8b-8l-h200-fsdp2-eager.json.gz: per parameter and unshard an
  // aten::to (6 B) and a device copy (4 B), both at the generic memory efficiency.
  const int64_t cast = param < 4 ? 4 + param : 0;
  return cast + 2 * param;
}

StepSetup step_setup(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                     const spec::Plan& plan) {
  return step_setup(
      model, cluster, plan,
      spec::plan_stack(plan, cluster.device.kind == spec::DeviceKind::kGpu, model.kind()));
}

StepSetup step_setup(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                     const spec::Plan& plan, const spec::Stack& stack) {
  StepSetup s;
  s.stack = spec::stack_on(cluster, stack);
  const StepPrecision precision = step_precision(cluster, plan, stack);
  s.gemm_dtype = precision.gemm_dtype;
  s.dtype = precision.dtype;
  if (model.is_transformer()) s.seq_len = plan.seq_len.value_or(model.transformer().seq_len);
  s.busy_devices_per_node = busy_devices_per_node(cluster, plan.world_size());
  s.lowering.micro_batch = plan.micro_batch;
  s.lowering.seq_len = s.seq_len;
  s.lowering.dtype = s.dtype;
  s.lowering.tp = plan.tp;
  s.lowering.sequence_parallel = plan.sequence_parallel;
  s.lowering.attention = s.stack.attention;
  s.lowering.fusion = s.stack.fusion;
  s.lowering.cross_entropy = s.stack.cross_entropy;
  s.lowering.autocast = s.stack.autocast;
  s.lowering.fused_rms_norm = s.stack.fused_rms_norm;
  s.lowering.bias_grad_kernel = s.stack.bias_grad_kernel;
  s.lowering.code = s.stack.code;
  if (copies_gradients_in(plan, s.stack))
    s.lowering.grad_copy_in_bytes = spec::dtype_bytes(spec::parameter_dtype(s.stack, s.dtype)) +
                                    spec::dtype_bytes(spec::gradient_dtype(s.stack, s.dtype));
  s.lowering.zero3 = plan.zero == 3;
  s.lowering.reshard_after_forward = s.stack.reshard_after_forward;
  s.lowering.pipelined = plan.pp > 1;
  s.lowering.param_copy_bytes = param_copy_bytes(plan, s.stack, s.dtype);
  s.lowering.fp8_gemms = s.gemm_dtype == spec::Dtype::kFp8;
  s.lowering.selective = s.stack.selective_recompute;
  s.lowering.vocab_multiple = s.stack.vocab_multiple;
  s.lowering.dropout = s.stack.dropout;
  s.lowering.spatial = plan.spatial;
  s.lowering.channel_algorithms = plan.channel_algorithms;
  s.lowering.cp = plan.cp;
  s.lowering.cp_algorithm = plan.cp_algorithm;
  s.lowering.ep = plan.ep;
  s.lowering.tp_grid = plan.tp_grid;
  s.lowering.dp = plan.dp;
  s.lowering.per_op = plan.per_op;
  s.lowering.branch_parallel = plan.branch_parallel;
  return s;
}

double tensor_share(const models::LoweredModel& lowered, const ComputeModel& compute) {
  double tensor = 0, total = 0;
  auto add = [&](const std::vector<models::Op>& ops, spec::Phase phase) {
    for (const models::Op& op : ops) {
      if (op.is_comm()) continue;  // a transfer is no compute kernel of the mix
      const double t = static_cast<double>(compute.op_time(op, phase));
      total += t;
      if (op.fused_attention || (is_matrix_op(op.op_class) && op.flops > 0)) tensor += t;
    }
  };
  for (const models::Layer& layer : lowered.layers) {
    add(layer.forward, spec::Phase::kFwd);
    add(layer.backward, spec::Phase::kBwd);
  }
  return total > 0 ? tensor / total : 0.0;
}

ComputeModel make_compute_model(const spec::ClusterSpec& cluster, const StepSetup& setup,
                                const models::LoweredModel& lowered) {
  ComputeModel compute(cluster.device, setup.dtype, setup.stack.attention, setup.gemm_dtype);
  compute.set_busy_devices(setup.busy_devices_per_node);
  const std::optional<spec::PowerModel>& power = cluster.device.power;
  if (!power || power->locked_clock_MHz) return compute;
  // Start at the boost clock (the largest tensor share) and iterate: a lower clock lengthens the
  // tensor work, raising its share; three rounds move the clock by well under 0.1%.
  double clock = power->max_clock_MHz;
  for (int round = 0; round < 3; ++round) {
    const ComputeModel at(cluster.device, setup.dtype, setup.stack.attention, setup.gemm_dtype,
                          clock);
    const double sm_clock =
        spec::sustained_clock_MHz(*power, setup.gemm_dtype, tensor_share(lowered, at));
    clock = spec::gemm_model_clock_MHz(*power, setup.gemm_dtype, sm_clock);
  }
  ComputeModel at_clock(cluster.device, setup.dtype, setup.stack.attention, setup.gemm_dtype,
                        clock);
  at_clock.set_busy_devices(setup.busy_devices_per_node);
  return at_clock;
}

}  // namespace sextant::sim
