// The MLP of a mixture-of-experts block on one rank (transformer_lowering.hpp).
#include <algorithm>
#include <cmath>

#include "sextant/models/moe_capacity.hpp"
#include "sextant/models/moe_load.hpp"
#include "transformer_lowering.hpp"

namespace sextant::models {

namespace {

// Rows the experts compute for `tokens` routed tokens: top_k copies of each, or with a capacity
// factor every expert's capacity, ceil(factor x copies / experts) rows, padded (or cut) to it
// (GShard, Switch; Megatron-LM's expert_capacity with --moe-pad-expert-input-to-capacity; the
// executor's drops); the router assumed balanced when dropless.
int64_t expert_rows(const spec::MoeSpec& moe, int64_t tokens) {
  const int64_t copies = tokens * moe.top_k;
  return moe.capacity_factor > 0 ? expert_capacity(moe, copies) * moe.experts : copies;
}

}  // namespace

MoeMlp moe_mlp(const spec::TransformerSpec& m, const TransformerDims& x, const FusionPasses& passes,
               std::vector<Op>& fw) {
  const spec::MoeSpec& moe = *m.moe;
  const int64_t T = x.tokens(), e = x.e, h = x.h, E = moe.experts, k = moe.top_k;
  const int64_t local = E / x.ep;  // routed experts on this rank (spec::expert_model_problem)
  const bool over_tp = dispatches_over_tp(x);
  // Without ep the tp ranks share the routing: each routes its own tokens, the routing (a weight
  // and an expert index, 4 bytes each, per copy) is all-gathered, and every rank computes every
  // token's copies on its share of each expert's columns (Megatron-LM's
  // MoEAllGatherTokenDispatcher over the MLP's sequence-parallel gather).
  const bool shares_routing = x.t > 1 && !over_tp;
  // The tokens this rank routes: its s/tp share under tp (spec::moe_tensor_parallel_problem asks
  // for sequence parallelism there), all T of them without; and those whose copies it makes:
  // all T when the routing is shared.
  const int64_t Tr = x.t > 1 ? x.norm_tokens() : T;
  const int64_t Tp = over_tp ? Tr : T;
  const int64_t gate = m.activation == spec::Activation::kSwiglu ? 2 : 1;
  const int64_t fe = moe.expert_ffn_hidden / x.t;  // each expert's width on this rank
  const int64_t bias = m.bias ? 1 : 0;
  // Rows this rank routes (padded to capacity), and the useful ones (each token's k copies).
  // Under expert parallelism a rank sends its rows to the ep ranks and receives as many for its
  // local experts (balanced routing: the auxiliary load-balancing loss's aim, GShard §2.2); over
  // tp the experts compute the rows of every tp rank (M = tp x Mr).
  const int64_t Mr = expert_rows(moe, Tp);
  const int64_t M = over_tp ? Mr * x.t : Mr;
  const int64_t routed = T * k;
  const int64_t per_expert = std::max<int64_t>(1, M / local);
  MoeMlp out;
  Op router = gemm(OpId::kMoeRouter, Tr, E, h, e, TpSplit::kReplicated);
  // Softmax over the experts and the top-k in fp32 (Megatron's router), the top_k weights and
  // indices written.
  Op route = memory_op(OpId::kMoeRoute, OpClass::kElementwise, Tr * E * 8 + Tr * k * 8,
                       TpSplit::kReplicated, {Tr, E});
  route.kernels = 2;
  Op permute = memory_op(OpId::kMoePermute, OpClass::kElementwise, Tp * h * e + Mr * h * e,
                         TpSplit::kReplicated, {Mr, h});
  // A grouped GEMM over the experts: FLOPs count the routed copies (model FLOPs), the kernel
  // computes the padded rows too.
  auto expert_gemm = [&](OpId name, int64_t n, int64_t kdim, TpSplit split) {
    Op op = gemm(name, M, n, kdim, e, split);
    op.flops =
        2.0 * static_cast<double>(routed) * static_cast<double>(n) * static_cast<double>(kdim);
    op.kernel_flops =
        2.0 * static_cast<double>(M) * static_cast<double>(n) * static_cast<double>(kdim);
    op.bytes = (M * kdim + local * kdim * n + M * n) * e;  // every local expert's weights read
    op.matmuls = {{local, per_expert, n, kdim}};
    return op;
  };
  Op fc1 = expert_gemm(OpId::kMoeFc1, gate * fe, h, TpSplit::kColumn);
  Op act = unfused(memory_op(OpId::kMoeAct, OpClass::kElementwise, (gate + 1) * M * fe * e,
                             TpSplit::kColumn, {M, gate * fe}),
                   passes.act, passes.act_kernels);
  Op fc2 = expert_gemm(OpId::kMoeFc2, h, fe, TpSplit::kRow);
  // The copies weighted by the router and summed into their tokens, with the shared experts'
  // output added.
  Op unpermute = memory_op(OpId::kMoeUnpermute, OpClass::kElementwise,
                           Mr * h * e + Tp * k * 4 + Tp * h * e * (moe.shared_experts > 0 ? 2 : 1),
                           TpSplit::kReplicated, {Tp, h});
  const int64_t fs = moe.shared_experts * moe.expert_ffn_hidden / x.t;  // shared width per rank
  Op shared_fc1 = gemm(OpId::kMoeSharedFc1, T, gate * fs, h, e, TpSplit::kColumn);
  Op shared_act = unfused(memory_op(OpId::kMoeSharedAct, OpClass::kElementwise,
                                    (gate + 1) * T * fs * e, TpSplit::kColumn, {T, gate * fs}),
                          passes.act, passes.act_kernels);
  Op shared_fc2 = gemm(OpId::kMoeSharedFc2, T, h, fs, e, TpSplit::kRow);
  const bool shared = moe.shared_experts > 0;
  // The all-to-alls of expert parallelism (GShard; Megatron's MoEAlltoAllTokenDispatcher): each
  // rank's Mr rows of h out and as many back, in the ep group.
  auto expert_exchange = [&](OpId name) {
    Op op = comm_op(name, CollectiveKind::kAllToAll, Mr * h * e);
    op.group = CommGroup::kExpert;
    return op;
  };
  // The dispatcher's tensor-parallel gather and reduce-scatter of `rows` rows (output size, as
  // the sequence-parallel collectives count).
  auto tp_exchange = [&](OpId name, CollectiveKind kind, int64_t rows) {
    Op op = comm_op(name, kind, rows * h * e);
    op.no_tp_overlap = true;
    return op;
  };
  const bool exchange = x.ep > 1;
  // Dropless under ep, the most loaded ep rank receives more than the balanced Mr copies and its
  // tp group more than M (models/moe_load.hpp): the exchanges it takes part in and its experts'
  // GEMMs are priced at that load (backward copies them).
  const double rank_load = moe_load_factor(moe, Mr, x.ep);
  const double group_load = moe_load_factor(moe, M, x.ep);
  Op dispatch = expert_exchange(OpId::kMoeDispatch);
  Op combine = expert_exchange(OpId::kMoeCombine);
  dispatch.load_factor = combine.load_factor = rank_load;
  Op gather = tp_exchange(OpId::kMoeAllGather, CollectiveKind::kAllGather, M);
  Op scatter = tp_exchange(OpId::kMoeReduceScatter, CollectiveKind::kReduceScatter, M);
  gather.load_factor = scatter.load_factor = group_load;
  fc1.load_factor = act.load_factor = fc2.load_factor = group_load;
  const Op shared_gather = tp_exchange(OpId::kMoeSharedAllGather, CollectiveKind::kAllGather, T);
  const Op shared_scatter =
      tp_exchange(OpId::kMoeSharedReduceScatter, CollectiveKind::kReduceScatter, T);
  // The shared routing's gather, and in backward the reduce-scatter of the weights' gradients
  // (partial sums: each tp rank's outputs are partial until the MLP's reduce-scatter).
  Op route_gather = comm_op(OpId::kMoeRouteAllGather, CollectiveKind::kAllGather, T * k * 8);
  Op route_scatter =
      comm_op(OpId::kMoeRouteReduceScatter, CollectiveKind::kReduceScatter, T * k * 4);
  route_gather.no_tp_overlap = route_scatter.no_tp_overlap = true;
  fw.insert(fw.end(), {router, route});
  if (shares_routing) fw.push_back(route_gather);
  fw.push_back(permute);
  if (exchange) fw.push_back(dispatch);
  if (over_tp) fw.push_back(gather);
  fw.insert(fw.end(), {fc1, act, fc2});
  if (over_tp) fw.push_back(scatter);
  if (exchange) fw.push_back(combine);
  if (shared) {
    if (over_tp) fw.push_back(shared_gather);
    fw.insert(fw.end(), {shared_fc1, shared_act, shared_fc2});
    if (over_tp) fw.push_back(shared_scatter);
  }
  fw.push_back(unpermute);

  auto act_backward = [&](const Op& a) {
    if (passes.act_backward > 0) {
      Op op = memory_backward(a, passes.act_backward);
      op.kernels = passes.act_backward_kernels;
      return op;
    }
    return memory_backward(a, (2.0 * gate + 1) / (gate + 1));
  };
  auto expert_backward = [](const Op& f) {
    Op op = gemm_backward(f);
    op.kernel_flops = 2 * f.kernel_flops;
    return op;
  };
  // Backward runs each tensor-parallel collective's conjugate (a gather's gradient is
  // reduce-scattered, a reduce-scatter's gathered), named by what it does.
  auto conjugate = [](const Op& c, const Op& as) {
    Op op = as;
    op.bytes = c.bytes;
    return op;
  };
  std::vector<Op>& bw = out.backward;
  bw.push_back(memory_backward(unpermute, 1.0));  // and the router weights' gradient
  if (shared) {
    if (over_tp) bw.push_back(conjugate(shared_scatter, shared_gather));
    bw.insert(bw.end(),
              {gemm_backward(shared_fc2), act_backward(shared_act), gemm_backward(shared_fc1)});
    if (over_tp) bw.push_back(conjugate(shared_gather, shared_scatter));
  }
  // The outputs' gradients go back to the experts' ranks, the inputs' to the tokens' ranks.
  if (exchange) bw.push_back(combine);
  if (over_tp) bw.push_back(conjugate(scatter, gather));
  bw.insert(bw.end(), {expert_backward(fc2), act_backward(act), expert_backward(fc1)});
  if (over_tp) bw.push_back(conjugate(gather, scatter));
  if (exchange) bw.push_back(dispatch);
  bw.push_back(memory_backward(permute, 1.0));
  if (shares_routing) bw.push_back(route_scatter);
  bw.insert(bw.end(), {memory_backward(route, 1.0), gemm_backward(router)});

  // Parameters: the router whole on every rank; each expert (routed and shared) split over tp as
  // the dense MLP is, its second bias whole; the routed ones split over ep.
  const int64_t f = moe.expert_ffn_hidden, n_experts = E + moe.shared_experts;
  const int64_t held = local + moe.shared_experts;  // experts on this rank
  const int64_t expert_rank = (h * gate * f + bias * gate * f + f * h) / x.t + bias * h;
  out.params_total = h * E + n_experts * (h * gate * f + bias * gate * f + f * h + bias * h);
  out.params = h * E + held * expert_rank;
  out.expert = local * expert_rank;
  out.routed_total = E * (h * gate * f + bias * gate * f + f * h + bias * h);
  out.weight_elements = h * E + held * (h * gate * f + f * h) / x.t;
  // [rows, cols] as the executor holds them (exec/src/gpt/gpt_params.cpp): the router, each routed
  // expert's two and the shared experts' two (one MLP of their summed width). Under ep the routed
  // experts' gradients travel in buckets of their own, never compressed
  // (spec::expert_parallel_problem), so only the dense buckets list matrices.
  out.matrices.push_back({h, E});
  if (x.ep == 1)
    for (int64_t j = 0; j < E; ++j) {
      out.matrices.push_back({h, gate * fe});
      out.matrices.push_back({fe, h});
    }
  if (fs > 0) {
    out.matrices.push_back({h, gate * fs});
    out.matrices.push_back({fs, h});
  }
  // Routing its own tokens, a tp rank's router gradient is a partial sum (Megatron-LM marks the
  // router weight sequence-parallel: all-reduced over tp with the norms).
  out.sp_partial = x.t > 1 ? h * E : 0;
  // Kept for backward: the router's probabilities and the experts' input rows (every tp rank
  // routes and holds them whole), the experts' activation and second GEMM inputs (split over
  // tp), and the experts' outputs the weighted sum's backward reads; the shared experts' as a
  // dense MLP's. The experts' rows are the busiest rank's (group_load; the outputs it reads back
  // are its own copies, balanced).
  const int64_t act_saved = passes.act_saved > 0 ? passes.act_saved : gate * e;
  auto busiest = [&](int64_t bytes) {
    return static_cast<int64_t>(std::llround(static_cast<double>(bytes) * group_load));
  };
  out.saved_replicated = Tr * E * 4 + busiest(M * h * e) + Mr * h * e;
  // (Bytes of the whole layer's tensors: the caller takes a tp rank's share.)
  out.saved_split = busiest(M * f * (act_saved + e)) + T * moe.shared_experts * f * (act_saved + e);
  return out;
}

}  // namespace sextant::models
