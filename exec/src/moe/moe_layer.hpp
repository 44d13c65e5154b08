// The MLP of a mixture-of-experts block on CPU ranks (fp32, host memory), as the
// lowering names its ops (models/src/moe_lowering.cpp moe_mlp): the router's GEMM (moe.router); a
// softmax over the experts and the top-k, the k weights renormalised to sum to one (Mixtral's
// router: the softmax over the chosen logits) (moe.route); each token copied once per chosen
// expert, the copies grouped by expert in token order (moe.permute); under expert parallelism the
// copies sent to the ranks holding their experts, after the row counts (moe.dispatch, an
// all-to-all of uneven blocks); each local expert's two GEMMs and activation over its rows
// (moe.fc1, moe.act, moe.fc2); the results sent back in the order they came (moe.combine); the
// shared experts as a dense MLP over every token (moe.shared_*); and each token's copies weighted
// and summed, with the shared output added (moe.unpermute). Backward runs the same steps in
// reverse, the route's gradient through the renormalised softmax: with w the chosen weights and
// dw their gradients, d logit_j = w_j (dw_j - sum_i w_i dw_i) for chosen j, 0 for the others.
// No auxiliary load-balancing loss: the model trains on the language-model loss alone.
//
// With a capacity factor (GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021; Megatron-LM's
// --moe-expert-capacity-factor with its default "probs" drop policy and
// --moe-pad-expert-input-to-capacity), each expert takes at most ceil(factor x copies / experts)
// of the copies a rank makes (models::expert_capacity), those of the highest weights (the lower
// token first on a tie); a dropped copy adds nothing to its token (the residual carries it) and its
// weight gets no gradient, and every expert's rows are padded with zeros to the capacity, so the
// dispatch is an even exchange of the capacity's rows, as the simulator prices it.
//
// Under tensor parallelism (sequence parallel, spec::moe_tensor_parallel_problem) every expert is
// split over tp as the dense MLP is, and each tp rank routes its own rows. Then, as Megatron-LM's
// token dispatchers do:
// - without ep (shares_routing, MoEAllGatherTokenDispatcher): the block all-gathers the rows as
//   for a dense MLP, the ranks all-gather the routing (moe.route_all_gather), every rank computes
//   every token's copies on its share of the experts' columns, and the block reduce-scatters the
//   partial output; the weights' gradients, partial sums too, are reduce-scattered back to the
//   ranks that routed them (moe.route_reduce_scatter);
// - with ep (dispatches_over_tp, MoEAlltoAllTokenDispatcher): each rank exchanges its own copies
//   over ep, the tp ranks all-gather what they received (moe.all_gather, blocks of their own
//   sizes) for the split experts and reduce-scatter the partial outputs back
//   (moe.reduce_scatter); the shared experts gather and scatter the rows themselves.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "sextant/exec/context.hpp"
#include "sextant/exec/parameters.hpp"
#include "sextant/spec/expert_parallel.hpp"
#include "sextant/spec/model_spec.hpp"

namespace sextant::exec {

// A block's mixture-of-experts parameters on this rank.
struct MoeWeights {
  Param* router = nullptr;       // [hidden, experts], every rank
  std::vector<Param*> fc1, fc2;  // the rank's routed experts: [hidden, gate f], [f, hidden]
  Param* shared_fc1 = nullptr;   // [hidden, gate fs] (fs: the shared experts' width), or null
  Param* shared_fc2 = nullptr;   // [fs, hidden]
};

// What a micro-batch's forward keeps for its backward.
struct MoeCache {
  Tensor x_route;                 // the rows this rank routes [routed, hidden]
  Tensor x;                       // the rows whose copies it makes [tokens, hidden]
  Tensor shared_x;                // the shared experts' rows when they gather them themselves
  std::vector<int32_t> expert;    // [tokens * top_k] the chosen experts
  std::vector<float> weight;      // [tokens * top_k] their weights
  std::vector<float> own_weight;  // [routed * top_k] those of the rows this rank routed
  std::vector<int32_t> own_expert;
  std::vector<int64_t> slot;      // [tokens * top_k] the copy's row in the permuted order, -1
                                  // when dropped over its expert's capacity
  std::vector<int64_t> sent;      // elements sent to each ep rank (the permuted rows' blocks)
  std::vector<int64_t> received;  // elements received from each ep rank
  std::vector<int64_t> tp_rows;   // rows each tp rank received (dispatches_over_tp)
  // The received blocks (tp rank, source ep rank, local expert) in arrival order: where each
  // starts in the arrivals (all tp ranks' when they are gathered) and in the experts' input
  // (grouped by local expert), and its rows.
  struct Block {
    int64_t arrived = 0, grouped = 0, rows = 0;
  };
  std::vector<Block> blocks;
  std::vector<int64_t> expert_begin, expert_rows;  // per local expert, in the experts' input
  Tensor in, f1, g;  // the experts' input rows, first GEMM's output and activation
  Tensor out;        // the experts' output rows, back in the permuted order [slots, hidden]
                     // (slots: the copies, or every expert's capacity when padded)
  Tensor shared_f1, shared_g;
};

// The gradients of a forward's two inputs.
struct MoeInputGrads {
  Tensor tokens;  // of `x`: partial over tp when the routing is shared (the block sums them)
  Tensor routed;  // of `x_route`
};

class MoeLayer {
 public:
  MoeLayer(Context& ctx, const spec::TransformerSpec& model);
  // y = the block's MoE MLP (its forward ops traced for `layer`). `x_route` [routed, hidden]: the
  // rows this rank routes (its sequence-parallel share under tp); `x` [tokens, hidden]: the rows
  // whose copies it makes, all of the tp group's when the routing is shared (the block's
  // gather), else x_route itself. y has x's rows: partial over tp when the routing is shared.
  Tensor forward(const MoeWeights& w, const Tensor& x_route, const Tensor& x, int32_t layer,
                 spec::Phase phase, int64_t micro_batch, MoeCache& c);
  // The gradients of x and x_route from that of y; accumulates the weights' gradients.
  MoeInputGrads backward(const MoeWeights& w, const Tensor& dy, int32_t layer, int64_t micro_batch,
                         MoeCache& c);
  int64_t local_experts() const { return local_; }
  int64_t first_expert() const { return first_; }
  // Megatron-LM's all-to-all dispatcher over tp (spec::moe_dispatches_over_tp): the layer gathers
  // and scatters its rows itself, in place of the block's sequence-parallel pair.
  bool dispatches_over_tp() const { return spec::moe_dispatches_over_tp(tp_, ep_); }
  // The all-gather dispatcher (tp > 1, no ep): the tp ranks share the routing.
  bool shares_routing() const { return tp_ > 1 && ep_ == 1; }

