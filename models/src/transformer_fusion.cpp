// How a stack's fusion level runs a transformer block's memory-bound ops
// (transformer_lowering.hpp).
#include <cstdint>

#include "transformer_lowering.hpp"

namespace sextant::models {

Op autocast_cast(OpId name, int64_t elements, int64_t e, TpSplit split) {
  return memory_op(name, OpClass::kElementwise, elements * (4 + e), split, {elements});
}

Op autocast_cast_backward(const Op& cast, const TransformerDims& x) {
  Op op = memory_backward(cast, 1.0);
  // The 16-bit gradient back to fp32: eager PyTorch's bf16 -> fp32 copy, a mixed-dtype kernel.
  if (x.eager()) op.mixed_dtype_bytes = op.bytes;
  return op;
}

// Inductor fuses the pointwise ops on either side of a norm into the norm's reduction kernel,
// and a profile names that kernel by its norm: in the project's compiled Llama-3 8B traces
// (traces/samples/kineto-llama3-8b-8l-h200-compile.json.gz, -fsdp2-compile.json.gz) a block's
// forward runs triton_red_fused__fused_rms_norm__to_copy (the attention norm and its autocast
// cast) and ..._fused_rms_norm__to_copy__unsafe_view_add (the attention residual's add, the MLP
// norm and its cast); its backward, two ..._fused_rms_norm_backward__to_copy__unsafe_view_add
// kernels (each norm's backward with its cast's backward and the residual gradient's add). Their
// time is the norm class's (sextant validate K3, K5), which `calibrate --kineto` fits by class.
// TorchTitan compiles per block, so the MLP residual's forward add, the block's last op, stays
// a kernel of its own.
Op beside_norm(Op op, const TransformerDims& x) {
  if (x.compiled()) op.op_class = OpClass::kNorm;
  return op;
}

Op bias_grad_op(OpId name, int64_t tokens, int64_t columns, int64_t e) {
  return memory_op(name, OpClass::kElementwise, tokens * columns * e + columns * 4,
                   TpSplit::kColumn, {tokens, columns});
}

Op block_bias_grad(OpId name, const TransformerDims& x, int64_t tokens, int64_t columns) {
  Op op = bias_grad_op(name, tokens, columns, x.e);
  // Eager PyTorch sums a linear's bias gradient over the tokens with ATen's reduce_kernel<128, 4>,
  // TensorIterator's reduction (traces/samples/kineto-gpt2-124m-h100-b8.json.gz: 1.3-1.5 TB/s
  // for GPT-2's [8192, 2304] and [8192, 3072] gradients, 0.39-0.45 of 3.35): the strided family.
  if (x.eager()) op.memory_kernel = spec::MemoryKernel::kStrided;
  return op;
}

Op norm_op(OpId name, const TransformerDims& x, const FusionPasses& passes) {
  const int64_t rows = x.norm_tokens();
  Op op = unfused(memory_op(name, OpClass::kNorm, 2 * rows * x.h * x.residual_bytes(),
                            x.norm_split(), {rows, x.h}),
                  passes.norm, passes.norm_kernels);
  op.memory_kernel = passes.norm_kernel;
  return op;
}

Op residual_op(OpId name, const spec::TransformerSpec& m, const TransformerDims& x,
               const FusionPasses& passes) {
  const int64_t elements = x.norm_tokens() * x.h;
  const int64_t add = elements * (2 * x.residual_bytes() + x.e);
  Op op = unfused(memory_op(name, OpClass::kElementwise, add + elements * (m.dropout ? 1 : 0),
                            x.norm_split(), {x.norm_tokens(), x.h}),
                  passes.residual, passes.residual_kernels);
  // Under autocast the add reads the fp32 stream and the 16-bit branch: a mixed-dtype kernel in
  // eager PyTorch (the dropout before it stays in 16 bits).
  if (x.eager() && x.autocast) op.mixed_dtype_bytes = add;
  return op;
}

Fp8Casts fp8_casts(OpId name, int64_t row_input, int64_t column_input, int64_t outputs,
                   const TransformerDims& x) {
  const int64_t e = x.e;
  Fp8Casts c;
  c.forward = memory_op(name, OpClass::kElementwise, row_input * (e + 2), TpSplit::kReplicated,
                        {row_input});
  c.backward = memory_op(name, OpClass::kElementwise, outputs * (e + 2) + column_input * 2,
                         TpSplit::kReplicated, {outputs + column_input});
  c.backward.kernels = 3;  // the two output gradients' casts, the norm output's transpose
  if (!x.compiled()) {
    c.forward.memory_kernel = spec::MemoryKernel::kCastTranspose;
    c.backward.memory_kernel = spec::MemoryKernel::kCastTranspose;
  }
  return c;
}

// ATen's log_softmax over a row of `vocab` fp32 logits (aten/src/ATen/native/cuda/SoftMax.cu):
// a row that fits one block's 48 KiB of shared memory (less a float per warp of its 1024
// threads for the reduction) is read once (cunn_SoftMaxForwardSmem / Reg); a longer one is read
// three times, for its max, its sum of exponentials and the output (cunn_SoftMaxForward: the K1
// and K2 traces' kernel at 50304 and 128256 logits, 16 bytes a logit at 0.91 and 0.88 of HBM).
// Its backward reads the gradient for the sum, then the gradient and output again to write.
bool softmax_row_on_chip(int64_t vocab) {
  return vocab * 4 < 48 * 1024 - (1024 / 32) * 4;
}

Op eager_cross_entropy(int64_t tokens, int64_t vocab) {
  const int64_t per_logit = softmax_row_on_chip(vocab) ? 8 : 16;
  Op op = memory_op(OpId::kHeadLoss, OpClass::kLoss, tokens * vocab * per_logit, TpSplit::kVocab,
                    {tokens, vocab});
  op.kernels = 2;  // log_softmax, nll_loss
  return op;
}

EagerLossCast eager_loss_cast(int64_t tokens, int64_t vocab, int64_t e) {
  const int64_t logits = tokens * vocab;
  EagerLossCast c;
  c.softmax_backward_bytes = logits * (softmax_row_on_chip(vocab) ? 12 : 16);
  if (e < 4) {
    // logits.float(): a bf16 -> fp32 copy, mixed-dtype.
    Op cast = memory_op(OpId::kHeadLossCast, OpClass::kElementwise, logits * (e + 4),
                        TpSplit::kVocab, {tokens, vocab});
    cast.mixed_dtype_bytes = cast.bytes;
    c.forward = cast;
  }
  // nll_loss's backward zero-fills its fp32 gradient (4 bytes a logit) before scattering into
  // it; the cast's backward writes the 16-bit gradient (4 + e, the vectorized fp32 -> bf16 copy).
  c.backward = memory_op(OpId::kHeadLossCast, OpClass::kElementwise,
                         logits * (4 + (e < 4 ? 4 + e : 0)), TpSplit::kVocab, {tokens, vocab});
  c.backward.kernels = e < 4 ? 2 : 1;
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
    } else {
      p.norm_kernel = spec::MemoryKernel::kNativeNorm;
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
  const int64_t elements = x.tokens() * rotated;
  if (x.fusion != spec::Fusion::kFused && x.code.rope == spec::RopeKernel::kComplex) {
    // Meta's and TorchTitan's apply_rotary_emb (torchtitan/models/llama3/model/model.py):
    // view_as_complex(xq.float()), a complex multiply by the fp32 frequencies, view_as_real and
    // type_as(xq), for q and for k. Per element: the upcast (e read, 4 written), the complex
    // multiply (4 read, 4 written; the frequencies broadcast over the heads), the downcast
    // (4 + e): 3 kernels a tensor; in fp32 the casts are no-ops. Its backward runs the same three
    // on the gradient (the multiply by the conjugate). Eager, the upcast is a mixed-dtype kernel:
    // 286 us a layer's forward for 8192 tokens of Llama-3 8B's q and k in
    // traces/samples/kineto-llama3-8b-8l-h200-eager.json.gz (upcasts 130, multiplies 96,
    // downcasts 60). Inductor compiles no complex arithmetic: the multiply stays ATen's and the
    // casts become kernels of their own (-compile.json.gz: 218 us a layer's forward).
    const bool casts = x.e < 4;
    Op op = memory_op(OpId::kAttnRope, OpClass::kElementwise,
                      elements * (8 + (casts ? 2 * (x.e + 4) : 0)), TpSplit::kColumn,
                      {x.tokens(), rotated});
    op.mixed_dtype_bytes = casts && x.eager() ? elements * (x.e + 4) : 0;
    op.kernels = casts ? 6 : 2;
    return op;
  }
  return unfused(memory_op(OpId::kAttnRope, OpClass::kElementwise, 2 * elements * x.e,
                           TpSplit::kColumn, {x.tokens(), rotated}),
                 passes.rope, passes.rope_kernels);
}

Op rope_backward(const Op& rope) {
  Op op = memory_backward(rope, 1.0);
  op.mixed_dtype_bytes = rope.mixed_dtype_bytes;  // the gradient's upcast, as the forward's
  return op;
}

std::optional<RepeatKv> repeat_kv(const TransformerDims& x) {
  if (x.fusion == spec::Fusion::kFused || x.code.gqa_kv != spec::GqaKv::kRepeat || x.kv == x.a)
    return std::nullopt;
  // TorchTitan's and Hugging Face's repeat_kv: k and v expanded to one head per query head and
  // copied (x[:, :, :, None, :].expand(...).reshape(...)), a strided copy (TensorIterator's
  // legacy elementwise_kernel), counted as each output element read and written. Its backward
  // sums the copies' gradients back over the repeats (reduce_kernel: the query heads' gradient
  // read, the key/value heads' written). Both at the strided family's rate
  // (bench/eager_kernel_rates.py; in traces/samples/kineto-llama3-8b-8l-h200-eager.json.gz
  // 147 and 89 us a layer of Llama-3 8B at 8192 tokens).
  const int64_t heads = x.a / x.t, kv_heads = x.kv / x.t;
  RepeatKv r;
  r.forward =
      memory_op(OpId::kAttnRepeatKv, OpClass::kElementwise, 2 * x.tokens() * heads * x.d * 2 * x.e,
                TpSplit::kHead, {x.tokens(), heads * x.d});
  r.forward.memory_kernel = spec::MemoryKernel::kStrided;
  r.forward.kernels = 2;  // k and v
  r.backward = r.forward;
  r.backward.bytes = 2 * x.tokens() * (heads + kv_heads) * x.d * x.e;
  if (x.compiled()) {
    // Inductor writes the copies (and sums them back) with contiguous kernels of its own, each
    // reading the kv heads and writing the query heads once (-compile.json.gz: 47 us a layer's
    // forward, 47 backward): generic.
    r.forward.bytes = r.backward.bytes;
    r.forward.memory_kernel = r.backward.memory_kernel = spec::MemoryKernel::kGeneric;
  }
  return r;
}

Op eager_residual_backward(const Op& residual, const spec::TransformerSpec& m,
                           const TransformerDims& x) {
  // Autograd's backward of `x + branch` where x also feeds the norm (measured in
  // traces/samples/kineto-llama3-8b-8l-h200-{eager,fsdp2-eager}.json.gz, two a layer): the
  // stream's two gradients summed (an add of the stream's dtype: 3 passes); under autocast the
  // branch's gradient cast from the fp32 stream to 16 bits (4 + e, vectorized); with dropout
  // the mask applied to it (2e + 1).
  const int64_t elements = x.norm_tokens() * x.h;
  const int64_t r = x.residual_bytes();
  Op op = residual;
  op.bytes = elements * (3 * r + (x.autocast ? r + x.e : 0) + (m.dropout ? 2 * x.e + 1 : 0));
  op.mixed_dtype_bytes = op.narrow_bytes = op.narrow_blocks = 0;
  op.kernels = 1 + (x.autocast ? 1 : 0) + (m.dropout ? 1 : 0);
  return op;
}

SortedEmbeddingBackward sorted_embedding_backward(const TransformerDims& x, int64_t table_bytes) {
  SortedEmbeddingBackward out;
  const int64_t T = x.tokens();
  // ATen's embedding_dense_backward_cuda (aten/src/ATen/native/cuda/Embedding.cu, more than 3072
  // indices) and embedding_backward_cuda_kernel (EmbeddingBackwardKernel.cu). The table's
  // gradient is zero-filled (at::zeros: the rank's rows, written once).
  out.fill = memory_op(OpId::kEmbedGradFill, OpClass::kElementwise,
                       x.vocab_shard * x.h * table_bytes, TpSplit::kVocab, {x.vocab_shard, x.h});
  // The token ids are radix-sorted with their positions (cub::DeviceRadixSort::SortPairs over all
  // 64 bits: 8 onesweep passes of 8-byte keys and values, read and written), then each run of a
  // token's rows is summed into fp32 partials (compute_grad_weight) and the partials into the
  // table (sum_and_scatter). Their time goes with the elements, not the bytes: fp32 and bf16
  // gradients took the same 525-531 us for 8192 x 4096 (K2, K4), so the sums are counted as 16
  // bytes an element (the fp32 row read, the partial written and read, the row written) at the
  // family's rate (MemoryKernel::kEmbeddingBackward). Every token counted distinct, as the
  // traces' uniformly drawn ids nearly are (real text repeats tokens: fewer, longer runs). The
  // sort of 8192 keys ran at one SM's bandwidth (52-60 us for 2.1 MB in K1, K2, K4): one
  // block's per 8192 keys.
  const int64_t sort_bytes = 8 * 32 * T;
  out.sums = memory_op(OpId::kEmbedLookup, OpClass::kEmbedding, 16 * T * x.h + sort_bytes,
                       TpSplit::kVocab, {T, x.h});
  out.sums.memory_kernel = spec::MemoryKernel::kEmbeddingBackward;
  out.sums.narrow_bytes = sort_bytes;
  out.sums.narrow_blocks = (T + 8191) / 8192;
  out.sums.kernels = 12;  // histogram, exclusive sum, 8 onesweep passes, the two sums
  return out;
}

int64_t projection_inputs(const TransformerDims& x, bool mlp, int64_t gate) {
  if (x.code.projections != spec::Projections::kSeparate) return 1;
  return mlp ? gate : 3;
}

std::optional<Op> input_grad_sum(OpId id, const TransformerDims& x, int64_t inputs) {
  if (!x.eager() || inputs < 2) return std::nullopt;
  // Separate projections read the norm's output once each, so autograd sums their input
  // gradients: inputs - 1 in-place adds (3 passes) of the gradient's dtype (fp32 under autocast,
  // where each comes through its cast's backward; before the tp reduce otherwise). Measured: 3 a
  // Llama layer (q, k, v; gate, up) in the traces above.
  const int64_t elements = (x.autocast ? x.norm_tokens() : x.tokens()) * x.h;
  const int64_t g = x.autocast ? 4 : x.e;
  Op op = memory_op(id, OpClass::kElementwise, (inputs - 1) * 3 * elements * g,
                    x.autocast ? x.norm_split() : TpSplit::kReplicated, {elements});
  op.kernels = static_cast<int>(inputs - 1);
  return op;
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

Op norm_backward(const Op& fwd, const FusionPasses& passes) {
  if (fwd.memory_kernel == spec::MemoryKernel::kNativeNorm) {
    // ATen's backward (layer_norm_kernel.cu): layer_norm_grad_input_kernel reads dy and x and
    // writes dx (3 passes), then GammaBetaBackward reads dy and x again (2 passes, the forward's
    // bytes) in one thread block per 32 columns (grid [h / 32] in the PyTorch 2.11 traces K1 and
    // K4): 5 passes against the forward's 2.
    Op op = memory_backward(fwd, 2.5);
    op.kernels = 2;
    op.narrow_bytes = fwd.bytes;
    op.narrow_blocks = (fwd.shape.at(1) + 31) / 32;
    return op;
  }
  Op op = memory_backward(fwd, 1.5);
  op.kernels = passes.norm_kernels;
  return op;
}

}  // namespace sextant::models
