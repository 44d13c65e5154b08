// Lowering of transformers (Megatron-LM layout), MLPs and CNNs into per-rank ops.
//
// Transformer block ops and the activations they keep follow Korthikanti et al., "Reducing
// Activation Recomputation in Large Transformer Models" (2022), §4: with 16-bit activations a
// block keeps sbh(34 + 5as/h) bytes; 10sbh of them (norm inputs, the inputs of the QKV and FC1
// GEMMs, the two dropout masks) are replicated across tensor-parallel ranks unless sequence
// parallelism splits them; the 5as²b bytes of the attention core are what selective recompute
// drops; full recompute keeps only the 2sbh-byte block input.
#include "transformer_lowering.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "model_lowerings.hpp"
#include "sextant/models/vocabulary.hpp"
#include "sextant/spec/context_parallel.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/expert_parallel.hpp"
#include "sextant/spec/tensor_grid.hpp"

namespace sextant::models {

namespace {

// The collective that joins the outputs of a row-parallel (or vocab-parallel) op.
void add_tp_reduce(std::vector<Op>& ops, const TransformerDims& x, const PartCollectives& part) {
  if (x.t == 1) return;
  int64_t bytes = x.tokens() * x.h * x.e;
  if (x.sp) {
    ops.push_back(comm_op(part.reduce_scatter, CollectiveKind::kReduceScatter, bytes));
  } else {
    ops.push_back(comm_op(part.all_reduce, CollectiveKind::kAllReduce, bytes));
  }
}

// The all-gather in front of a column-parallel op under sequence parallelism.
void add_sp_gather(std::vector<Op>& ops, const TransformerDims& x, const PartCollectives& part) {
  if (x.t == 1 || !x.sp) return;
  ops.push_back(comm_op(part.all_gather, CollectiveKind::kAllGather, x.tokens() * x.h * x.e));
}

// TorchTitan's per-op selective activation checkpointing (torchtitan/distributed/
// activation_checkpoint.py, _custom_policy with _save_list): of a Llama block's seven matmuls
// (wq, wk, wv, wo, w1, w3, w2, in that order) the odd ones' outputs are saved (wq, wv, w1, w2),
// as are the SDPA kernel's (output and log-sum-exp) and a reduce-scatter's; every other op is
// recomputed from the block's input before the backward. What it keeps per rank: the block input,
// those outputs; what it re-runs: the norms, rotary, residuals and activation, wk, wo and w3, and
// the forward's other collectives. `ffn`: the rank's FFN width.
void save_matmuls_policy(Layer& layer, const TransformerDims& x, int64_t ffn) {
  const int64_t T = x.tokens(), e = x.e;
  const int64_t input = x.norm_tokens() * x.h * x.residual_bytes();
  const int64_t wq = T * x.h / x.t * e, wv = T * x.kv * x.d / x.t * e, w1 = T * ffn * e;
  const int64_t w2 = x.norm_tokens() * x.h * e;  // after its reduce (a saved reduce-scatter's)
  const int64_t sdpa = T * x.h / x.t * e + T * (x.a / x.t) * 4;  // output and fp32 log-sum-exp
  layer.saved_bytes_selective = input + wq + wv + w1 + w2 + sdpa;
  std::vector<Op>& again = layer.selective_forward;
  again.clear();
  for (const Op& op : layer.forward) {
    if (op.in_core()) continue;
    if (op.is_comm() && op.collective == CollectiveKind::kReduceScatter) continue;
    if (op.id == OpId::kAttnQkv) {
      again.push_back(gemm(OpId::kAttnQkv, T, x.kv * x.d / x.t, x.h, e, TpSplit::kColumn));  // wk
    } else if (op.id == OpId::kMlpFc1) {
      again.push_back(gemm(OpId::kMlpFc1, T, ffn, x.h, e, TpSplit::kColumn));  // w3
    } else if (op.id != OpId::kMlpFc2) {
      again.push_back(op);
    }
  }
}

// The forward ops of a block that its backward, parameters and kept activations refer to.
struct BlockOps {
  FusionPasses passes;
  int64_t qkv_out = 0, gate = 1, ffn = 0;
  int64_t attn_inputs = 1, mlp_inputs = 1;  // GEMMs reading each norm's output
  std::optional<MoeMlp> moe;
  bool own_mlp_collectives = false;  // a MoE dispatcher over tp gathers and scatters its rows
  bool rotary = false;
  Op weight_cast, attn_norm, attn_cast, qkv, rope, proj, attn_res, mlp_norm, mlp_cast, fc1, act,
      fc2, mlp_res;
  std::optional<RepeatKv> repeat;
  AttentionCore core;
  Fp8Casts attn_fp8, mlp_fp8;
};

// A block's forward ops in execution order, appended to `fw`.
BlockOps block_forward(const spec::TransformerSpec& m, const TransformerDims& x, bool moe_layer,
                       std::vector<Op>& fw) {
  BlockOps b;
  const int64_t T = x.tokens(), Tn = x.norm_tokens(), e = x.e;
  b.passes = fusion_passes(m, x);
  b.qkv_out = (x.h + 2 * x.kv * x.d) / x.t;
  b.gate = m.activation == spec::Activation::kSwiglu ? 2 : 1;
  b.ffn = x.f / x.t;
  // (The MoE MLP's ops are built where they run; their weights are counted here first.)
  std::vector<Op> moe_forward;
  if (moe_layer) b.moe = moe_mlp(m, x, b.passes, moe_forward);
  b.own_mlp_collectives = b.moe && dispatches_over_tp(x);
  // Autocast casts each fp32 weight of the layer's GEMMs to 16 bits in every forward (6 bytes a
  // parameter at fp32 -> bf16) and each 16-bit weight gradient back to fp32 in backward.
  const int64_t weight_elements =
      (x.h * (x.h + 2 * x.kv * x.d) + x.h * x.h) / x.t +
      (b.moe ? b.moe->weight_elements : (x.h * b.gate * x.f + x.f * x.h) / x.t);
  b.weight_cast = autocast_cast(OpId::kAutocastWeights, weight_elements, e, TpSplit::kColumn);
  b.weight_cast.kernels = 4;
  if (x.autocast) fw.push_back(b.weight_cast);
  b.attn_norm = norm_op(OpId::kAttnNorm, x, b.passes);
  fw.push_back(b.attn_norm);
  // Eager autocast casts a GEMM's input in every GEMM that reads it (autocast_mode.cpp
  // cached_cast caches only leaf tensors, the weights): once per separate projection.
  b.attn_inputs = projection_inputs(x, false, b.gate);
  b.mlp_inputs = b.moe ? 1 : projection_inputs(x, true, b.gate);
  const int64_t attn_casts = x.eager() ? b.attn_inputs : 1;
  const int64_t mlp_casts = x.eager() ? b.mlp_inputs : 1;
  b.attn_cast =
      beside_norm(autocast_cast(OpId::kAttnCast, attn_casts * Tn * x.h, e, x.norm_split()), x);
  b.attn_cast.kernels = static_cast<int>(attn_casts);
  if (x.autocast) fw.push_back(b.attn_cast);
  add_sp_gather(fw, x, kAttnCollectives);
  b.qkv = gemm(OpId::kAttnQkv, T, b.qkv_out, x.h, e, TpSplit::kColumn);
  fw.push_back(b.qkv);
  b.rotary = m.position_embedding == spec::PositionEmbedding::kRope;
  b.rope = rope_op(x, b.passes);
  if (b.rotary) fw.push_back(b.rope);
  b.repeat = repeat_kv(x);
  if (b.repeat) fw.push_back(b.repeat->forward);
  b.core = attention_core(m, x, b.passes, fw);
  b.proj = gemm(OpId::kAttnProj, T, x.h, x.h / x.t, e, TpSplit::kRow);
  b.attn_fp8 = fp8_casts(OpId::kAttnFp8Cast, T * x.h / x.t, T * x.h, T * (b.qkv_out + x.h), x);
  if (x.fp8) fw.push_back(b.attn_fp8.forward);
  fw.push_back(b.proj);
  add_tp_reduce(fw, x, kAttnCollectives);
  b.attn_res = beside_norm(residual_op(OpId::kAttnResidual, m, x, b.passes), x);
  fw.push_back(b.attn_res);
  b.mlp_norm = norm_op(OpId::kMlpNorm, x, b.passes);
  fw.push_back(b.mlp_norm);
  b.mlp_cast =
      beside_norm(autocast_cast(OpId::kMlpCast, mlp_casts * Tn * x.h, e, x.norm_split()), x);
  b.mlp_cast.kernels = static_cast<int>(mlp_casts);
  if (x.autocast) fw.push_back(b.mlp_cast);
  if (!b.own_mlp_collectives) add_sp_gather(fw, x, kMlpCollectives);
  b.fc1 = gemm(OpId::kMlpFc1, T, b.gate * b.ffn, x.h, e, TpSplit::kColumn);
  b.act = unfused(memory_op(OpId::kMlpAct, OpClass::kElementwise, (b.gate + 1) * T * b.ffn * e,
                            TpSplit::kColumn, {T, b.gate * b.ffn}),
                  b.passes.act, b.passes.act_kernels);
  b.fc2 = gemm(OpId::kMlpFc2, T, x.h, b.ffn, e, TpSplit::kRow);
  b.mlp_fp8 = fp8_casts(OpId::kMlpFp8Cast, T * b.ffn, T * x.h, T * (b.gate * b.ffn + x.h), x);
  if (b.moe) {
    fw.insert(fw.end(), moe_forward.begin(), moe_forward.end());
  } else {
    fw.insert(fw.end(), {b.fc1, b.act});
    if (x.fp8) fw.push_back(b.mlp_fp8.forward);
    fw.push_back(b.fc2);
  }
  if (!b.own_mlp_collectives) add_tp_reduce(fw, x, kMlpCollectives);
  b.mlp_res = residual_op(OpId::kMlpResidual, m, x, b.passes);
  fw.push_back(b.mlp_res);
  return b;
}

// A norm's output gradient coming back through the GEMMs that read it: their input gradients
// summed (separate projections), the tp reduce of the partial sums, and under autocast the casts'
// backward (the sum then in fp32, after them).
void norm_input_backward(const TransformerDims& x, OpId sum_id, int64_t inputs, const Op& cast,
                         bool tp_reduce, const PartCollectives& part, std::vector<Op>& bw) {
  const std::optional<Op> sum = input_grad_sum(sum_id, x, inputs);
  if (sum && !x.autocast) bw.push_back(*sum);
  if (tp_reduce) add_tp_reduce(bw, x, part);
  if (x.autocast) bw.push_back(autocast_cast_backward(cast, x));
  if (sum && x.autocast) bw.push_back(*sum);
}

// A block's backward, in execution order. Under tensor parallelism the gradient entering a
// column-parallel GEMM's input is a partial sum: all-reduced (or reduce-scattered with sequence
// parallelism); the row-parallel GEMM's output gradient is all-gathered with sequence
// parallelism (the conjugates of the forward collectives, Megatron's f and g operators).
void block_backward(const spec::TransformerSpec& m, const TransformerDims& x, const BlockOps& b,
                    std::vector<Op>& bw) {
  const int64_t T = x.tokens(), Tn = x.norm_tokens();
  const bool bias_grads = m.bias && x.bias_grad_kernel;
  // Eager PyTorch sums the row-parallel linears' bias gradients too (fused stacks count them in
  // the residual's backward, as Megatron's bias-dropout-add computes them).
  const bool eager_bias = bias_grads && x.eager();
  // A residual's backward (bias gradient, and the branch's gradient added to the stream's) runs
  // once the branch's norm has given its gradient back, as the executor runs it.
  const auto residual_backward = [&](const Op& residual) {
    return x.eager() ? eager_residual_backward(residual, m, x)
                     : memory_backward(residual, 2.0 / 3.0);
  };
  if (!b.own_mlp_collectives) add_sp_gather(bw, x, kMlpCollectives);
  if (b.moe) {
    bw.insert(bw.end(), b.moe->backward.begin(), b.moe->backward.end());
  } else {
    if (x.fp8) bw.push_back(b.mlp_fp8.backward);
    if (eager_bias) bw.push_back(block_bias_grad(OpId::kMlpFc2BiasGrad, x, Tn, x.h));
    bw.push_back(gemm_backward(b.fc2));
    bw.push_back(activation_backward(b.act, b.gate, b.passes));
    bw.push_back(gemm_backward(b.fc1));
    if (bias_grads) bw.push_back(block_bias_grad(OpId::kMlpFc1BiasGrad, x, T, b.gate * b.ffn));
  }
  norm_input_backward(x, OpId::kMlpInputGradSum, b.mlp_inputs, b.mlp_cast, !b.own_mlp_collectives,
                      kMlpCollectives, bw);
  bw.push_back(norm_backward(b.mlp_norm, b.passes));
  bw.push_back(beside_norm(residual_backward(b.mlp_res), x));
  add_sp_gather(bw, x, kAttnCollectives);
  if (x.fp8) bw.push_back(b.attn_fp8.backward);
  if (eager_bias) bw.push_back(block_bias_grad(OpId::kAttnProjBiasGrad, x, Tn, x.h));
  bw.push_back(gemm_backward(b.proj));
  bw.insert(bw.end(), b.core.backward.begin(), b.core.backward.end());
  if (b.repeat) bw.push_back(b.repeat->backward);     // the repeats summed back
  if (b.rotary) bw.push_back(rope_backward(b.rope));  // the inverse rotation of dq and dk
  bw.push_back(gemm_backward(b.qkv));
  if (bias_grads) bw.push_back(block_bias_grad(OpId::kAttnQkvBiasGrad, x, T, b.qkv_out));
  norm_input_backward(x, OpId::kAttnInputGradSum, b.attn_inputs, b.attn_cast, true,
                      kAttnCollectives, bw);
  bw.push_back(norm_backward(b.attn_norm, b.passes));
  bw.push_back(residual_backward(b.attn_res));
  if (x.autocast) bw.push_back(autocast_cast_backward(b.weight_cast, x));
}

// Parameters. Column-parallel weights and biases are split; row-parallel biases and norms are
// replicated on every tp rank.
void block_parameters(const spec::TransformerSpec& m, const TransformerDims& x, const BlockOps& b,
                      Layer& layer) {
  const int64_t gate = b.gate;
  const std::optional<MoeMlp>& moe = b.moe;
  const int64_t norm_params = m.norm == spec::Norm::kLayerNorm ? 2 * x.h : x.h;
  const int64_t qkv_full = x.h + 2 * x.kv * x.d;
  const int64_t bias = m.bias ? 1 : 0;
  const int64_t attention_total = x.h * qkv_full + bias * qkv_full + x.h * x.h + bias * x.h;
  const int64_t attention_rank =
      (x.h * qkv_full + bias * qkv_full) / x.t + x.h * x.h / x.t + bias * x.h;
  layer.params_total =
      attention_total + 2 * norm_params +
      (moe ? moe->params_total : x.h * gate * x.f + bias * gate * x.f + x.f * x.h + bias * x.h);
  layer.params =
      attention_rank + 2 * norm_params +
      (moe ? moe->params
           : (x.h * gate * x.f + bias * gate * x.f) / x.t + x.f * x.h / x.t + bias * x.h);
  if (moe) {
    layer.routed_expert_params_total = moe->routed_total;
    layer.expert_params = moe->expert;
  }
  // [rows, cols] as the executor holds them (exec/src/gpt/gpt_params.cpp)
  layer.matrices = {{x.h, qkv_full / x.t}, {x.h / x.t, x.h}};
  if (moe) {
    layer.matrices.insert(layer.matrices.end(), moe->matrices.begin(), moe->matrices.end());
  } else {
    layer.matrices.insert(layer.matrices.end(), {{x.h, gate * x.f / x.t}, {x.f / x.t, x.h}});
  }
  if (x.sp)
    layer.sp_partial_params = 2 * norm_params + 2 * bias * x.h + (moe ? moe->sp_partial : 0);
}

// Activations kept for backward (Korthikanti et al. 2022, §4.1), per rank, counted in elements
// times bytes per element (masks are one byte). With 16-bit activations, no GQA, ffn = 4h and
// unfused attention these add up to the paper's sbh(34 + 5as/h); a flash kernel keeps the
// log-sum-exp instead of the 5as^2b bytes of the attention core.
void block_activations(const spec::TransformerSpec& m, const TransformerDims& x, const BlockOps& b,
                       Layer& layer) {
  const int64_t T = x.tokens(), e = x.e;
  const int64_t sbh = T * x.h;
  const int64_t mask = m.dropout ? 1 : 0;
  // Under fp8 GEMMs Transformer Engine keeps each dense linear's input as the fp8 copy its GEMMs
  // read (TE 1.8 linear.py / layernorm_linear.py save the fp8 cast or its transpose): 1 byte.
  const int64_t gemm_input = x.fp8 ? 1 : e;
  // Split by sequence parallelism, replicated by plain tensor parallelism: the inputs of the two
  // norms, of the QKV GEMM and of FC1 (4sbh elements), and the two output dropout masks.
  // (Under autocast the two norm inputs are fp32; the GEMM inputs are the 16-bit casts.)
  const int64_t replicated = 2 * sbh * x.residual_bytes() + 2 * sbh * gemm_input + 2 * mask * sbh;
  // Split by tensor parallelism: Q, K and V (K and V are kv/a of Q under grouped-query
  // attention), the attention projection input, the activation input and the FC2 input.
  // An eager composed activation keeps its intermediates instead of its input (act_saved).
  // A MoE layer keeps its experts' instead (moe_mlp), some of them on every tp rank whole.
  const int64_t act_input =
      b.passes.act_saved > 0 ? T * x.f * b.passes.act_saved : b.gate * T * x.f * e;
  const int64_t mlp_split = b.moe ? b.moe->saved_split : act_input + T * x.f * gemm_input;
  // Eager GQA's repeat_kv hands SDPA (which keeps its inputs) the keys and values copied to
  // every query head.
  const int64_t kv_heads = b.repeat ? x.a : x.kv;
  const int64_t split = sbh * e + 2 * sbh * kv_heads / x.a * e + sbh * gemm_input + mlp_split;
  const int64_t rep_per_rank =
      (x.sp ? replicated / x.t : replicated) + (b.moe ? b.moe->saved_replicated : 0);
  layer.saved_bytes = rep_per_rank + split / x.t + b.core.saved_bytes;
  layer.saved_bytes_selective = rep_per_rank + split / x.t;
  layer.saved_bytes_full = x.sp ? sbh * e / x.t : sbh * e;
  layer.output_bytes = x.norm_tokens() * x.h * e;
  if (x.selective == spec::SelectiveRecompute::kSaveMatmuls && !b.moe)
    save_matmuls_policy(layer, x, b.ffn);
}

Layer transformer_block(const spec::TransformerSpec& m, const TransformerDims& x, int64_t index,
                        bool moe_layer) {
  Layer layer;
  layer.name = fmt::format("block{}", index);
  layer.kind = LayerKind::kBlock;
  const BlockOps ops = block_forward(m, x, moe_layer, layer.forward);
  block_backward(m, x, ops, layer.backward);
  block_parameters(m, x, ops, layer);
  block_activations(m, x, ops, layer);
  return layer;
}

Layer transformer_embedding(const spec::TransformerSpec& m, const TransformerDims& x) {
  Layer layer;
  layer.name = "embedding";
  layer.kind = LayerKind::kEmbedding;
  const int64_t T = x.tokens();
  const int64_t e = x.e;
  // Vocabulary-parallel lookup: each rank gathers the rows it owns, zeros elsewhere.
  const int64_t r = x.residual_bytes();  // fp32 tables under autocast
  Op lookup = memory_op(OpId::kEmbedLookup, OpClass::kEmbedding, 2 * T * x.h * r, TpSplit::kVocab,
                        {T, x.h});
  layer.forward.push_back(lookup);
  add_tp_reduce(layer.forward, x, kEmbedCollectives);
  bool has_positions = m.position_embedding == spec::PositionEmbedding::kLearned;
  Op pos;
  if (has_positions || m.type_vocab > 0) {
    pos = memory_op(OpId::kEmbedPosition, OpClass::kElementwise, 3 * x.norm_tokens() * x.h * r,
                    x.norm_split(), {x.norm_tokens(), x.h});
    layer.forward.push_back(pos);
  }
  Op enorm;
  if (m.architecture == spec::Architecture::kEncoder) {
    enorm = memory_op(OpId::kEmbedNorm, OpClass::kNorm, 2 * x.norm_tokens() * x.h * e,
                      x.norm_split(), {x.norm_tokens(), x.h});
    layer.forward.push_back(enorm);
  }
  if (m.architecture == spec::Architecture::kEncoder) {
    layer.backward.push_back(memory_backward(enorm, 1.5));
  }
  if (has_positions || m.type_vocab > 0) layer.backward.push_back(memory_backward(pos, 2.0 / 3.0));
  add_sp_gather(layer.backward, x, kEmbedCollectives);
  if (x.code.embedding_backward == spec::EmbeddingBackward::kSorted) {
    const SortedEmbeddingBackward sorted = sorted_embedding_backward(x, r);
    layer.backward.insert(layer.backward.end(), {sorted.fill, sorted.sums});
  } else {
    layer.backward.push_back(memory_backward(lookup, 1.0));  // scatter-add into the table
  }

  const int64_t norm_params = m.norm == spec::Norm::kLayerNorm ? 2 * x.h : x.h;
  int64_t shared = (has_positions ? m.max_positions * x.h : 0) + m.type_vocab * x.h +
                   (m.architecture == spec::Architecture::kEncoder ? norm_params : 0);
  layer.params_total = x.V * x.h + shared;
  layer.params = x.vocab_shard * x.h + shared;
  if (x.sp) layer.sp_partial_params = shared;
  layer.matrices.push_back({x.vocab_shard, x.h});
  if (has_positions) layer.matrices.push_back({m.max_positions, x.h});
  if (m.type_vocab > 0) layer.matrices.push_back({m.type_vocab, x.h});
  layer.saved_bytes = layer.saved_bytes_selective = layer.saved_bytes_full =
      m.architecture == spec::Architecture::kEncoder ? x.norm_tokens() * x.h * e : 0;
  layer.output_bytes = x.norm_tokens() * x.h * e;
  return layer;
}

Layer transformer_head(const spec::TransformerSpec& m, const TransformerDims& x) {
  Layer layer;
  layer.name = "head";
  layer.kind = LayerKind::kHead;
  const int64_t T = x.tokens();
  const int64_t e = x.e;
  const int64_t vocab_shard = x.vocab_shard;
  const bool decoder = m.architecture == spec::Architecture::kDecoder;
  const int64_t norm_params = m.norm == spec::Norm::kLayerNorm ? 2 * x.h : x.h;
  const FusionPasses passes = fusion_passes(m, x);
  // Autocast casts the output weights (the embedding table when tied) in every forward and the
  // norm's fp32 output in front of the logits GEMM.
  Op weight_cast = autocast_cast(OpId::kAutocastWeights, vocab_shard * x.h, e, TpSplit::kVocab);
  Op head_cast = autocast_cast(OpId::kHeadCast, x.norm_tokens() * x.h, e, x.norm_split());
  if (x.autocast) layer.forward.push_back(weight_cast);
  Op fnorm;
  if (decoder) {
    fnorm = norm_op(OpId::kHeadNorm, x, passes);
    layer.forward.push_back(fnorm);
  }
  if (x.autocast) layer.forward.push_back(head_cast);
  add_sp_gather(layer.forward, x, kHeadCollectives);
  Op logits = gemm(OpId::kHeadLogits, T, vocab_shard, x.h, e, TpSplit::kVocab);
  layer.forward.push_back(logits);
  // Cross-entropy over the rank's vocabulary shard, priced by the stack's implementation. The
  // base op is one fused pass: read the 16-bit logits, write the fp32 softmax the backward uses.
  Op loss = memory_op(OpId::kHeadLoss, OpClass::kLoss, T * vocab_shard * (e + 4), TpSplit::kVocab,
                      {T, vocab_shard});
  const double fused_bytes = static_cast<double>(e + 4);
  double backward_factor = 1.0;
  std::optional<EagerLossCast> eager_cast;
  switch (x.cross_entropy) {
    case spec::CrossEntropy::kEager:
      eager_cast = eager_loss_cast(T, vocab_shard, e);
      loss = eager_cross_entropy(T, vocab_shard);
      backward_factor =
          static_cast<double>(eager_cast->softmax_backward_bytes) / static_cast<double>(loss.bytes);
      break;
    case spec::CrossEntropy::kMegatron:
      // Megatron-LM gpt_model.py: vocab_parallel_cross_entropy(output.float(), labels), whose
      // forward (mpu/cross_entropy.py, tensor_parallel/cross_entropy.py) makes six passes over
      // the fp32 logits: the cast (e + 4 bytes), max (4), sub_ (4 + 4), exp (4 + 4), sum (4) and
      // div_ into the saved softmax (4 + 4): e + 36 bytes per logit. Its backward multiplies the
      // softmax in place by the loss gradient (4 + 4) and the cast's backward writes the 16-bit
      // gradient (4 + e): e + 12 bytes, in two kernels.
      loss = unfused(loss, static_cast<double>(e + 36) / fused_bytes, 6);
      backward_factor = static_cast<double>(e + 12) / static_cast<double>(e + 36);
      break;
    case spec::CrossEntropy::kFused:
      break;
    case spec::CrossEntropy::kCompiled:
      // One fused pass over the 16-bit logits (llm.c fused_classifier, Inductor).
      loss = unfused(loss, static_cast<double>(e) / fused_bytes, 1);
      break;
  }
  if (eager_cast && eager_cast->forward) layer.forward.push_back(*eager_cast->forward);
  layer.forward.push_back(loss);
  if (x.t > 1) {
    // Vocabulary-parallel cross-entropy (Megatron-LM tensor_parallel/cross_entropy.py): the max
    // logit of each token first (each shard's sum of exponentials is relative to it), then the
    // sums of exponentials and the target logits together: fp32 values per token.
    layer.forward.push_back(comm_op(OpId::kHeadLossAllReduce, CollectiveKind::kAllReduce, T * 4));
    layer.forward.push_back(
        comm_op(OpId::kHeadLossAllReduce, CollectiveKind::kAllReduce, 2 * T * 4));
  }
  Op loss_backward = memory_backward(loss, backward_factor);
  if (x.cross_entropy == spec::CrossEntropy::kMegatron || eager_cast) loss_backward.kernels = 2;
  layer.backward.push_back(loss_backward);
  if (eager_cast) layer.backward.push_back(eager_cast->backward);
  layer.backward.push_back(gemm_backward(logits));
  add_tp_reduce(layer.backward, x, kHeadCollectives);
  if (x.autocast) layer.backward.push_back(autocast_cast_backward(head_cast, x));
  if (decoder) layer.backward.push_back(norm_backward(fnorm, passes));
  if (x.autocast) layer.backward.push_back(autocast_cast_backward(weight_cast, x));

  int64_t pooler = m.pooler ? x.h * x.h + x.h : 0;
  int64_t out_proj = m.tied_embeddings ? 0 : x.V * x.h;
  layer.params_total = (decoder ? norm_params : 0) + out_proj + pooler;
  // With tied embeddings and pipeline stages the last stage keeps its own copy of the table
  // (Megatron-LM); that copy is memory, not a new parameter: stage_params adds it.
  layer.params = (decoder ? norm_params : 0) + (m.tied_embeddings ? 0 : vocab_shard * x.h) + pooler;
  if (x.sp && decoder) layer.sp_partial_params = norm_params;
  if (!m.tied_embeddings) layer.matrices.push_back({vocab_shard, x.h});
  if (m.pooler) layer.matrices.push_back({x.h, x.h});
  // Kept: norm input, logits input, fp32 softmax of the logits shard.
  layer.saved_bytes = (decoder ? x.norm_tokens() * x.h * e : 0) + T * x.h * e + T * vocab_shard * 4;
  layer.saved_bytes_selective = layer.saved_bytes;
  layer.saved_bytes_full = layer.saved_bytes;
  layer.output_bytes = T * 4;  // the loss per token (fp32)
  return layer;
}

}  // namespace

LoweredModel lower_transformer(const spec::ModelSpec& model, const LoweringOptions& o) {
  spec::TransformerSpec m = model.transformer();
  m.dropout = m.dropout && o.dropout;  // a stack that runs no dropout trains the model without
  TransformerDims x{};
  const spec::TensorGrid& grid = o.tp_grid;
  // On a tensor grid each z slice takes micro_batch/z sequences; its x*y ranks hold the
  // vocabulary (the embedding and output layer, vocabulary-parallel over them).
  x.b = grid.any() ? o.micro_batch / grid.z : o.micro_batch;
  const int64_t seq = o.seq_len > 0 ? o.seq_len : m.seq_len;
  x.cp = o.cp;
  x.cp_algorithm = o.cp_algorithm;
  x.s = seq / std::max<int64_t>(o.cp, 1);
  x.ep = std::max<int64_t>(o.ep, 1);
  x.h = m.hidden;
  x.a = m.heads;
  x.kv = m.kv_heads;
  x.d = m.head_dim();
  x.f = m.ffn_hidden;
  x.V = m.vocab;
  x.t = grid.any() ? grid.x * grid.y : o.tp;
  x.vocab_shard = vocab_shard(m.vocab, x.t, o.vocab_multiple);
  x.e = spec::dtype_bytes(o.dtype);
  x.sp = o.sequence_parallel && o.tp > 1;
  x.attention = o.attention;
  x.fusion = o.fusion;
  x.cross_entropy = o.cross_entropy;
  x.autocast = o.autocast && x.e < 4;
  x.fused_rms_norm = o.fused_rms_norm;
  x.bias_grad_kernel = o.bias_grad_kernel;
  x.code = o.code;
  x.fp8 = o.fp8_gemms;
  x.selective = o.selective;
  std::string source = fmt::format("model {}", model.name);
  if (grid.any()) {
    // The grid's rules (spec/tensor_grid.hpp) on the options' layout.
    spec::Plan shape;
    shape.tp = o.tp;
    shape.tp_grid = grid;
    shape.sequence_parallel = o.sequence_parallel;
    shape.cp = o.cp;
    shape.ep = o.ep;
    std::string problem = spec::tensor_grid_problem(shape);
    if (problem.empty()) problem = spec::tensor_grid_model_problem(model, grid, o.micro_batch);
    if (!problem.empty())
      throw InputError(source, "/tp_grid", spec::tensor_grid_text(grid), problem);
  } else if (std::string problem = spec::tensor_parallel_problem(model, o.tp); !problem.empty()) {
    throw InputError(source, "/tp", std::to_string(o.tp), problem);
  }
  if (o.cp > 1) {
    spec::Plan split;
    split.tp = o.tp;
    split.sequence_parallel = o.sequence_parallel;
    split.cp = o.cp;
    split.cp_algorithm = o.cp_algorithm;
    if (std::string problem = spec::context_parallel_problem(model, seq, split); !problem.empty())
      throw InputError(source, "/cp", std::to_string(o.cp), problem);
    if (std::string problem = spec::context_attention_problem(o.cp, o.cp_algorithm, o.attention);
        !problem.empty())
      throw InputError(
          source, "/cp_algorithm",
          std::string(spec::enum_name(spec::context_algorithm_names(), o.cp_algorithm)), problem);
  }
  if (std::string problem = spec::expert_model_problem(model, x.ep); !problem.empty())
    throw InputError(source, "/ep", std::to_string(x.ep), problem);
  if (x.sp)
    if (std::string problem = spec::sequence_parallel_problem(x.s, o.tp); !problem.empty())
      throw InputError(source, "/sequence_parallel", "true", problem);
  if (std::string problem =
          spec::moe_tensor_parallel_problem(model, o.tp_grid.any() ? 1 : o.tp, x.sp);
      !problem.empty())
    throw InputError(source, "/sequence_parallel", x.sp ? "true" : "false", problem);
  LoweredModel out;
  out.dtype = o.dtype;
  out.tokens_per_micro_batch = x.b * x.s;
  out.samples_per_micro_batch = x.b;
  out.layers.reserve(static_cast<size_t>(m.layers) + 2);
  out.layers.push_back(transformer_embedding(m, x));
  // The blocks are alike but for their names (and, in a mixture of experts, the dense first
  // ones): one of each kind is lowered, the others are its copies (the planner lowers a model per
  // (tp, micro-batch, sequence parallelism, stack), 96 blocks for GPT-3 175B, and building each
  // op again was a third of its estimate phase).
  const int64_t dense_layers = m.moe ? m.moe->dense_layers : m.layers;
  std::optional<Layer> dense, expert;
  for (int64_t i = 0; i < m.layers; ++i) {
    std::optional<Layer>& kind = i < dense_layers ? dense : expert;
    if (!kind) {
      kind = grid.any() ? grid_block(m, x, grid) : transformer_block(m, x, 0, i >= dense_layers);
      if (!o.per_op.empty()) {
        if (grid.any() || m.moe)
          throw InputError(source, "/per_op", spec::op_splits_text(o.per_op).substr(1),
                           "splits the ops of dense blocks under 1D tensor parallelism only");
        const int64_t gate = m.activation == spec::Activation::kSwiglu ? 2 : 1;
        apply_op_splits(
            *kind, x,
            per_op_block({x.b, x.s, x.h, x.a, x.d, x.f, x.kv, gate}, std::max<int64_t>(o.dp, 1),
                         x.t, x.sp, m.norm == spec::Norm::kLayerNorm, m.bias, o.per_op));
      }
    }
    out.layers.push_back(*kind);
    out.layers.back().name = fmt::format("block{}", i);
  }
  out.layers.push_back(transformer_head(m, x));
  if (o.per_op.contains(kLogitsOp)) {
    if (grid.any() || m.moe || m.architecture != spec::Architecture::kDecoder)
      throw InputError(source, "/per_op", spec::op_splits_text(o.per_op).substr(1),
                       "splits the logits of dense decoders under 1D tensor parallelism only");
    apply_head_splits(out.layers.back(), x,
                      per_op_head(x.b, x.s, x.h, x.vocab_shard * x.t, std::max<int64_t>(o.dp, 1),
                                  x.t, x.sp, m.tied_embeddings, o.per_op));
  }
  if (grid.z > 1) {
    // The z slices hold the embedding and output layer alike and see only their own tokens.
    out.layers.front().sp_partial_params = out.layers.front().params;
    out.layers.back().sp_partial_params = out.layers.back().params;
  }
  out.split_begin = 1;
  out.split_end = out.layers.size() - 1;
  if (m.tied_embeddings) out.tied_table_params = x.vocab_shard * x.h;
  out.vocab_shard = x.vocab_shard;
  return out;
}

}  // namespace sextant::models
