// Plan x cluster -> stack, dtypes and lowering options.
#include "sextant/sim/step_setup.hpp"

namespace sextant::sim {

StepSetup step_setup(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                     const spec::Plan& plan) {
  StepSetup s;
  const bool gpu = cluster.device.kind == spec::DeviceKind::kGpu;
  s.stack = spec::plan_stack(plan, gpu);
  spec::Dtype precision = gpu ? spec::Dtype::kBf16 : spec::Dtype::kFp32;
  if (plan.dtype) {
    precision = *plan.dtype;
  } else if (s.stack.precision) {
    precision = *s.stack.precision;
  }
  s.gemm_dtype = precision;
  // An fp8 recipe (Transformer Engine) runs the GEMMs in fp8 and keeps activations in bf16.
  s.dtype = precision == spec::Dtype::kFp8 ? spec::Dtype::kBf16 : precision;
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
  return s;
}

ComputeModel make_compute_model(const spec::ClusterSpec& cluster, const StepSetup& setup) {
  return ComputeModel(cluster.device, setup.dtype, setup.stack.attention, setup.gemm_dtype);
}

}  // namespace sextant::sim
