// What an optimizer step moves through memory, per parameter it updates: one home for the
// simulator (which prices it) and the executor (which labels its traced step with it).
#pragma once

#include <cstdint>

#include "sextant/spec/dtype.hpp"
#include "sextant/spec/stack.hpp"

namespace sextant::models {

// How the step's tensors are held: AdamW always updates fp32 master weights and moments.
struct OptimizerPrecision {
  spec::Dtype model_params = spec::Dtype::kFp32;  // the copy forward and backward read
  spec::Dtype grads = spec::Dtype::kFp32;         // the dtype gradients are reduced in
  bool loss_scaling = false;                      // fp16 training: gradients carry a loss scale
  bool params_sharded = false;  // ZeRO-3 / FSDP: the 16-bit copy is made by each gather instead
  // Gradient-norm clipping as passes of their own before the update (Stack::grad_clip); off where
  // the script does not clip or folds the scale into the update (Sextant's executor).
  bool clip_passes = false;
};

// Bytes read and written per updated parameter by a mixed-precision AdamW step, pass by pass as
// Megatron-LM's Float16OptimizerWithFloat16Params.step() (megatron/optimizer/optimizer.py) runs
// them; a pass a precision does not need is skipped:
//   gradients to fp32 main gradients (16-bit gradients only)      2 + 4
//   unscale and inf/nan check (loss scaling)                      4 + 4
//   gradient-norm clipping (clip_passes): the norm, then the scale 4 + (4 + 4)
//     (torch.nn.utils.clip_grad_norm_: _foreach_norm, then _foreach_mul_ by min(1, max/norm),
//     always; Megatron's clip_grad_norm_fp32: multi_tensor_l2norm, multi_tensor_scale when the
//     norm exceeds the maximum, counted always. On the H200 the two passes over 2.8B fp32
//     gradients took 3.17 + 6.12 ms: traces/samples/kineto-llama3-8b-8l-h200-eager.json.gz)
//   AdamW: read param, grad, m, v; write param, m, v (fp32)       16 + 12
//   fp32 master weights to the 16-bit model copy                  4 + 2
// fp32 training is the AdamW pass alone (28 bytes).
int64_t optimizer_bytes_per_param(const OptimizerPrecision& precision);

// Bytes ZeRO-Offload's host step (CPU-Adam) moves per parameter: optimizer_bytes_per_param with
// fp32 gradients (the device's 16-bit gradient was widened by its copy to the host) and the copy
// for the device (`param_dtype`) written from the master weights. The simulator prices it, the
// executor labels its host step with it.
int64_t host_optimizer_bytes_per_param(spec::Dtype param_dtype);

// PipeDream-2BW's second weight version (spec/pipeline_schedule.hpp): the copy forward and
// backward read, stashed for the batch in flight while the update writes the next one.
//   held: one more model copy per parameter (`model_params` bytes; Narayanan et al. 2021 §3.1
//         count 2|W| per stage);
//   moved per update: in mixed precision nothing more (the fp32 master is the newest version and
//         the update's 16-bit copy goes to the free buffer); in fp32 the master weights are the
//         copy the kernels read, so the newest version is first copied to the free buffer and
//         updated there (read + write), per parameter the rank updates (under ZeRO-1/2 its
//         shard: the gather after the update brings the other shards of the new version).
int64_t weight_stash_bytes_per_param(spec::Dtype model_params);
int64_t weight_stash_copy_bytes_per_param(spec::Dtype model_params);

// The precision a plan's optimizer step runs in: parameters and gradients as the stack holds them
// at `compute` dtype (activations; an fp8 recipe keeps bf16 weights), loss scaling with fp16
// (Megatron --fp16, torch.amp.GradScaler), sharded parameters under ZeRO-3.
OptimizerPrecision optimizer_precision(const spec::Stack& stack, spec::Dtype compute,
                                       int64_t zero_stage);

}  // namespace sextant::models
