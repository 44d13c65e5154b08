// How a stack's fusion level runs a transformer block's memory-bound ops
// (transformer_lowering.hpp).
#include <cstdint>

#include "transformer_lowering.hpp"

namespace sextant::models {

Op autocast_cast(OpId name, int64_t elements, int64_t e, TpSplit split) {
  return memory_op(name, OpClass::kElementwise, elements * (4 + e), split, {elements});
}

Fp8Casts fp8_casts(OpId name, int64_t row_input, int64_t column_input, int64_t outputs, int64_t e) {
  Fp8Casts c;
  c.forward = memory_op(name, OpClass::kElementwise, row_input * (e + 2), TpSplit::kReplicated,
                        {row_input});
  c.backward = memory_op(name, OpClass::kElementwise, outputs * (e + 2) + column_input * 2,
                         TpSplit::kReplicated, {outputs + column_input});
  c.backward.kernels = 3;  // the two output gradients' casts, the norm output's transpose
  return c;
}

namespace {

// Hugging Face's NewGELUActivation in eager PyTorch, per element of its input (transformers
// activations.py: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 *
// torch.pow(x, 3.0))))). Each operator is a kernel. `e` is the input's bytes (the GEMM output);
// `c` the chain's: under torch.autocast `pow` is on the fp32 list (PyTorch autocast op reference,
// "CUDA ops that can autocast to float32"), so x is cast to fp32 for it and type promotion keeps
// everything after it fp32 (c = 4), and FC2's addmm casts the fp32 result back to 16 bits;
// without autocast c = e. Forward, in evaluation order (read + write bytes):
//   [cast x -> fp32: e + c]  t1 = 0.5 * x: 2e   t2 = pow(x, 3): 2c   t3 = 0.044715 * t2: 2c
//   t4 = x + t3: e + 2c   t5 = k * t4: 2c   t6 = tanh(t5): 2c   t7 = 1 + t6: 2c
//   t8 = t1 * t7: e + 2c   [FC2's cast of t8 to 16 bits: c + e]
//   = 14c + 4e (+ 2(c + e)), 8 kernels (+ 2).
// Backward (autograd's formulas; a gradient is cast to its input's dtype where they differ):
//   [cast dy -> fp32: e + c]  d t1 = g * t7: 3c [+ cast c + e]  d t7 = g * t1: 2c + e
//   tanh_backward(g, t6): 3c   d t4 = k * g: 2c   d x from t4 [cast: c + e]   d t2 = 0.044715 * g:
//   2c   pow_backward = g * (3 * x32.pow(2)): 2c + 2c + 3c   [d x from the cast: c + e]
//   d x from t1 = 0.5 * g: 2e   the three gradients of x summed: 2 x 3e
//   = 19c + 9e (+ 4(c + e)), 11 kernels (+ 4).
// Kept for backward: x32 (pow's input; x itself without autocast), t6 (tanh's output) and t1, t7
// (the product's operands): 3c + e against the fused kernel's e.
struct ComposedActivation {
  int64_t forward = 0, backward = 0, saved = 0;  // bytes per element
  int forward_kernels = 0, backward_kernels = 0;
};
ComposedActivation gelu_new_eager(int64_t e, bool autocast) {
  const int64_t c = autocast ? 4 : e;
  const int64_t casts = autocast ? 1 : 0;
  return {14 * c + 4 * e + casts * 2 * (c + e), 19 * c + 9 * e + casts * 4 * (c + e), 3 * c + e,
          8 + 2 * static_cast<int>(casts), 11 + 4 * static_cast<int>(casts)};
}

}  // namespace

FusionPasses fusion_passes(const spec::TransformerSpec& m, const TransformerDims& x) {
  FusionPasses p;
  if (x.eager()) {
    if (m.norm == spec::Norm::kRmsNorm && !x.fused_rms_norm) {
      p.norm = 9;
      p.norm_kernels = 7;
    }
    if (m.activation == spec::Activation::kSwiglu) {
      p.act = 5.0 / 3.0;
      p.act_kernels = 2;
    }
    if (m.activation == spec::Activation::kGeluNew) {
      const ComposedActivation g = gelu_new_eager(x.e, x.autocast);
      p.act = static_cast<double>(g.forward) / static_cast<double>(2 * x.e);  // fused: read+write e
      p.act_kernels = g.forward_kernels;
      p.act_backward = static_cast<double>(g.backward) / static_cast<double>(g.forward);
      p.act_backward_kernels = g.backward_kernels;
      p.act_saved = g.saved;
    }
    p.rope = 4;
    p.rope_kernels = 4;
    p.softmax = 3;
    p.softmax_kernels = 3;
    if (m.dropout) {
      p.residual = 5.0 / 3.0;
      p.residual_kernels = 2;
    }
  } else if (x.compiled()) {
    p.norm = 0.5;
    p.norm_kernels = 0;
  }
  return p;
}

Op rope_op(const TransformerDims& x, const FusionPasses& passes) {
  const int64_t rotated = (x.h + x.kv * x.d) / x.t;  // q's and k's columns on the rank
  return unfused(memory_op(OpId::kAttnRope, OpClass::kElementwise, 2 * x.tokens() * rotated * x.e,
                           TpSplit::kColumn, {x.tokens(), rotated}),
                 passes.rope, passes.rope_kernels);
}

Op activation_backward(const Op& act, int64_t gate, const FusionPasses& passes) {
  if (passes.act_backward > 0) {
    Op op = memory_backward(act, passes.act_backward);
    op.kernels = passes.act_backward_kernels;
    return op;
  }
  return memory_backward(act,
                         (2.0 * static_cast<double>(gate) + 1) / (static_cast<double>(gate) + 1));
}

Op norm_backward(const Op& fwd, const spec::TransformerSpec& m, const TransformerDims& x,
                 const FusionPasses& passes) {
  Op op = memory_backward(fwd, 1.5);
  op.kernels = passes.norm_kernels == 0 ? 0
               : x.eager() && (m.norm == spec::Norm::kLayerNorm || x.fused_rms_norm)
                   ? 2
                   : passes.norm_kernels;
  return op;
}

}  // namespace sextant::models
