// The parts of a transformer's lowering (models/src/transformer_lowering.cpp) that live in
// files of their own: the dimensions one rank works on, the fusion level's passes, the attention
// core (attention_lowering.cpp), a mixture of experts' MLP (moe_lowering.cpp) and a block on a
// 3D tensor grid (grid_lowering.cpp). Private to models/.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lowering_ops.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/per_op_block.hpp"
#include "sextant/models/per_op_head.hpp"
#include "sextant/spec/expert_parallel.hpp"
#include "sextant/spec/model_spec.hpp"

namespace sextant::models {

struct TransformerDims {
  // s: the tokens of each sequence on this rank (the sequence over cp under context parallelism).
  int64_t b, s, h, a, kv, d, f, V, t, e;
  int64_t cp;  // ranks splitting each sequence (spec/context_parallel.hpp)
  spec::ContextAlgorithm cp_algorithm;
  int64_t ep;           // ranks splitting the routed experts (spec/expert_parallel.hpp)
  int64_t vocab_shard;  // rows of the vocabulary a tp rank holds, padding included
  bool sp;
  spec::AttentionKernel attention;
  spec::Fusion fusion;
  spec::CrossEntropy cross_entropy;
  // torch.autocast over fp32 parameters (PyTorch's autocast op lists: matmuls run in 16 bits,
  // layer_norm and the ops that take fp32 inputs in fp32): the residual stream and the norms are
  // fp32, a GEMM input coming from them is cast first, every forward casts the weights.
  bool autocast;
  bool fp8;               // dense linears' GEMMs in fp8 (Transformer Engine): fp8_casts
  bool fused_rms_norm;    // LoweringOptions::fused_rms_norm
  bool bias_grad_kernel;  // LoweringOptions::bias_grad_kernel
  spec::ModelCode code;   // LoweringOptions::code
  spec::SelectiveRecompute selective;  // what selective recompute re-runs and keeps
  int64_t residual_bytes() const { return autocast ? 4 : e; }  // per residual-stream element
  bool eager() const { return fusion == spec::Fusion::kEager; }
  bool compiled() const { return fusion == spec::Fusion::kCompiled; }
  int64_t tokens() const { return b * s; }
  // Tokens handled by a replicated-or-sequence-split op on one rank.
  int64_t norm_tokens() const { return sp ? tokens() / t : tokens(); }
  TpSplit norm_split() const { return sp ? TpSplit::kSequence : TpSplit::kReplicated; }
  // The rank's keys and values (its tokens, its tp share of the key/value heads).
  int64_t kv_bytes() const { return 2 * tokens() * kv / t * d * e; }
};

// How a stack's fusion level runs the memory-bound ops of a block, as multiples of the bytes of
// the one fused kernel (Megatron/Transformer Engine/apex) and launches, from the kernels each
// implementation calls:
// - eager RMSNorm (Llama reference and TorchTitan's `_norm(x.float()).type_as(x) * weight`):
//   cast to fp32, pow, mean, add+rsqrt, multiply, cast back, multiply by the weight = 36 bytes per
//   element against the fused kernel's 4 (bf16 read + write): 9x, 7 kernels.
// - eager LayerNorm: PyTorch's native kernel, as fused (its backward is two kernels).
// - eager SwiGLU: silu(gate) then gate * up: 5 element passes against the fused kernel's 3.
// - eager rotary embedding, Hugging Face's rotate-half arithmetic: ~4x, 4 kernels (TorchTitan's
//   complex one, Stack::code.rope, is priced by rope_op itself).
// - eager unfused softmax: scale, mask fill and softmax as three kernels.
// - eager residual with dropout: dropout kernel, then add (5 passes against 3).
// - compiled (Inductor; llm.c's fused_residual_forward): each norm is fused into the residual
//   add before it, so it writes its output without reading the residual stream again.
// Autocast's extra kernels: the cast of an fp32 activation to 16 bits in front of a GEMM (read 4,
// write e bytes per element), and the cast of a layer's fp32 weights in every forward.
struct FusionPasses {
  double norm = 1, act = 1, rope = 1, softmax = 1, residual = 1;
  spec::MemoryKernel norm_kernel = spec::MemoryKernel::kGeneric;  // eager: ATen's native kernels
  int norm_kernels = 1, act_kernels = 1, rope_kernels = 1, softmax_kernels = 1,
      residual_kernels = 1;
  // The activation's backward as a multiple of its (unfused) forward's bytes, and its kernels;
  // 0: the fused kernel's (read x and dy, write dx).
  double act_backward = 0;
  int act_backward_kernels = 0;
  // Bytes per element of the activation's input that its implementation keeps for backward
  // (0: the fused kernel's, its 16-bit input).
  int64_t act_saved = 0;
};

FusionPasses fusion_passes(const spec::TransformerSpec& m, const TransformerDims& x);

// A plan's per-op splits (LoweringOptions::per_op) applied to a dense block lowered for the
// uniform layout (per_op_lowering.cpp).
void apply_op_splits(Layer& block, const TransformerDims& x, const PerOpBlock& per_op);
// The same for the output layer (per_op_head.hpp): the logits GEMM on its new block, the
// cross-entropy where the logits are (vocabulary-parallel over the axes splitting V), the walk's
// reshards for the stream's gathers and reduces, the weights' new shard.
void apply_head_splits(Layer& head, const TransformerDims& x, const PerOpHead& per_op);

// The bias gradient of a column-parallel linear as a kernel of its own (Stack::bias_grad_kernel):
// its `tokens` x `columns` output gradient of `e` bytes summed over the tokens into an fp32
// gradient. The row-parallel linears' (proj, fc2) are counted in their residual's backward, as
// Megatron's fused bias-dropout-add computes them.
Op bias_grad_op(OpId name, int64_t tokens, int64_t columns, int64_t e);

// The same for a block's linear (`tokens` x `columns` output gradient), as the stack runs it.
Op block_bias_grad(OpId name, const TransformerDims& x, int64_t tokens, int64_t columns);

// A block's norm over the rank's norm tokens, as the stack runs it (ATen's native kernel in eager
// PyTorch, unless an eager RMSNorm is composed of primitives).
Op norm_op(OpId name, const TransformerDims& x, const FusionPasses& passes);

// A norm's backward: its forward's passes over 1.5x the bytes; ATen's native backward is two
// kernels over 2.5x (norm_backward's comment in transformer_fusion.cpp).
Op norm_backward(const Op& fwd, const FusionPasses& passes);

// A pointwise op beside a norm as a compiled stack runs it: inside the norm's kernel, so counted
// in the norm class (transformer_fusion.cpp); as it is under any other fusion level.
Op beside_norm(Op op, const TransformerDims& x);

// Bias, dropout and residual add of a block half, fused as Megatron does: read the residual and
// the 16-bit branch output (and the dropout mask), write the residual; a stack's fusion level
// scales it (FusionPasses::residual).
Op residual_op(OpId name, const spec::TransformerSpec& m, const TransformerDims& x,
               const FusionPasses& passes);

// Rotary embeddings on a rank's x.t-th share of the heads: q and k rotated in place, read and
// written once each.
Op rope_op(const TransformerDims& x, const FusionPasses& passes);

// Its backward: the same kernels on the gradient (eager complex rotation: the same casts).
Op rope_backward(const Op& rope);

// The copy of the keys and values to every query head (Stack::code.gqa_kv repeat; eager or
// compiled code), and its backward, which sums them back; none under fused kernels or when the
// stack's attention reads the shared heads.
struct RepeatKv {
  Op forward, backward;
};
std::optional<RepeatKv> repeat_kv(const TransformerDims& x);

// The backward of a residual in eager PyTorch: the stream's gradients summed, the branch's cast
// and dropout mask (transformer_fusion.cpp).
Op eager_residual_backward(const Op& residual, const spec::TransformerSpec& m,
                           const TransformerDims& x);

// Eager PyTorch's embedding backward (Stack::code.embedding_backward sorted), for a table of
// `table_bytes` an element: the zero-filled gradient (elementwise) and the sort and segment sums
// (the embedding's class).
struct SortedEmbeddingBackward {
  Op fill, sums;
};
SortedEmbeddingBackward sorted_embedding_backward(const TransformerDims& x, int64_t table_bytes);

// The GEMMs reading a norm's output: 1 under fused projections; 3 (q, k, v) or `gate` (gate, up)
// under separate ones (Stack::code.projections).
int64_t projection_inputs(const TransformerDims& x, bool mlp, int64_t gate);

// Autograd's sum of the input gradients of `inputs` eager GEMMs reading one tensor (none when one
// reads it, or when the stack fuses).
std::optional<Op> input_grad_sum(OpId id, const TransformerDims& x, int64_t inputs);

// The activation's backward (`act` its forward, `gate` 2 for SwiGLU's gate and up halves): the
// stack's composed kernels' bytes, or the fused kernel's (reads x and dy, writes dx).
Op activation_backward(const Op& act, int64_t gate, const FusionPasses& passes);

// The cast of `elements` fp32 values to `e`-byte ones (autocast, above), and its backward.
Op autocast_cast(OpId name, int64_t elements, int64_t e, TpSplit split);
Op autocast_cast_backward(const Op& cast, const TransformerDims& x);

// Eager PyTorch's cross-entropy over fp32 logits (torchtitan components/loss.py and Hugging
// Face's ForCausalLMLoss: F.cross_entropy(logits.float(), labels)), for `tokens` x `vocab` logits
// of `e` bytes: the log_softmax and nll_loss kernels (loss class; transformer_fusion.cpp gives
// the passes), and the elementwise kernels around them, which a profiler classes apart: the
// upcast in forward (none for fp32 logits), nll_loss's zero-filled gradient and the cast back in
// backward. `softmax_backward_bytes`: log_softmax's backward.
Op eager_cross_entropy(int64_t tokens, int64_t vocab);
struct EagerLossCast {
  std::optional<Op> forward;
  Op backward;
  int64_t softmax_backward_bytes = 0;
};
EagerLossCast eager_loss_cast(int64_t tokens, int64_t vocab, int64_t e);

// Transformer Engine's fp8 casts around a block half's linears (TE 1.8, the modules Megatron-Core
// builds: TELayerNormColumnParallelLinear for qkv and fc1, TERowParallelLinear for proj and fc2;
// NVIDIA/TransformerEngine transformer_engine/pytorch/module/{linear,layernorm_linear}.py):
// - forward: the row-parallel GEMM's 16-bit input is cast to fp8 with its transpose in one kernel
//   (fp8_cast_transpose_fused: read e, write 1 + 1 bytes an element); the column-parallel GEMM's
//   input comes out of the fused norm already in fp8 (rmsnorm_fwd_fp8), at no extra pass;
// - backward: every GEMM's output gradient is cast to fp8 E5M2 with its transpose (read e, write
//   2), and the norm's fp8 output is transposed for the weight gradient (read 1, write 1).
// `row_input`: elements of the row-parallel GEMM's input; `column_input`: of the column-parallel
// GEMM's input; `outputs`: of the two GEMMs' outputs together. Weights are cast once per step
// (is_first_microbatch), amax and scales updated by one kernel a micro-batch: not counted.
// These kernels run at a rate of their own (MemoryKernel::kCastTranspose), except in compiled code,
// where Inductor generates the casts (torchao's float8 under torch.compile).
struct Fp8Casts {
  Op forward;
  Op backward;
};
Fp8Casts fp8_casts(OpId name, int64_t row_input, int64_t column_input, int64_t outputs,
                   const TransformerDims& x);

// The attention core of one rank for one micro-batch: unfused (scores GEMM, softmax, dropout,
// context GEMM, keeping the s x s probabilities) or one fused flash kernel. Appends the forward
// ops to `fw`, returns the backward ops in execution order and the bytes kept for backward.
struct AttentionCore {
  std::vector<Op> backward;
  int64_t saved_bytes = 0;  // kept for backward per rank (recomputed by selective recompute)
};
AttentionCore attention_core(const spec::TransformerSpec& m, const TransformerDims& x,
                             const FusionPasses& passes, std::vector<Op>& fw);

// The MLP of a mixture-of-experts block on one rank (Megatron-LM's MoE layer with its all-to-all
// token dispatcher, experts split over tp as the dense MLP is): the router's GEMM and top-k over
// the tokens the rank routes (its s/tp share under tp), each token copied to its top_k experts
// (permute), under expert parallelism the copies sent to their experts' ranks (dispatch
// all-to-all), the experts' two GEMMs over the tokens each takes (grouped: one product per expert),
// the results sent back (combine), the copies weighted and summed back (unpermute), and the shared
// experts beside them as a dense MLP. Appends the forward ops to `fw`; returns the backward ops (in
// execution order), the parameters and the activation bytes kept.
struct MoeMlp {
  std::vector<Op> backward;
  int64_t params = 0, params_total = 0;  // on one tp rank; of the layer's MLP
  int64_t routed_total = 0;              // of the routed experts
  int64_t expert = 0;                    // of the routed experts on this rank
  int64_t sp_partial = 0;                // whose gradients are partial sums over tp
  int64_t weight_elements = 0;           // its GEMM weights on one tp rank (autocast casts them)
  std::vector<WeightMatrix> matrices;    // its weights in the dense buckets (Layer::matrices)
  int64_t saved_split = 0;               // kept bytes split over tp (the whole layer's)
  int64_t saved_replicated = 0;          // kept bytes every tp rank holds whole
};
MoeMlp moe_mlp(const spec::TransformerSpec& m, const TransformerDims& x, const FusionPasses& passes,
               std::vector<Op>& fw);

// spec::moe_dispatches_over_tp on this rank's split.
inline bool dispatches_over_tp(const TransformerDims& x) {
  return spec::moe_dispatches_over_tp(x.t, x.ep);
}

// A transformer block on a 3D tensor grid (spec/tensor_grid.hpp; grid_lowering.cpp).
Layer grid_block(const spec::TransformerSpec& m, const TransformerDims& x,
                 const spec::TensorGrid& g);

}  // namespace sextant::models
