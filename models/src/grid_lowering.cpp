// A transformer block on AxoNN's 3D tensor grid (spec/tensor_grid.hpp): its ops and parameters.
#include "sextant/spec/tensor_grid.hpp"
#include "transformer_lowering.hpp"

namespace sextant::models {

namespace {

// One linear layer Y[m, n] = X[m, k] W[k, n] of a 3D tensor grid (spec/tensor_grid.hpp, AxoNN's
// AsyncLinear): the rank holds the (k/inner) x (n/outer) block of W, sharded again over z.
// Forward: the block all-gathered over z, the rank's product, its partial output all-reduced over
// the inner axis. Backward: the block gathered again (AxoNN keeps no copy), both products, the
// input gradient all-reduced over the outer axis, the weight gradient reduce-scattered over z.
// Collective bytes as elsewhere: an all-gather's gathered output, a reduce-scatter's whole input.
struct GridLinear {
  std::vector<Op> forward;
  std::vector<Op> backward;
};
GridLinear grid_linear(const GridLinearOps& ops, int64_t tokens, int64_t k, int64_t n,
                       int64_t inner, int64_t outer, CommGroup inner_group, CommGroup outer_group,
                       const spec::TensorGrid& g, int64_t e, TpSplit split) {
  auto grid_comm = [](OpId id, CollectiveKind kind, int64_t bytes, CommGroup group) {
    Op op = comm_op(id, kind, bytes);
    op.group = group;
    return op;
  };
  const int64_t block = k / inner * (n / outer);
  GridLinear out;
  Op gather =
      grid_comm(ops.weight_gather, CollectiveKind::kAllGather, block * e, CommGroup::kGridZ);
  Op product = gemm(ops.product, tokens, n / outer, k / inner, e, split);
  if (g.z > 1) out.forward.push_back(gather);
  out.forward.push_back(product);
  if (inner > 1)
    out.forward.push_back(grid_comm(ops.all_reduce, CollectiveKind::kAllReduce,
                                    tokens * (n / outer) * e, inner_group));
  if (g.z > 1) out.backward.push_back(gather);
  out.backward.push_back(gemm_backward(product));
  if (outer > 1)
    out.backward.push_back(grid_comm(ops.all_reduce, CollectiveKind::kAllReduce,
                                     tokens * (k / inner) * e, outer_group));
  if (g.z > 1)
    out.backward.push_back(
        grid_comm(ops.grad_scatter, CollectiveKind::kReduceScatter, block * e, CommGroup::kGridZ));
  return out;
}

}  // namespace

// A transformer block on a 3D tensor grid (Megatron-AxoNN's ParallelAttention and ParallelMLP
// over axonn.intra_layer.Tensor_Parallel_Linear): the norms and residuals on the whole hidden
// vector of the slice's T = b/z * s tokens (every rank of the slice alike), QKV and FC1 with their
// inputs split over x and outputs over y (the heads, the ffn), the attention core on heads/y,
// the output projection and FC2 with x and y swapped, each followed by an all-gather of the
// x-split output over x (its backward: a slice, no transfer); the slice taken before QKV and FC1
// costs nothing forward and all-gathers the input gradient over x backward. `x` holds the
// slice's dims (b = micro_batch/z; t, its x*y ranks, only for the vocabulary).
Layer grid_block(const spec::TransformerSpec& m, const TransformerDims& x,
                 const spec::TensorGrid& g) {
  Layer layer;
  layer.kind = LayerKind::kBlock;
  const int64_t T = x.tokens();
  const int64_t e = x.e;
  const int64_t r = x.residual_bytes();
  const int64_t qkv_full = x.h + 2 * x.kv * x.d;
  const int64_t gate = m.activation == spec::Activation::kSwiglu ? 2 : 1;
  // The attention core and the fusion passes of a rank holding heads/y of the heads.
  TransformerDims heads = x;
  heads.t = g.y;
  const FusionPasses passes = fusion_passes(m, heads);
  const CommGroup X = CommGroup::kGridX;
  const CommGroup Y = CommGroup::kGridY;
  GridLinear qkv = grid_linear(kGridQkv, T, x.h, qkv_full, g.x, g.y, X, Y, g, e, TpSplit::kColumn);
  GridLinear proj = grid_linear(kGridProj, T, x.h, x.h, g.y, g.x, Y, X, g, e, TpSplit::kRow);
  GridLinear fc1 =
      grid_linear(kGridFc1, T, x.h, gate * x.f, g.x, g.y, X, Y, g, e, TpSplit::kColumn);
  GridLinear fc2 = grid_linear(kGridFc2, T, x.f, x.h, g.y, g.x, Y, X, g, e, TpSplit::kRow);
  auto gather_x = [&](const PartCollectives& part, std::vector<Op>& ops) {
    if (g.x == 1) return;
    Op op = comm_op(part.all_gather, CollectiveKind::kAllGather, T * x.h * e);
    op.group = X;
    ops.push_back(op);
  };

  std::vector<Op>& fw = layer.forward;
  const int64_t weight_elements =
      (x.h * qkv_full + x.h * x.h + gate * x.h * x.f + x.f * x.h) / (g.x * g.y);
  Op weight_cast = autocast_cast(OpId::kAutocastWeights, weight_elements, e, TpSplit::kColumn);
  weight_cast.kernels = 4;
  if (x.autocast) fw.push_back(weight_cast);
  // A grid runs without sequence parallelism (spec/tensor_grid.hpp): its norms and residuals
  // are the block's, over all T tokens.
  Op attn_norm = norm_op(OpId::kAttnNorm, x, passes);
  fw.push_back(attn_norm);
  Op attn_cast = autocast_cast(OpId::kAttnCast, T * x.h / g.x, e, TpSplit::kReplicated);
  if (x.autocast) fw.push_back(attn_cast);
  fw.insert(fw.end(), qkv.forward.begin(), qkv.forward.end());
  const bool rotary = m.position_embedding == spec::PositionEmbedding::kRope;
  Op rope = rope_op(heads, passes);
  if (rotary) fw.push_back(rope);
  AttentionCore core = attention_core(m, heads, passes, fw);
  fw.insert(fw.end(), proj.forward.begin(), proj.forward.end());
  gather_x(kAttnCollectives, fw);
  Op attn_res = residual_op(OpId::kAttnResidual, m, x, passes);
  fw.push_back(attn_res);
  Op mlp_norm = norm_op(OpId::kMlpNorm, x, passes);
  fw.push_back(mlp_norm);
  Op mlp_cast = autocast_cast(OpId::kMlpCast, T * x.h / g.x, e, TpSplit::kReplicated);
  if (x.autocast) fw.push_back(mlp_cast);
  fw.insert(fw.end(), fc1.forward.begin(), fc1.forward.end());
  const int64_t ffn = x.f / g.y;
  Op act = unfused(memory_op(OpId::kMlpAct, OpClass::kElementwise, (gate + 1) * T * ffn * e,
                             TpSplit::kColumn, {T, gate * ffn}),
                   passes.act, passes.act_kernels);
  fw.push_back(act);
  fw.insert(fw.end(), fc2.forward.begin(), fc2.forward.end());
  gather_x(kMlpCollectives, fw);
  Op mlp_res = residual_op(OpId::kMlpResidual, m, x, passes);
  fw.push_back(mlp_res);

  // Backward in execution order, as transformer_block's.
  std::vector<Op>& bw = layer.backward;
  bw.insert(bw.end(), fc2.backward.begin(), fc2.backward.end());
  bw.push_back(activation_backward(act, gate, passes));
  bw.insert(bw.end(), fc1.backward.begin(), fc1.backward.end());
  // The column-parallel linears' bias gradients over their y-split outputs (as the 1D block's).
  if (m.bias && x.bias_grad_kernel)
    bw.push_back(bias_grad_op(OpId::kMlpFc1BiasGrad, T, gate * x.f / g.y, e));
  gather_x(kMlpCollectives, bw);
  if (x.autocast) bw.push_back(autocast_cast_backward(mlp_cast, x));
  bw.push_back(norm_backward(mlp_norm, passes));
  bw.push_back(memory_backward(mlp_res, 2.0 / 3.0));
  bw.insert(bw.end(), proj.backward.begin(), proj.backward.end());
  bw.insert(bw.end(), core.backward.begin(), core.backward.end());
  if (rotary) bw.push_back(memory_backward(rope, 1.0));
  bw.insert(bw.end(), qkv.backward.begin(), qkv.backward.end());
  if (m.bias && x.bias_grad_kernel)
    bw.push_back(bias_grad_op(OpId::kAttnQkvBiasGrad, T, qkv_full / g.y, e));
  gather_x(kAttnCollectives, bw);
  if (x.autocast) bw.push_back(autocast_cast_backward(attn_cast, x));
  bw.push_back(norm_backward(attn_norm, passes));
  bw.push_back(memory_backward(attn_res, 2.0 / 3.0));
  if (x.autocast) bw.push_back(autocast_cast_backward(weight_cast, x));

  // Parameters: each weight matrix's block sharded over z (1/tp of it per rank); the biases split
  // as their layer's outputs (QKV and FC1 over y, the projection and FC2 over x), the norms
  // whole. Those the z slices hold alike see only their slice's tokens: partial sums over z
  // (AxoNN's needs_depth_parallel_gradient_sync), summed with the norms once per step.
  const int64_t tp = g.x * g.y * g.z;
  const int64_t norm_params = m.norm == spec::Norm::kLayerNorm ? 2 * x.h : x.h;
  const int64_t bias = m.bias ? 1 : 0;
  const int64_t weights = x.h * qkv_full + x.h * x.h + gate * x.h * x.f + x.f * x.h;
  const int64_t biases_total = bias * (qkv_full + x.h + gate * x.f + x.h);
  const int64_t biases_rank = bias * (qkv_full / g.y + x.h / g.x + gate * x.f / g.y + x.h / g.x);
  layer.params_total = weights + biases_total + 2 * norm_params;
  layer.params = weights / tp + biases_rank + 2 * norm_params;
  if (g.z > 1) layer.sp_partial_params = biases_rank + 2 * norm_params;

  // Kept for backward: the norm inputs and dropout masks whole, the inputs of QKV and FC1 split
  // over x, Q, K and V, the projection's input, the activation's and FC2's input split over y,
  // and the attention core's.
  const int64_t mask = m.dropout ? 1 : 0;
  const int64_t whole = 2 * T * x.h * r + 2 * mask * T * x.h;
  const int64_t act_input = passes.act_saved > 0 ? T * ffn * passes.act_saved : gate * T * ffn * e;
  const int64_t split =
      2 * T * x.h / g.x * e + T * qkv_full / g.y * e + T * x.h / g.y * e + act_input + T * ffn * e;
  layer.saved_bytes = whole + split + core.saved_bytes;
  layer.saved_bytes_selective = whole + split;
  layer.saved_bytes_full = T * x.h * e;
  layer.output_bytes = T * x.h * e;
  return layer;
}

}  // namespace sextant::models
