// The MLP of a mixture-of-experts block on CPU ranks (fp32, host memory), dropless, as the
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
#pragma once

#include <cstdint>
#include <vector>

#include "sextant/exec/context.hpp"
#include "sextant/exec/parameters.hpp"
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
  Tensor x;                       // the input [tokens, hidden]
  std::vector<int32_t> expert;    // [tokens * top_k] the chosen experts
  std::vector<float> weight;      // [tokens * top_k] their weights
  std::vector<int64_t> slot;      // [tokens * top_k] the copy's row in the permuted order
  std::vector<int64_t> sent;      // elements sent to each ep rank (the permuted rows' blocks)
  std::vector<int64_t> received;  // elements received from each ep rank
  // The received blocks (source rank, local expert) in arrival order: where each starts in the
  // arrivals and in the experts' input (grouped by local expert), and its rows.
  struct Block {
    int64_t arrived = 0, grouped = 0, rows = 0;
  };
  std::vector<Block> blocks;
  std::vector<int64_t> expert_begin, expert_rows;  // per local expert, in the experts' input
  Tensor in, f1, g;  // the experts' input rows, first GEMM's output and activation
  Tensor out;        // the experts' output rows, back in the permuted order [copies, hidden]
  Tensor shared_f1, shared_g;
};

class MoeLayer {
 public:
  MoeLayer(Context& ctx, const spec::TransformerSpec& model);
  // y = the block's MoE MLP of x [tokens, hidden] (its forward ops traced for `layer`).
  Tensor forward(const MoeWeights& w, const Tensor& x, int32_t layer, spec::Phase phase,
                 int64_t micro_batch, MoeCache& c);
  // The gradient of x from the gradient of y; accumulates the weights' gradients.
  Tensor backward(const MoeWeights& w, const Tensor& dy, int32_t layer, int64_t micro_batch,
                  MoeCache& c);
  int64_t local_experts() const { return local_; }
  int64_t first_expert() const { return first_; }

 private:
  Recorder::Scope op(models::OpId name, int32_t layer, spec::Phase phase, int64_t mb);
  Recorder::Scope exchange(models::OpId name, int64_t bytes, int32_t layer, spec::Phase phase,
                           int64_t mb);
  // Rows in permuted (source) order <-> grouped by local expert, by the cache's blocks.
  void group_rows(const Tensor& arrived, Tensor& grouped, const MoeCache& c) const;
  void ungroup_rows(const Tensor& grouped, Tensor& arrived, const MoeCache& c) const;

  Context& ctx_;
  const spec::TransformerSpec& m_;
  int64_t experts_ = 0, top_k_ = 0, hidden_ = 0, ffn_ = 0, gate_ = 1, shared_ffn_ = 0;
  int64_t ep_ = 1, local_ = 0, first_ = 0;  // ep ranks; this rank's experts [first, first+local)
};

}  // namespace sextant::exec
