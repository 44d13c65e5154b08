// What a plan means on a cluster before any op is priced: the software stack it runs under, the
// dtypes of tensors and GEMMs, and the options of the model's lowering. One home for these rules;
// the simulator and the planner's estimator both ask it.
#pragma once

#include "sextant/models/lowering.hpp"
#include "sextant/sim/compute_model.hpp"
#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::sim {

struct StepSetup {
  spec::Stack stack;                            // as the cluster runs it (spec::stack_on)
  spec::Dtype dtype = spec::Dtype::kBf16;       // what tensors are stored in
  spec::Dtype gemm_dtype = spec::Dtype::kBf16;  // the tensor-core format of the GEMMs
  int64_t seq_len = 0;                          // transformers; 0 otherwise
  // The plan's ranks computing at once on one node (the node's devices fill in rank order):
  // what DeviceSpec::co_run slows a device's compute by.
  int64_t busy_devices_per_node = 1;
  models::LoweringOptions lowering;
};

// The plan's stack (or the cluster kind's default), its precision: the plan's dtype, else the
// stack's (fp8: GEMMs in fp8, tensors in bf16), else bf16 on GPUs and fp32 on CPUs.
StepSetup step_setup(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                     const spec::Plan& plan);
// The same with the stack given (a planner keeps one stack for many plans that do not carry it).
StepSetup step_setup(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                     const spec::Plan& plan, const spec::Stack& stack);

// What the tensors are stored in and what the GEMMs run in (the rule of step_setup above).
struct StepPrecision {
  spec::Dtype dtype = spec::Dtype::kBf16;
  spec::Dtype gemm_dtype = spec::Dtype::kBf16;
};
StepPrecision step_precision(const spec::ClusterSpec& cluster, const spec::Plan& plan,
                             const spec::Stack& stack);

// Whether the plan's ZeRO-3 copies each layer's gradients into its reduce-scatter buffer on the
// compute stream (Stack::grad_copy_in; LoweringOptions::grad_copy_in_bytes).
bool copies_gradients_in(const spec::Plan& plan, const spec::Stack& stack);

// Bytes read and written per parameter on the compute stream each time the plan's ZeRO-3 unshards
// a unit (Stack::param_copy_out; LoweringOptions::param_copy_bytes), in compute dtype `dtype`.
int64_t param_copy_bytes(const spec::Plan& plan, const spec::Stack& stack, spec::Dtype dtype);

// The compute model of a step. On a device with a power model its GEMMs and attention run at the
// clock the power limit allows for this step's mix of tensor-core and memory-bound work (the
// share of compute time in matrix ops and fused attention over `lowered`'s forward and backward;
// a fixed point, since the share itself depends on the clock). Without one: the device's clock.
// Where the device has a co_run slowdown, its ops are slowed by the plan's busy devices per node.
ComputeModel make_compute_model(const spec::ClusterSpec& cluster, const StepSetup& setup,
                                const models::LoweredModel& lowered);

// The share of a step's compute time that is tensor-core work (matrix ops and fused attention)
// under `compute`, over `lowered`'s forward and backward compute ops (transfers left out).
double tensor_share(const models::LoweredModel& lowered, const ComputeModel& compute);

}  // namespace sextant::sim
