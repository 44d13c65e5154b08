// A transformer block under per-op splits (split_block.hpp).
#include "split_block.hpp"

#include <fmt/format.h>

#include "core/activations.hpp"

namespace sextant::exec {

using models::GraphNode;
using models::GraphStep;
using models::OpId;
using spec::Phase;

namespace {

// Columns [from_col, from_col + width) of `from` into [to_col, to_col + width) of `to`, both
// [rows, cols].
void copy_columns(DeviceMemory& be, const Tensor& from, int64_t from_col, Tensor& to,
                  int64_t to_col, int64_t width, int64_t rows, int64_t cols) {
  const int64_t shift = from_col - to_col;
  be.copy_box(from, {0, 1, 0, rows, 0, cols}, to, {0, 1, 0, rows, shift, shift + cols},
              {0, 1, 0, rows, from_col, from_col + width}, 1, false);
}

// The elementwise and norm ops' trace names, by graph op.
OpId own_op(const std::string& op) {
  if (op == "norm1") return OpId::kAttnNorm;
  if (op == "norm2") return OpId::kMlpNorm;
  if (op == "residual1") return OpId::kAttnResidual;
  if (op == "residual2") return OpId::kMlpResidual;
  if (op == "activation") return OpId::kMlpAct;
  if (op == "qkv") return OpId::kAttnQkv;
  if (op == "proj") return OpId::kAttnProj;
  if (op == "fc1") return OpId::kMlpFc1;
  SEXTANT_CHECK(op == "fc2", "no traced op for graph op {}", op);
  return OpId::kMlpFc2;
}

}  // namespace

SplitBlock::SplitBlock(const GptParts& parts, ParamStore& store, int32_t layer,
                       const models::PerOpBlock& block, const MeshRanks& ranks)
    : GptLayer(parts),
      layer_(layer),
      block_(block),
      ranks_(ranks),
      walk_(block.walk(block.chosen, 4)) {
  const std::string b = fmt::format("block{}", layer - 1);
  weights_["qkv"] = &store.get(b + ".attn.qkv.weight");
  weights_["proj"] = &store.get(b + ".attn.proj.weight");
  weights_["fc1"] = &store.get(b + ".mlp.fc1.weight");
  weights_["fc2"] = &store.get(b + ".mlp.fc2.weight");
  if (model().bias) {
    biases_["qkv"] = &store.get(b + ".attn.qkv.bias");
    biases_["residual1"] = &store.get(b + ".attn.proj.bias");
    biases_["fc1"] = &store.get(b + ".mlp.fc1.bias");
    biases_["residual2"] = &store.get(b + ".mlp.fc2.bias");
  }
  for (const auto& [op, name] : {std::pair{"norm1", ".ln1"}, std::pair{"norm2", ".ln2"}})
    norms_[op] = {&store.get(b + name + ".gamma"),
                  layernorm() ? &store.get(b + name + ".beta") : nullptr};
}

MeshTensor SplitBlock::make(const spec::TensorLayout& l) const {
  return {backend().empty({l.shard_elements(ranks_.mesh())}), l};
}

spec::TensorLayout SplitBlock::output_layout(const GraphNode& n) const {
  return block_.sharded(n, block_.chosen).output;
}

spec::TensorLayout SplitBlock::gradient_layout(const GraphNode& n, size_t i) const {
  return models::shard_op(ranks_.mesh(), models::gradient_op(n.op, i, n.backward_factor),
                          block_.chosen.ops.at(n.op.name))
      .output;
}

MeshTensor SplitBlock::reshard(const MeshTensor& x, const GraphStep& step, int64_t mb) {
  return traced_reshard(ctx(), ranks_, x, step, layer_, mb);
}

Tensor SplitBlock::forward(const MicroBatch& mb, const Tensor& x) {
  const models::OpGraph& g = block_.graph;
  Cache& cache = caches_[mb.index];
  std::map<std::string, MeshTensor> values;                         // by tensor
  std::map<std::pair<std::string, std::string>, MeshTensor> moved;  // by (op, tensor) read
  values[g.input] = {x, block_.uniform.stream};
  auto operand = [&](const std::string& op, const std::string& tensor) -> const MeshTensor& {
    const auto it = moved.find({op, tensor});
    return it != moved.end() ? it->second : values.at(tensor);
  };
  for (const GraphStep& s : walk_.steps) {
    if (s.phase != Phase::kFwd) continue;
    if (s.kind == GraphStep::Kind::kReshard) {
      MeshTensor next = reshard(operand(s.node, s.tensor), s, mb.index);
      moved[{s.node, s.tensor}] = std::move(next);
      continue;
    }
    const GraphNode& n = node(s.node);
    Saved& saved = cache[n.op.name];
    for (const models::GraphOperand& in : n.inputs)
      if (!in.param) saved.inputs.push_back(operand(n.op.name, in.tensor));
    values[n.output] = run(n, saved, mb.index);
  }
  const Tensor y = operand(g.output, g.output).data;
  return y.view({y.numel() / model().hidden, model().hidden});
}

Tensor SplitBlock::backward(const MicroBatch& mb, const Tensor& dy) {
  const models::OpGraph& g = block_.graph;
  Cache& cache = caches_.at(mb.index);
  std::map<std::string, std::vector<MeshTensor>> made;          // each reader's gradient
  std::map<std::pair<std::string, int64_t>, MeshTensor> moved;  // by (tensor, reader)
  made[g.output].push_back({dy, block_.uniform.stream});
  auto gradient = [&](const std::string& tensor, int64_t j) -> const MeshTensor& {
    const auto it = moved.find({tensor, j});
    return it != moved.end() ? it->second : made.at(tensor).at(static_cast<size_t>(j));
  };
  // The gradient of `tensor`: its readers' summed, each moved to the layout its producer wants.
  auto summed = [&](const std::string& tensor) {
    const size_t n = made.at(tensor).size();
    if (n == 1) return gradient(tensor, 0);
    MeshTensor sum = make(gradient(tensor, 0).layout);
    backend().copy(gradient(tensor, 0).data, sum.data);
    for (size_t j = 1; j < n; ++j) {
      const MeshTensor& more = gradient(tensor, static_cast<int64_t>(j));
      SEXTANT_CHECK(ranks_.local_extents(more.layout) == ranks_.local_extents(sum.layout),
                    "gradients of {} in different layouts", tensor);
      backend().add(sum.data, more.data, sum.data);
    }
    return sum;
  };
  for (const GraphStep& s : walk_.steps) {
    if (s.phase != Phase::kBwd || s.kind == GraphStep::Kind::kGradientSum) continue;
    if (s.kind == GraphStep::Kind::kReshard) {
      MeshTensor next = reshard(gradient(s.tensor, s.source), s, mb.index);
      moved[{s.tensor, s.source}] = std::move(next);
      continue;
    }
    const GraphNode& n = node(s.node);
    std::vector<MeshTensor> inputs =
        run_backward(n, cache.at(n.op.name), summed(n.output), mb.index);
    size_t next = 0;
    for (const models::GraphOperand& in : n.inputs)
      if (!in.param) made[in.tensor].push_back(std::move(inputs.at(next++)));
  }
  const Tensor dx = summed(g.input).data;
  caches_.erase(mb.index);
  return dx.view({dx.numel() / model().hidden, model().hidden});
}

MeshTensor SplitBlock::run(const GraphNode& n, Saved& s, int64_t mb) {
  const std::string& op = n.op.name;
  if (op == "qkv" || op == "proj" || op == "fc1" || op == "fc2") return linear(n, s, mb);
  if (op == "attention") return attention(n, s, mb);
  MeshTensor out = make(output_layout(n));
  auto scope = rec(ctx().op(own_op(op), layer_, Phase::kFwd, mb));
  const int64_t h = model().hidden;
  if (op == "norm1" || op == "norm2") {
    const int64_t rows = out.data.numel() / h;
    s.mean = backend().empty({rows});
    s.rstd = backend().empty({rows});
    Tensor y = out.data.view({rows, h});
    norm(s.inputs[0].data.view({rows, h}), *norms_.at(op).first, norms_.at(op).second, y, s.mean,
         s.rstd);
  } else if (op == "activation") {
    const int64_t f = ranks_.local_extents(out.layout).back(), rows = out.data.numel() / f;
    Tensor y = out.data.view({rows, f});
    activation(backend(), model().activation,
               s.inputs[0].data.view({rows, s.inputs[0].data.numel() / rows}), y);
  } else {
    backend().add(s.inputs[0].data, s.inputs[1].data, out.data);
    if (const auto it = biases_.find(op); it != biases_.end()) {
      Tensor y = out.data.view(
          {out.data.numel() / it->second->compute.numel(), it->second->compute.numel()});
      backend().bias_add(y, it->second->compute);
    }
  }
  return out;
}

std::vector<MeshTensor> SplitBlock::run_backward(const GraphNode& n, Saved& s,
                                                 const MeshTensor& dout, int64_t mb) {
  const std::string& op = n.op.name;
  if (op == "qkv" || op == "proj" || op == "fc1" || op == "fc2")
    return linear_backward(n, s, dout, mb);
  if (op == "attention") return attention_backward(n, s, dout, mb);
  auto scope = rec(ctx().op(own_op(op), layer_, Phase::kBwd, mb));
  if (op == "residual1" || op == "residual2") {
    if (const auto it = biases_.find(op); it != biases_.end())
      backend().bias_backward(
          dout.data.view({dout.data.numel() / it->second->grad.numel(), it->second->grad.numel()}),
          it->second->grad);
    return {dout, dout};
  }
  MeshTensor dx = make(gradient_layout(n, 0));
  const int64_t h = model().hidden;
  if (op == "norm1" || op == "norm2") {
    const int64_t rows = dx.data.numel() / h;
    Tensor d = dx.data.view({rows, h});
    norm_backward(s.inputs[0].data.view({rows, h}), *norms_.at(op).first, norms_.at(op).second,
                  s.mean, s.rstd, dout.data.view({rows, h}), d);
  } else {  // the activation
    const int64_t f = ranks_.local_extents(dout.layout).back(), rows = dout.data.numel() / f;
    const int64_t width = dx.data.numel() / rows;
    Tensor d = dx.data.view({rows, width});
    activation_backward(backend(), model().activation, s.inputs[0].data.view({rows, width}),
                        dout.data.view({rows, f}), d);
  }
  return {dx};
}

MeshTensor SplitBlock::linear(const GraphNode& n, const Saved& s, int64_t mb) {
  // out[rows, N] = x[rows, K] W[K, N]: the rank's blocks, rows the dimensions x keeps.
  MeshTensor out = make(output_layout(n));
  const Param& w = *weights_.at(n.op.name);
  const int64_t n_cols = w.compute.dim(1), rows = out.data.numel() / n_cols;
  const int64_t k = w.compute.dim(0);
  SEXTANT_CHECK(s.inputs[0].data.numel() == rows * k, "{}: input of {} elements for [{}, {}]",
                n.op.name, s.inputs[0].data.numel(), rows, k);
  Tensor y = out.data.view({rows, n_cols});
  // The bias once in a partial sum: on the ranks first along the axes it is partial over.
  const Param* bias = nullptr;
  if (const auto it = biases_.find(n.op.name); it != biases_.end()) {
    bias = it->second;
    for (const std::string& axis : out.layout.partial)
      if (ranks_.axis(axis).coord != 0) bias = nullptr;
  }
  auto scope = rec(ctx().op(own_op(n.op.name), layer_, Phase::kFwd, mb));
  backend().matmul(s.inputs[0].data.view({rows, k}), w.compute,
                   bias != nullptr ? &bias->compute : nullptr, y);
  return out;
}

std::vector<MeshTensor> SplitBlock::linear_backward(const GraphNode& n, const Saved& s,
                                                    const MeshTensor& dout, int64_t mb) {
  Param& w = *weights_.at(n.op.name);
  const int64_t n_cols = w.compute.dim(1), rows = dout.data.numel() / n_cols;
  const int64_t k = w.compute.dim(0);
  MeshTensor dx = make(gradient_layout(n, 0));
  Tensor d = dx.data.view({rows, k});
  auto scope = rec(ctx().op(own_op(n.op.name), layer_, Phase::kBwd, mb));
  const auto bias = biases_.find(n.op.name);
  backend().matmul_backward(s.inputs[0].data.view({rows, k}), w.compute,
                            dout.data.view({rows, n_cols}), &d, w.grad,
                            bias != biases_.end() ? &bias->second->grad : nullptr);
  return {dx};
}

QkvLayout SplitBlock::qkv_layout(const MeshTensor& qkv) const {
  const std::vector<int64_t> e = ranks_.local_extents(qkv.layout);  // b, s, a, c
  const int64_t group = model().heads / model().kv_heads;
  SEXTANT_CHECK(e[2] % group == 0, "{} heads of attention on a rank, groups of {}", e[2], group);
  return {e[0], e[1], e[2], e[2] / group, model().head_dim()};
}

void SplitBlock::to_kernel_layout(const Tensor& from, Tensor& to, const QkvLayout& l, bool back) {
  const int64_t rows = l.batch * l.seq, cols = l.width(), hd = l.head_dim, g = l.group();
  for (int64_t lg = 0; lg < l.kv_heads; ++lg) {
    // The group's q heads, its k and its v: their first column in the graph's layout and in the
    // kernels', and their width.
    const int64_t at = lg * (g + 2) * hd;
    const int64_t parts[3][3] = {{at, lg * g * hd, g * hd},
                                 {at + g * hd, (l.heads + lg) * hd, hd},
                                 {at + (g + 1) * hd, (l.heads + l.kv_heads + lg) * hd, hd}};
    for (const auto& p : parts)
      copy_columns(backend(), from, p[back ? 1 : 0], to, p[back ? 0 : 1], p[2], rows, cols);
  }
}

MeshTensor SplitBlock::attention(const GraphNode& n, Saved& s, int64_t mb) {
  Backend& be = backend();
  const QkvLayout l = qkv_layout(s.inputs[0]);
  const int64_t rows = l.batch * l.seq;
  s.qkv = be.empty({rows, l.width()});
  s.probs = be.empty({l.batch, l.heads, l.seq, l.seq});
  const bool rope = model().position_embedding == spec::PositionEmbedding::kRope;
  if (rope) {  // (the copy into the kernels' layout goes with the first op)
    auto scope = rec(ctx().op(OpId::kAttnRope, layer_, Phase::kFwd, mb));
    to_kernel_layout(s.inputs[0].data, s.qkv, l, false);
    be.rope(s.qkv, l, kRopeBase, false);
  }
  {
    auto scope = rec(ctx().op(OpId::kAttnScores, layer_, Phase::kFwd, mb));
    if (!rope) to_kernel_layout(s.inputs[0].data, s.qkv, l, false);
    be.attention_scores(s.qkv, l, s.probs);
  }
  {
    auto scope = rec(ctx().op(OpId::kAttnSoftmax, layer_, Phase::kFwd, mb));
    be.causal_softmax(s.probs, l.seq);
  }
  MeshTensor out = make(output_layout(n));
  Tensor o = out.data.view({rows, l.heads * l.head_dim});
  auto scope = rec(ctx().op(OpId::kAttnContext, layer_, Phase::kFwd, mb));
  be.attention_context(s.probs, s.qkv, l, o);
  return out;
}

std::vector<MeshTensor> SplitBlock::attention_backward(const GraphNode& n, const Saved& s,
                                                       const MeshTensor& dout, int64_t mb) {
  Backend& be = backend();
  const QkvLayout l = qkv_layout(s.inputs[0]);
  const int64_t rows = l.batch * l.seq;
  const Phase B = Phase::kBwd;
  Tensor dprobs = be.empty({l.batch, l.heads, l.seq, l.seq});
  Tensor dqkv = be.empty({rows, l.width()});
  {
    auto scope = rec(ctx().op(OpId::kAttnContext, layer_, B, mb));
    be.attention_context_backward(s.probs, s.qkv, dout.data.view({rows, l.heads * l.head_dim}), l,
                                  dprobs, dqkv);
  }
  {
    auto scope = rec(ctx().op(OpId::kAttnSoftmax, layer_, B, mb));
    be.causal_softmax_backward(s.probs, dprobs, l.seq);
  }
  MeshTensor dx = make(gradient_layout(n, 0));
  const bool rope = model().position_embedding == spec::PositionEmbedding::kRope;
  {
    auto scope = rec(ctx().op(OpId::kAttnScores, layer_, B, mb));
    be.attention_scores_backward(dprobs, s.qkv, l, dqkv);
    if (!rope) to_kernel_layout(dqkv, dx.data, l, true);
  }
  if (rope) {  // dq and dk are gradients of the rotated q and k: rotated back
    auto scope = rec(ctx().op(OpId::kAttnRope, layer_, B, mb));
    be.rope(dqkv, l, kRopeBase, true);
    to_kernel_layout(dqkv, dx.data, l, true);
  }
  return {dx};
}

}  // namespace sextant::exec
