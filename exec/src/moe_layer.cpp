// The mixture-of-experts MLP on CPU ranks.
#include "moe_layer.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "activations.hpp"

namespace sextant::exec {

using models::OpId;

using spec::OpClass;
using spec::Phase;
using spec::Stream;

namespace {

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
  experts_ = moe.experts;
  top_k_ = moe.top_k;
  hidden_ = model.hidden;
  ffn_ = moe.expert_ffn_hidden;
  gate_ = model.activation == spec::Activation::kSwiglu ? 2 : 1;
  shared_ffn_ = moe.shared_experts * moe.expert_ffn_hidden;
  ep_ = ctx.groups->ep_size;
  local_ = experts_ / ep_;
  first_ = ctx.groups->ep_rank * local_;
}

Recorder::Scope MoeLayer::op(OpId name, int32_t layer, Phase phase, int64_t mb) {
  return ctx_.recorder->scope(ctx_.op(name, layer, phase, mb));
}

Recorder::Scope MoeLayer::exchange(OpId name, int64_t bytes, int32_t layer, Phase phase,
                                   int64_t mb) {
  return ctx_.recorder->scope(
      ctx_.comm(name, OpClass::kAllToAll, Stream::kTpComm, bytes, ep_, phase, layer, mb));
}

void MoeLayer::group_rows(const Tensor& arrived, Tensor& grouped, const MoeCache& c) const {
  for (const MoeCache::Block& b : c.blocks)
    std::copy(row(arrived, b.arrived), row(arrived, b.arrived + b.rows), row(grouped, b.grouped));
}

void MoeLayer::ungroup_rows(const Tensor& grouped, Tensor& arrived, const MoeCache& c) const {
  for (const MoeCache::Block& b : c.blocks)
    std::copy(row(grouped, b.grouped), row(grouped, b.grouped + b.rows), row(arrived, b.arrived));
}

Tensor MoeLayer::forward(const MoeWeights& w, const Tensor& x, int32_t layer, Phase phase,
                         int64_t mb, MoeCache& c) {
  Backend& be = *ctx_.backend;
  const int64_t T = x.dim(0), h = hidden_, E = experts_, k = top_k_, copies = T * k;
  c.x = x;
  Tensor logits = be.empty({T, E});
  {
    auto s = op(OpId::kMoeRouter, layer, phase, mb);
    be.matmul(x, w.router->compute, nullptr, logits);
  }
  {
    // Softmax over the experts, the top k (the lower index first on a tie), their probabilities
    // renormalised: the softmax over the chosen logits.
    auto s = op(OpId::kMoeRoute, layer, phase, mb);
    c.expert.assign(static_cast<size_t>(copies), 0);
    c.weight.assign(static_cast<size_t>(copies), 0.0f);
    std::vector<int32_t> order(static_cast<size_t>(E));
    for (int64_t t = 0; t < T; ++t) {
      const float* l = row(logits, t);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [l](int32_t a, int32_t b) {
        return l[a] > l[b] || (l[a] == l[b] && a < b);
      });
      const float top = l[order[0]];
      double sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += std::exp(static_cast<double>(l[order[j]] - top));
      for (int64_t j = 0; j < k; ++j) {
        c.expert[static_cast<size_t>(t * k + j)] = order[static_cast<size_t>(j)];
        c.weight[static_cast<size_t>(t * k + j)] =
            static_cast<float>(std::exp(static_cast<double>(l[order[j]] - top)) / sum);
      }
    }
  }
  // Copies grouped by expert, in token order within an expert.
  std::vector<int64_t> per_expert(static_cast<size_t>(E), 0);
  for (int32_t e : c.expert) ++per_expert[static_cast<size_t>(e)];
  Tensor permuted = be.empty({copies, h});
  {
    auto s = op(OpId::kMoePermute, layer, phase, mb);
    std::vector<int64_t> next(static_cast<size_t>(E), 0);
    for (int64_t e = 1; e < E; ++e)
      next[static_cast<size_t>(e)] = next[static_cast<size_t>(e - 1)] + per_expert[e - 1];
    c.slot.assign(static_cast<size_t>(copies), 0);
    for (int64_t i = 0; i < copies; ++i) {
      const int64_t at = next[static_cast<size_t>(c.expert[static_cast<size_t>(i)])]++;
      c.slot[static_cast<size_t>(i)] = at;
      std::copy(row(x, i / k), row(x, i / k + 1), row(permuted, at));
    }
  }
  // Rows each ep rank sends this one for each of its local experts (the counts travel first, as
  // Megatron-LM's dispatcher's do; the simulator prices the rows only).
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
  c.expert_rows.assign(static_cast<size_t>(local_), 0);
  for (int64_t q = 0; q < ep_; ++q)
    for (int64_t j = 0; j < local_; ++j)
      c.expert_rows[static_cast<size_t>(j)] += incoming[static_cast<size_t>(q * local_ + j)];
  c.expert_begin.assign(static_cast<size_t>(local_), 0);
  for (int64_t j = 1; j < local_; ++j)
    c.expert_begin[static_cast<size_t>(j)] =
        c.expert_begin[static_cast<size_t>(j - 1)] + c.expert_rows[static_cast<size_t>(j - 1)];
  const int64_t rows = std::accumulate(c.expert_rows.begin(), c.expert_rows.end(), int64_t{0});
  c.blocks.clear();
  {
    std::vector<int64_t> filled(static_cast<size_t>(local_), 0);
    int64_t arrived = 0;
    for (int64_t q = 0; q < ep_; ++q)
      for (int64_t j = 0; j < local_; ++j) {
        const int64_t n = incoming[static_cast<size_t>(q * local_ + j)];
        c.blocks.push_back(
            {arrived, c.expert_begin[static_cast<size_t>(j)] + filled[static_cast<size_t>(j)], n});
        filled[static_cast<size_t>(j)] += n;
        arrived += n;
      }
  }
  Tensor arrived = permuted;
  if (ep_ > 1) {
    arrived = be.empty({rows, h});
    auto s = exchange(OpId::kMoeDispatch, copies * h * 4, layer, phase, mb);
    ctx_.groups->ep->all_to_all_v(permuted.data(), c.sent, arrived.data(), c.received);
  }
  c.in = be.empty({rows, h});
  group_rows(arrived, c.in, c);
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
  Tensor back = be.empty({rows, h});
  ungroup_rows(f2, back, c);
  c.out = back;
  if (ep_ > 1) {
    c.out = be.empty({copies, h});
    auto s = exchange(OpId::kMoeCombine, copies * h * 4, layer, phase, mb);
    ctx_.groups->ep->all_to_all_v(back.data(), c.received, c.out.data(), c.sent);
  }
  Tensor y = be.zeros({T, h});
  if (w.shared_fc1 != nullptr) {
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
  {
    auto s = op(OpId::kMoeUnpermute, layer, phase, mb);
    for (int64_t i = 0; i < copies; ++i) {
      const float wi = c.weight[static_cast<size_t>(i)];
      const float* from = row(c.out, c.slot[static_cast<size_t>(i)]);
      float* to = row(y, i / k);
      for (int64_t d = 0; d < h; ++d) to[d] += wi * from[d];
    }
  }
  return y;
}

Tensor MoeLayer::backward(const MoeWeights& w, const Tensor& dy, int32_t layer, int64_t mb,
                          MoeCache& c) {
  Backend& be = *ctx_.backend;
  const Phase B = Phase::kBwd;
  const int64_t T = dy.dim(0), h = hidden_, E = experts_, k = top_k_, copies = T * k;
  const int64_t rows = c.in.dim(0);
  Tensor dout = be.empty({copies, h});
  std::vector<float> dweight(static_cast<size_t>(copies));
  {
    auto s = op(OpId::kMoeUnpermute, layer, B, mb);
    for (int64_t i = 0; i < copies; ++i) {
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
    be.matmul_backward(c.x, w.shared_fc1->compute, df1, &dx, w.shared_fc1->grad, nullptr);
  }
  // The outputs' gradients to the experts' ranks, in the order the outputs came back.
  Tensor arrived = dout;
  if (ep_ > 1) {
    arrived = be.empty({rows, h});
    auto s = exchange(OpId::kMoeCombine, copies * h * 4, layer, B, mb);
    ctx_.groups->ep->all_to_all_v(dout.data(), c.sent, arrived.data(), c.received);
  }
  Tensor df2 = be.empty({rows, h});
  group_rows(arrived, df2, c);
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
  // The inputs' gradients back to the tokens' ranks.
  Tensor back = be.empty({rows, h});
  ungroup_rows(din, back, c);
  Tensor dpermuted = back;
  if (ep_ > 1) {
    dpermuted = be.empty({copies, h});
    auto s = exchange(OpId::kMoeDispatch, copies * h * 4, layer, B, mb);
    ctx_.groups->ep->all_to_all_v(back.data(), c.received, dpermuted.data(), c.sent);
  }
  {
    auto s = op(OpId::kMoePermute, layer, B, mb);
    for (int64_t i = 0; i < copies; ++i) {
      const float* from = row(dpermuted, c.slot[static_cast<size_t>(i)]);
      float* to = row(dx, i / k);
      for (int64_t j = 0; j < h; ++j) to[j] += from[j];
    }
  }
  Tensor dlogits = be.zeros({T, E});
  {
    auto s = op(OpId::kMoeRoute, layer, B, mb);
    for (int64_t t = 0; t < T; ++t) {
      double mean = 0;
      for (int64_t j = 0; j < k; ++j)
        mean += static_cast<double>(c.weight[static_cast<size_t>(t * k + j)]) *
                dweight[static_cast<size_t>(t * k + j)];
      float* dl = row(dlogits, t);
      for (int64_t j = 0; j < k; ++j) {
        const size_t i = static_cast<size_t>(t * k + j);
        dl[c.expert[i]] = static_cast<float>(c.weight[i] * (dweight[i] - mean));
      }
    }
  }
  auto s = op(OpId::kMoeRouter, layer, B, mb);
  be.matmul_backward(c.x, w.router->compute, dlogits, &dx, w.router->grad, nullptr,
                     /*accumulate_dx=*/true);
  return dx;
}

}  // namespace sextant::exec