 private:
  Recorder::Scope op(models::OpId name, int32_t layer, spec::Phase phase, int64_t mb);
  // An ep all-to-all; `received_rows` (when known) goes to the event's shape as {rows, hidden}:
  // the rows this rank receives, from which traces::moe_load_imbalance measures the routing skew.
  Recorder::Scope exchange(models::OpId name, int64_t bytes, int32_t layer, spec::Phase phase,
                           int64_t mb, std::optional<int64_t> received_rows = std::nullopt);
  Recorder::Scope tp_exchange(models::OpId name, spec::OpClass cls, int64_t bytes, int32_t layer,
                              spec::Phase phase, int64_t mb);
  // Which of c's copies stay under their experts' capacity (all of them when dropless).
  std::vector<bool> keep_copies(const MoeCache& c) const;
  // The permuted rows [slots, hidden] -> the local experts' input, grouped by expert: sent to
  // the experts' ep ranks (`ep_op`: moe.dispatch, or moe.combine for the outputs' gradients) and
  // gathered over tp under dispatches_over_tp.
  Tensor to_experts(const Tensor& permuted, models::OpId ep_op, int32_t layer, spec::Phase phase,
                    int64_t mb, const MoeCache& c);
  // Its way back: the experts' rows, partial over tp, reduce-scattered to the ranks they came
  // from, then sent back over ep (moe.combine, or moe.dispatch for the inputs' gradients).
  Tensor from_experts(const Tensor& grouped, models::OpId ep_op, int32_t layer, spec::Phase phase,
                      int64_t mb, const MoeCache& c);
  // The shared experts' own sequence-parallel pair under dispatches_over_tp: x [T, hidden]
  // all-gathered over tp (moe.shared_all_gather), and their partial output [tp T, hidden]
  // reduce-scattered into out [T, hidden] (moe.shared_reduce_scatter).
  Tensor gather_shared_rows(const Tensor& x, int32_t layer, spec::Phase phase, int64_t mb);
  void scatter_shared_rows(const Tensor& partial, Tensor& out, int32_t layer, spec::Phase phase,
                           int64_t mb);
  // Elements each tp rank received over ep (the uneven blocks of the tp exchanges).
  std::vector<int64_t> tp_elements(const MoeCache& c) const;
  // Where the received rows go: c.blocks, c.expert_begin, c.expert_rows and c.tp_rows, from the
  // rows each ep rank sends this one for each local expert (the tp ranks' when they gather).
  void place_arrivals(const std::vector<int64_t>& incoming, MoeCache& c) const;
  // The shared experts' MLP of x (partial over tp) into y; its backward into dx.
  void shared_forward(const MoeWeights& w, const Tensor& x, Tensor& y, int32_t layer,
                      spec::Phase phase, int64_t mb, MoeCache& c);
  void shared_backward(const MoeWeights& w, const Tensor& x, const Tensor& dy, Tensor& dx,
                       int32_t layer, int64_t mb, MoeCache& c);
  // Rows in permuted (source) order <-> grouped by local expert, by the cache's blocks.
  void group_rows(const Tensor& arrived, Tensor& grouped, const MoeCache& c) const;
  void ungroup_rows(const Tensor& grouped, Tensor& arrived, const MoeCache& c) const;

  Context& ctx_;
  const spec::TransformerSpec& m_;
  int64_t experts_ = 0, top_k_ = 0, hidden_ = 0, ffn_ = 0, gate_ = 1, shared_ffn_ = 0;
  int64_t ep_ = 1, local_ = 0, first_ = 0;  // ep ranks; this rank's experts [first, first+local)
  int64_t tp_ = 1, tp_rank_ = 0;            // ffn_ and shared_ffn_ are this tp rank's widths
};

}  // namespace sextant::exec
