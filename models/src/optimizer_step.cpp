// Bytes per parameter of an optimizer step (see optimizer_step.hpp for the passes and source).
#include "sextant/models/optimizer_step.hpp"

namespace sextant::models {

int64_t optimizer_bytes_per_param(const OptimizerPrecision& p) {
  const int64_t grad = spec::dtype_bytes(p.grads);
  const int64_t param = spec::dtype_bytes(p.model_params);
  int64_t bytes = 16 + 12;                // AdamW over fp32 master weights and moments
  if (grad < 4) bytes += grad + 4;        // _copy_model_grads_to_main_grads
  if (p.loss_scaling) bytes += 4 + 4;     // _unscale_main_grads_and_check_for_nan
  if (p.clip_passes) bytes += 4 + 4 + 4;  // the gradient norm, then the scaling
  if (param < 4 && !p.params_sharded) bytes += 4 + param;  // _copy_main_params_to_model_params
  return bytes;
}

OptimizerPrecision optimizer_precision(const spec::Stack& stack, spec::Dtype compute,
                                       int64_t zero_stage) {
  OptimizerPrecision p;
  p.model_params = spec::parameter_dtype(stack, compute);
  p.grads = spec::gradient_dtype(stack, compute);
  p.loss_scaling = compute == spec::Dtype::kFp16;
  p.params_sharded = zero_stage == 3;
  p.clip_passes = stack.grad_clip;
  return p;
}

int64_t host_optimizer_bytes_per_param(spec::Dtype param_dtype) {
  OptimizerPrecision host;
  host.model_params = param_dtype;
  host.grads = spec::Dtype::kFp32;
  return optimizer_bytes_per_param(host);
}

int64_t weight_stash_bytes_per_param(spec::Dtype model_params) {
  return spec::dtype_bytes(model_params);
}

int64_t weight_stash_copy_bytes_per_param(spec::Dtype model_params) {
  return spec::dtype_bytes(model_params) >= 4 ? 2 * spec::dtype_bytes(model_params) : 0;
}

}  // namespace sextant::models
