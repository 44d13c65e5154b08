// Plan x cluster -> stack, dtypes and lowering options.
#include "sextant/sim/step_setup.hpp"

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

StepSetup step_setup(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                     const spec::Plan& plan) {
  return step_setup(model, cluster, plan,
                    spec::plan_stack(plan, cluster.device.kind == spec::DeviceKind::kGpu));
}

StepSetup step_setup(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                     const spec::Plan& plan, const spec::Stack& stack) {
  StepSetup s;
  s.stack = stack;
  const StepPrecision precision = step_precision(cluster, plan, stack);
  s.gemm_dtype = precision.gemm_dtype;
  s.dtype = precision.dtype;
  if (model.is_transformer()) s.seq_len = plan.seq_len.value_or(model.transformer().seq_len);
  s.lowering.micro_batch = plan.micro_batch;
  s.lowering.seq_len = s.seq_len;
  s.lowering.dtype = s.dtype;
  s.lowering.tp = plan.tp;
  s.lowering.sequence_parallel = plan.sequence_parallel;
  s.lowering.attention = s.stack.attention;
  s.lowering.fusion = s.stack.fusion;
  s.lowering.cross_entropy = s.stack.cross_entropy;
  s.lowering.autocast = s.stack.autocast;
  s.lowering.vocab_multiple = s.stack.vocab_multiple;
  s.lowering.dropout = s.stack.dropout;
  s.lowering.spatial = plan.spatial;
  s.lowering.channel_algorithms = plan.channel_algorithms;
  s.lowering.cp = plan.cp;
  s.lowering.cp_algorithm = plan.cp_algorithm;
  s.lowering.ep = plan.ep;
  s.lowering.tp_grid = plan.tp_grid;
  return s;
}

ComputeModel make_compute_model(const spec::ClusterSpec& cluster, const StepSetup& setup) {
  return ComputeModel(cluster.device, setup.dtype, setup.stack.attention, setup.gemm_dtype);
}

}  // namespace sextant::sim
