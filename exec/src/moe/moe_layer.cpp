// The mixture-of-experts MLP on CPU ranks.
#include "moe_layer.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/activations.hpp"
#include "sextant/models/moe_capacity.hpp"

namespace sextant::exec {

using models::OpId;

using spec::OpClass;
using spec::Phase;
using spec::Stream;

namespace {

constexpr int64_t kDropped = -1;  // MoeCache::slot of a copy over its expert's capacity

float* row(const Tensor& t, int64_t r) {
  return t.data() + r * t.dim(1);
}

// body(j, first row, rows) for each local expert j that received rows.
template <typename Body>
void for_each_expert(const MoeCache& c, Body body) {
  for (size_t j = 0; j < c.expert_rows.size(); ++j)
    if (c.expert_rows[j] > 0) body(static_cast<int64_t>(j), c.expert_begin[j], c.expert_rows[j]);
}

}  // namespace

MoeLayer::MoeLayer(Context& ctx, const spec::TransformerSpec& model) : ctx_(ctx), m_(model) {
  const spec::MoeSpec& moe = *model.moe;
  tp_ = ctx.groups->tp_size;
  tp_rank_ = ctx.groups->tp_rank;
  experts_ = moe.experts;
  top_k_ = moe.top_k;
  hidden_ = model.hidden;
  ffn_ = moe.expert_ffn_hidden / tp_;
  gate_ = model.activation == spec::Activation::kSwiglu ? 2 : 1;
  shared_ffn_ = moe.shared_experts * moe.expert_ffn_hidden / tp_;
  ep_ = ctx.groups->ep_size;
  local_ = experts_ / ep_;
  first_ = ctx.groups->ep_rank * local_;
}

Recorder::Scope MoeLayer::op(OpId name, int32_t layer, Phase phase, int64_t mb) {
  return ctx_.recorder->scope(ctx_.op(name, layer, phase, mb));
}

Recorder::Scope MoeLayer::exchange(OpId name, int64_t bytes, int32_t layer, Phase phase, int64_t mb,
                                   std::optional<int64_t> received_rows) {
  Recorder::Event e =
      ctx_.comm(name, OpClass::kAllToAll, Stream::kTpComm, bytes, ep_, phase, layer, mb);
  if (received_rows) e.shape = {*received_rows, hidden_};
  return ctx_.recorder->scope(std::move(e));
}

Recorder::Scope MoeLayer::tp_exchange(OpId name, OpClass cls, int64_t bytes, int32_t layer,
                                      Phase phase, int64_t mb) {
  return ctx_.recorder->scope(ctx_.comm(name, cls, Stream::kTpComm, bytes, tp_, phase, layer, mb));
}

void MoeLayer::group_rows(const Tensor& arrived, Tensor& grouped, const MoeCache& c) const {
  for (const MoeCache::Block& b : c.blocks)
    std::copy(row(arrived, b.arrived), row(arrived, b.arrived + b.rows), row(grouped, b.grouped));
}

void MoeLayer::ungroup_rows(const Tensor& grouped, Tensor& arrived, const MoeCache& c) const {
  for (const MoeCache::Block& b : c.blocks)
    std::copy(row(grouped, b.grouped), row(grouped, b.grouped + b.rows), row(arrived, b.arrived));
}

std::vector<bool> MoeLayer::keep_copies(const MoeCache& c) const {
  const int64_t copies = static_cast<int64_t>(c.expert.size());
  std::vector<bool> kept(static_cast<size_t>(copies), true);
  const int64_t capacity = models::expert_capacity(*m_.moe, copies);
  if (capacity == 0) return kept;
  std::vector<std::vector<int64_t>> chosen(static_cast<size_t>(experts_));
  for (int64_t i = 0; i < copies; ++i)
    chosen[static_cast<size_t>(c.expert[static_cast<size_t>(i)])].push_back(i);
  for (std::vector<int64_t>& list : chosen) {
    if (static_cast<int64_t>(list.size()) <= capacity) continue;
    std::stable_sort(list.begin(), list.end(), [&](int64_t a, int64_t b) {
      return c.weight[static_cast<size_t>(a)] > c.weight[static_cast<size_t>(b)];
    });
    for (size_t j = static_cast<size_t>(capacity); j < list.size(); ++j)
      kept[static_cast<size_t>(list[j])] = false;
  }
  return kept;
}

Tensor MoeLayer::to_experts(const Tensor& permuted, OpId ep_op, int32_t layer, Phase phase,
                            int64_t mb, const MoeCache& c) {
  Backend& be = *ctx_.backend;
  const int64_t h = hidden_;
  const int64_t rows = std::accumulate(c.expert_rows.begin(), c.expert_rows.end(), int64_t{0});
  Tensor arrived = permuted;
  if (ep_ > 1) {
    arrived = be.empty({c.tp_rows[static_cast<size_t>(dispatches_over_tp() ? tp_rank_ : 0)], h});
    const int64_t received = std::accumulate(c.received.begin(), c.received.end(), int64_t{0});
    auto s = exchange(ep_op, permuted.numel() * 4, layer, phase, mb, received / h);
    ctx_.groups->ep->all_to_all_v(permuted.data(), c.sent, arrived.data(), c.received);
  }
  if (dispatches_over_tp()) {  // every tp rank's arrivals, for this rank's columns of the experts
    Tensor gathered = be.empty({rows, h});
    auto s = tp_exchange(OpId::kMoeAllGather, OpClass::kAllGather, rows * h * 4, layer, phase, mb);
    ctx_.groups->tp->all_gather_v(arrived.data(), gathered.data(), tp_elements(c));
    arrived = gathered;
  }
  Tensor grouped = be.empty({rows, h});
  group_rows(arrived, grouped, c);
  return grouped;
}

Tensor MoeLayer::from_experts(const Tensor& grouped, OpId ep_op, int32_t layer, Phase phase,
                              int64_t mb, const MoeCache& c) {
  Backend& be = *ctx_.backend;
  const int64_t h = hidden_, rows = grouped.dim(0);
  Tensor back = be.empty({rows, h});
  ungroup_rows(grouped, back, c);
  if (dispatches_over_tp()) {  // partial over tp: summed, each rank keeping its own arrivals'
    Tensor summed = be.empty({c.tp_rows[static_cast<size_t>(tp_rank_)], h});
    auto s = tp_exchange(OpId::kMoeReduceScatter, OpClass::kReduceScatter, rows * h * 4, layer,
                         phase, mb);
    ctx_.groups->tp->reduce_scatter_v(back.data(), summed.data(), tp_elements(c));
    back = summed;
  }
  if (ep_ > 1) {
    int64_t slots = 0;
    for (int64_t n : c.sent) slots += n;
    Tensor out = be.empty({slots / h, h});
    auto s = exchange(ep_op, slots * 4, layer, phase, mb);
    ctx_.groups->ep->all_to_all_v(back.data(), c.received, out.data(), c.sent);
    back = out;
  }
  return back;
}

Tensor MoeLayer::gather_shared_rows(const Tensor& x, int32_t layer, Phase phase, int64_t mb) {
  const int64_t n = x.numel();
  Tensor all = ctx_.backend->empty({x.dim(0) * tp_, hidden_});
  auto s =
      tp_exchange(OpId::kMoeSharedAllGather, OpClass::kAllGather, n * tp_ * 4, layer, phase, mb);
  ctx_.groups->tp->all_gather(x.data(), all.data(), n);
  return all;
}

void MoeLayer::scatter_shared_rows(const Tensor& partial, Tensor& out, int32_t layer, Phase phase,
                                   int64_t mb) {
  auto s = tp_exchange(OpId::kMoeSharedReduceScatter, OpClass::kReduceScatter, partial.numel() * 4,
                       layer, phase, mb);
  ctx_.groups->tp->reduce_scatter(partial.data(), out.data(), out.numel());
}

std::vector<int64_t> MoeLayer::tp_elements(const MoeCache& c) const {
  std::vector<int64_t> out;
  for (int64_t n : c.tp_rows) out.push_back(n * hidden_);
  return out;
}

void MoeLayer::place_arrivals(const std::vector<int64_t>& incoming, MoeCache& c) const {
  // incoming: [tp ranks gathered][ep source][local expert] row counts.
  const int64_t ranks = static_cast<int64_t>(incoming.size()) / (ep_ * local_);
  auto n_of = [&](int64_t u, int64_t q, int64_t j) {
    return incoming[static_cast<size_t>((u * ep_ + q) * local_ + j)];
  };
  c.expert_rows.assign(static_cast<size_t>(local_), 0);
  c.tp_rows.assign(static_cast<size_t>(ranks), 0);
  for (int64_t u = 0; u < ranks; ++u)
    for (int64_t q = 0; q < ep_; ++q)
      for (int64_t j = 0; j < local_; ++j) {
        c.expert_rows[static_cast<size_t>(j)] += n_of(u, q, j);
        c.tp_rows[static_cast<size_t>(u)] += n_of(u, q, j);
      }
  c.expert_begin.assign(static_cast<size_t>(local_), 0);
  for (int64_t j = 1; j < local_; ++j)
    c.expert_begin[static_cast<size_t>(j)] =
        c.expert_begin[static_cast<size_t>(j - 1)] + c.expert_rows[static_cast<size_t>(j - 1)];
  c.blocks.clear();
  std::vector<int64_t> filled(static_cast<size_t>(local_), 0);
  int64_t arrived = 0;
  for (int64_t u = 0; u < ranks; ++u)
    for (int64_t q = 0; q < ep_; ++q)
      for (int64_t j = 0; j < local_; ++j) {
        const int64_t n = n_of(u, q, j);
        c.blocks.push_back(
            {arrived, c.expert_begin[static_cast<size_t>(j)] + filled[static_cast<size_t>(j)], n});
        filled[static_cast<size_t>(j)] += n;
        arrived += n;
      }
}

void MoeLayer::shared_forward(const MoeWeights& w, const Tensor& x, Tensor& y, int32_t layer,
                              Phase phase, int64_t mb, MoeCache& c) {
  Backend& be = *ctx_.backend;
  const int64_t T = x.dim(0);
  c.shared_f1 = be.empty({T, gate_ * shared_ffn_});
  c.shared_g = be.empty({T, shared_ffn_});
  {
    auto s = op(OpId::kMoeSharedFc1, layer, phase, mb);
    be.matmul(x, w.shared_fc1->compute, nullptr, c.shared_f1);
  }
  {
    auto s = op(OpId::kMoeSharedAct, layer, phase, mb);
    activation(be, m_.activation, c.shared_f1, c.shared_g);
  }
  auto s = op(OpId::kMoeSharedFc2, layer, phase, mb);
  be.matmul(c.shared_g, w.shared_fc2->compute, nullptr, y);
}

void MoeLayer::shared_backward(const MoeWeights& w, const Tensor& x, const Tensor& dy, Tensor& dx,
                               int32_t layer, int64_t mb, MoeCache& c) {
  Backend& be = *ctx_.backend;
  const Phase B = Phase::kBwd;
  const int64_t T = x.dim(0);
  Tensor dg = be.empty({T, shared_ffn_});
  {
    auto s = op(OpId::kMoeSharedFc2, layer, B, mb);
    be.matmul_backward(c.shared_g, w.shared_fc2->compute, dy, &dg, w.shared_fc2->grad, nullptr);
  }
  Tensor df1 = be.empty({T, gate_ * shared_ffn_});
  {
    auto s = op(OpId::kMoeSharedAct, layer, B, mb);
    activation_backward(be, m_.activation, c.shared_f1, dg, df1);
  }
  auto s = op(OpId::kMoeSharedFc1, layer, B, mb);
  be.matmul_backward(x, w.shared_fc1->compute, df1, &dx, w.shared_fc1->grad, nullptr);
}

Tensor MoeLayer::forward(const MoeWeights& w, const Tensor& x_route, const Tensor& x, int32_t layer,
                         Phase phase, int64_t mb, MoeCache& c) {
  Backend& be = *ctx_.backend;
  const int64_t Tr = x_route.dim(0), T = x.dim(0), h = hidden_, E = experts_, k = top_k_;
  const int64_t copies = T * k;
  c.x_route = x_route;
  c.x = x;
  Tensor logits = be.empty({Tr, E});
  {
    auto s = op(OpId::kMoeRouter, layer, phase, mb);
    be.matmul(x_route, w.router->compute, nullptr, logits);
  }
  {
    // Softmax over the experts, the top k (the lower index first on a tie), their probabilities
    // renormalised: the softmax over the chosen logits.
    auto s = op(OpId::kMoeRoute, layer, phase, mb);
    c.own_expert.assign(static_cast<size_t>(Tr * k), 0);
    c.own_weight.assign(static_cast<size_t>(Tr * k), 0.0f);
    std::vector<int32_t> order(static_cast<size_t>(E));
    for (int64_t t = 0; t < Tr; ++t) {
      const float* l = row(logits, t);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [l](int32_t a, int32_t b) {
        return l[a] > l[b] || (l[a] == l[b] && a < b);
      });
      const float top = l[order[0]];
      double sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += std::exp(static_cast<double>(l[order[j]] - top));
      for (int64_t j = 0; j < k; ++j) {
        c.own_expert[static_cast<size_t>(t * k + j)] = order[static_cast<size_t>(j)];
        c.own_weight[static_cast<size_t>(t * k + j)] =
            static_cast<float>(std::exp(static_cast<double>(l[order[j]] - top)) / sum);
      }
    }
  }
  if (shares_routing()) {
    // Each rank's weights, then its experts' indices (as floats: exact below 2^24), gathered in
    // rank order: the tokens' order, as the block's gather of the rows.
    const int64_t n = Tr * k;
    std::vector<float> mine(static_cast<size_t>(2 * n));
    std::copy(c.own_weight.begin(), c.own_weight.end(), mine.begin());
    std::transform(c.own_expert.begin(), c.own_expert.end(), mine.begin() + n,
                   [](int32_t e) { return static_cast<float>(e); });
    std::vector<float> all(static_cast<size_t>(2 * n * tp_));
    {
      auto s = tp_exchange(OpId::kMoeRouteAllGather, OpClass::kAllGather, 2 * n * tp_ * 4, layer,
                           phase, mb);
      ctx_.groups->tp->all_gather(mine.data(), all.data(), 2 * n);
    }
    c.weight.resize(static_cast<size_t>(copies));
    c.expert.resize(static_cast<size_t>(copies));
    for (int64_t u = 0; u < tp_; ++u)
      for (int64_t i = 0; i < n; ++i) {
        c.weight[static_cast<size_t>(u * n + i)] = all[static_cast<size_t>(2 * u * n + i)];
        c.expert[static_cast<size_t>(u * n + i)] =
            static_cast<int32_t>(all[static_cast<size_t>(2 * u * n + n + i)]);
      }
  } else {
    c.weight = c.own_weight;
    c.expert = c.own_expert;
  }
  // Copies grouped by expert, in token order within an expert; with a capacity, at most that
  // many of each expert's (keep_copies), every expert's group padded with zero rows to it.
  const std::vector<bool> kept = keep_copies(c);
  const int64_t capacity = models::expert_capacity(*m_.moe, copies);
  std::vector<int64_t> per_expert(static_cast<size_t>(E), capacity);
  if (capacity == 0)
    for (int32_t e : c.expert) ++per_expert[static_cast<size_t>(e)];
  const int64_t slots = std::accumulate(per_expert.begin(), per_expert.end(), int64_t{0});
  Tensor permuted = capacity > 0 ? be.zeros({slots, h}) : be.empty({slots, h});
  {
    auto s = op(OpId::kMoePermute, layer, phase, mb);
    std::vector<int64_t> next(static_cast<size_t>(E), 0);
    for (int64_t e = 1; e < E; ++e)
      next[static_cast<size_t>(e)] = next[static_cast<size_t>(e - 1)] + per_expert[e - 1];
    c.slot.assign(static_cast<size_t>(copies), kDropped);
    for (int64_t i = 0; i < copies; ++i) {
      if (!kept[static_cast<size_t>(i)]) continue;
      const int64_t at = next[static_cast<size_t>(c.expert[static_cast<size_t>(i)])]++;
      c.slot[static_cast<size_t>(i)] = at;
      std::copy(row(x, i / k), row(x, i / k + 1), row(permuted, at));
    }
  }
  // Rows each ep rank sends this one for each of its local experts (the counts travel first, as
  // Megatron-LM's dispatcher's do; the simulator prices the rows only), and over tp those of
  // every tp rank.
  std::vector<int64_t> incoming(static_cast<size_t>(E));
  if (ep_ > 1) {
    ctx_.groups->ep->all_to_all_host(per_expert.data(), incoming.data(), local_);
  } else {
    incoming = per_expert;
  }
  c.sent.assign(static_cast<size_t>(ep_), 0);
  c.received.assign(static_cast<size_t>(ep_), 0);
  for (int64_t q = 0; q < ep_; ++q)
    for (int64_t j = 0; j < local_; ++j) {
      c.sent[static_cast<size_t>(q)] += per_expert[static_cast<size_t>(q * local_ + j)] * h;
      c.received[static_cast<size_t>(q)] += incoming[static_cast<size_t>(q * local_ + j)] * h;
    }
  if (dispatches_over_tp()) {
    std::vector<int64_t> mine(static_cast<size_t>(tp_ * E));
    for (int64_t u = 0; u < tp_; ++u)
      std::copy(incoming.begin(), incoming.end(), mine.begin() + u * E);
    std::vector<int64_t> all(static_cast<size_t>(tp_ * E));
    ctx_.groups->tp->all_to_all_host(mine.data(), all.data(), E);
    place_arrivals(all, c);
  } else {
    place_arrivals(incoming, c);
  }
  const int64_t rows = std::accumulate(c.expert_rows.begin(), c.expert_rows.end(), int64_t{0});
  c.in = to_experts(permuted, OpId::kMoeDispatch, layer, phase, mb, c);
  c.f1 = be.empty({rows, gate_ * ffn_});
  c.g = be.empty({rows, ffn_});
  Tensor f2 = be.empty({rows, h});
  {
    auto s = op(OpId::kMoeFc1, layer, phase, mb);
    for_each_expert(c, [&](int64_t j, int64_t at, int64_t n) {
      Tensor out = c.f1.rows(at, n);
      be.matmul(c.in.rows(at, n), w.fc1[static_cast<size_t>(j)]->compute, nullptr, out);
    });
  }
  {
    auto s = op(OpId::kMoeAct, layer, phase, mb);
    if (rows > 0) activation(be, m_.activation, c.f1, c.g);
  }
  {
    auto s = op(OpId::kMoeFc2, layer, phase, mb);
    for_each_expert(c, [&](int64_t j, int64_t at, int64_t n) {
      Tensor out = f2.rows(at, n);
      be.matmul(c.g.rows(at, n), w.fc2[static_cast<size_t>(j)]->compute, nullptr, out);
    });
  }
  c.out = from_experts(f2, OpId::kMoeCombine, layer, phase, mb, c);
  Tensor y = be.zeros({T, h});
  if (w.shared_fc1 != nullptr) {
    if (dispatches_over_tp()) {
      // The shared experts over every tp rank's rows, their partial output scattered back.
      c.shared_x = gather_shared_rows(x, layer, phase, mb);
      Tensor partial = be.zeros({T * tp_, h});
      shared_forward(w, c.shared_x, partial, layer, phase, mb, c);
      scatter_shared_rows(partial, y, layer, phase, mb);
    } else {
      shared_forward(w, x, y, layer, phase, mb, c);
    }
  }
  {
    auto s = op(OpId::kMoeUnpermute, layer, phase, mb);
    for (int64_t i = 0; i < copies; ++i) {
      if (c.slot[static_cast<size_t>(i)] == kDropped) continue;
      const float wi = c.weight[static_cast<size_t>(i)];
      const float* from = row(c.out, c.slot[static_cast<size_t>(i)]);
      float* to = row(y, i / k);
      for (int64_t d = 0; d < h; ++d) to[d] += wi * from[d];
    }
  }
  return y;
}

MoeInputGrads MoeLayer::backward(const MoeWeights& w, const Tensor& dy, int32_t layer, int64_t mb,
                                 MoeCache& c) {
  Backend& be = *ctx_.backend;
  const Phase B = Phase::kBwd;
  const int64_t T = dy.dim(0), Tr = c.x_route.dim(0), h = hidden_, E = experts_, k = top_k_;
  const int64_t copies = T * k;
  const int64_t rows = c.in.dim(0);
  // (The padding's rows, and a dropped copy's weight, get no gradient: zeros, since the padding
  // travels through the experts' backward, where a stale value could be inf or NaN.)
  const int64_t slots = c.out.dim(0);
  const bool padded = m_.moe->capacity_factor > 0;
  Tensor dout = padded ? be.zeros({slots, h}) : be.empty({slots, h});
  std::vector<float> dweight(static_cast<size_t>(copies), 0.0f);
  {
    auto s = op(OpId::kMoeUnpermute, layer, B, mb);
    for (int64_t i = 0; i < copies; ++i) {
      if (c.slot[static_cast<size_t>(i)] == kDropped) continue;
      const float wi = c.weight[static_cast<size_t>(i)];
      const float* g = row(dy, i / k);
      const float* out = row(c.out, c.slot[static_cast<size_t>(i)]);
      float* d = row(dout, c.slot[static_cast<size_t>(i)]);
      double dot = 0;
      for (int64_t j = 0; j < h; ++j) {
        d[j] = wi * g[j];
        dot += static_cast<double>(g[j]) * out[j];
      }
      dweight[static_cast<size_t>(i)] = static_cast<float>(dot);
    }
  }
  Tensor dx = be.zeros({T, h});
  if (w.shared_fc1 != nullptr) {
    if (dispatches_over_tp()) {
      const Tensor dys = gather_shared_rows(dy, layer, B, mb);
      Tensor partial = be.zeros({T * tp_, h});
      shared_backward(w, c.shared_x, dys, partial, layer, mb, c);
      scatter_shared_rows(partial, dx, layer, B, mb);
    } else {
      shared_backward(w, c.x, dy, dx, layer, mb, c);
    }
  }
  // The outputs' gradients to the experts' ranks, in the order the outputs came back.
  Tensor df2 = to_experts(dout, OpId::kMoeCombine, layer, B, mb, c);
  Tensor dg = be.empty({rows, ffn_});
  Tensor df1 = be.empty({rows, gate_ * ffn_});
  Tensor din = be.empty({rows, h});
  {
    auto s = op(OpId::kMoeFc2, layer, B, mb);
    for_each_expert(c, [&](int64_t j, int64_t at, int64_t n) {
      Tensor d = dg.rows(at, n);
      Param& p = *w.fc2[static_cast<size_t>(j)];
      be.matmul_backward(c.g.rows(at, n), p.compute, df2.rows(at, n), &d, p.grad, nullptr);
    });
  }
  {
    auto s = op(OpId::kMoeAct, layer, B, mb);
    if (rows > 0) activation_backward(be, m_.activation, c.f1, dg, df1);
  }
  {
    auto s = op(OpId::kMoeFc1, layer, B, mb);
    for_each_expert(c, [&](int64_t j, int64_t at, int64_t n) {
      Tensor d = din.rows(at, n);
      Param& p = *w.fc1[static_cast<size_t>(j)];
      be.matmul_backward(c.in.rows(at, n), p.compute, df1.rows(at, n), &d, p.grad, nullptr);
    });
  }
  // The inputs' gradients (partial over tp's columns) summed back to the ranks they came from,
  // then to the tokens' ranks.
  const Tensor dpermuted = from_experts(din, OpId::kMoeDispatch, layer, B, mb, c);
  {
    auto s = op(OpId::kMoePermute, layer, B, mb);
    for (int64_t i = 0; i < copies; ++i) {
      if (c.slot[static_cast<size_t>(i)] == kDropped) continue;
      const float* from = row(dpermuted, c.slot[static_cast<size_t>(i)]);
      float* to = row(dx, i / k);
      for (int64_t j = 0; j < h; ++j) to[j] += from[j];
    }
  }
  // The routing's weights' gradients: partial over tp when every rank computed every token's
  // copies on its columns, summed back to the rank that routed each token.
  std::vector<float> own_dweight(static_cast<size_t>(Tr * k));
  if (shares_routing()) {
    auto s = tp_exchange(OpId::kMoeRouteReduceScatter, OpClass::kReduceScatter, copies * 4, layer,
                         B, mb);
    ctx_.groups->tp->reduce_scatter(dweight.data(), own_dweight.data(), Tr * k);
  } else {
    own_dweight = dweight;
  }
  Tensor dlogits = be.zeros({Tr, E});
  {
    auto s = op(OpId::kMoeRoute, layer, B, mb);
    for (int64_t t = 0; t < Tr; ++t) {
      double mean = 0;
      for (int64_t j = 0; j < k; ++j)
        mean += static_cast<double>(c.own_weight[static_cast<size_t>(t * k + j)]) *
                own_dweight[static_cast<size_t>(t * k + j)];
      float* dl = row(dlogits, t);
      for (int64_t j = 0; j < k; ++j) {
        const size_t i = static_cast<size_t>(t * k + j);
        dl[c.own_expert[i]] = static_cast<float>(c.own_weight[i] * (own_dweight[i] - mean));
      }
    }
  }
  MoeInputGrads grads;
  grads.tokens = dx;
  grads.routed = be.zeros({Tr, h});
  auto s = op(OpId::kMoeRouter, layer, B, mb);
  be.matmul_backward(c.x_route, w.router->compute, dlogits, &grads.routed, w.router->grad, nullptr);
  return grads;
}

}  // namespace sextant::exec
