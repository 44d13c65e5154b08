// A chain of fc layers under per-op splits (split_fc_chain.hpp).
#include "split_fc_chain.hpp"

#include <algorithm>
#include <cmath>

#include "sextant/models/op_id.hpp"

namespace sextant::exec {

using models::OpId;
using models::OpName;
using spec::Phase;

namespace {

std::vector<models::FcLayer> fc_layers(const std::vector<FcChainLayer>& layers) {
  std::vector<models::FcLayer> out;
  for (const FcChainLayer& l : layers)
    out.push_back({l.name, static_cast<size_t>(l.layer), l.in, l.out});
  return out;
}

bool splits_over(const spec::TensorDim& d, std::string_view axis) {
  return std::find(d.axes.begin(), d.axes.end(), axis) != d.axes.end();
}

}  // namespace

std::vector<FcChainLayer> cnn_fc_chain_layers(const std::vector<cnn::Unit>& units) {
  std::vector<FcChainLayer> out;
  for (size_t l = units.size(); l-- > 0 && units[l].kind == spec::CnnLayerKind::kFc;) {
    const cnn::Unit& u = units[l];
    out.insert(out.begin(), {static_cast<int32_t>(l), u.name, u.name + ".fc", u.in.c, u.out.c,
                             u.relu, u.bias, u.last, OpId::kUnitFc, OpId::kUnitRelu});
  }
  return out;
}

SplitFcChain::SplitFcChain(Context& ctx, std::vector<FcChainLayer> layers, int64_t micro_batch)
    : ctx_(ctx),
      micro_batch_(micro_batch),
      chain_(models::fc_chain(fc_layers(layers), micro_batch, ctx.groups->replica_size,
                              ctx.groups->tp_size)),
      chosen_(models::fc_chain_splits(*ctx.lowered, chain_, ctx.plan->per_op)),
      ranks_(chain_.mesh, {{spec::kDataAxis, {ctx.groups->replicas, ctx.groups->replica_rank}},
                           {spec::kTensorAxis, {ctx.groups->tp, ctx.groups->tp_rank}}}),
      walk_(models::walk_graph(chain_.mesh, chain_.graph, chosen_, chain_.features, chain_.logits,
                               4)) {
  for (size_t k = 0; k < chain_.graph.nodes.size(); ++k) {
    const models::GraphNode& n = chain_.graph.nodes[k];
    const models::OpSplit& split = chosen_.at(n.op.name);
    Layer l;
    l.desc = layers[k];
    l.node = &n;
    l.sharded = models::shard_op(chain_.mesh, n.op, split);
    l.input_gradient = models::shard_op(chain_.mesh, models::gradient_op(n.op, 0), split).output;
    l.rows_whole = models::fc_rows_whole(split);
    index_[layers[k].layer] = l;
  }
}

void SplitFcChain::add_params(int32_t layer, uint64_t seed, std::vector<ParamSpec>& specs) const {
  const Layer& l = index_.at(layer);
  const FcChainLayer& u = l.desc;
  const spec::TensorLayout& weight = l.sharded.operands[1];  // [f_in, f_out]
  const std::vector<int64_t> origin = ranks_.origin(weight);
  const std::vector<int64_t> local = ranks_.local_extents(weight);
  const int64_t columns = u.out, r0 = origin[0], c0 = origin[1], width = local[1];
  // He initialisation; the classifier starts small, so that the first loss is near
  // log(classes), as the unsplit layers are drawn (cnn_params.cpp, mlp_stage.cpp).
  const float std_dev = u.classifier ? 0.01f : std::sqrt(2.0f / static_cast<float>(u.in));
  ParamSpec w;
  w.name = u.params + ".weight";
  w.layer = layer;
  w.shape = local;
  w.init = [=, name = w.name](int64_t i) {
    return std_dev * init_normal(seed, name, (r0 + i / width) * columns + c0 + i % width);
  };
  w.tp_replicated = true;
  w.replica_whole = l.rows_whole;
  w.replica_copy = std::none_of(weight.dims.begin(), weight.dims.end(),
                                [](const auto& d) { return splits_over(d, spec::kDataAxis); });
  specs.push_back(w);
  if (!u.bias) return;
  ParamSpec b;
  b.name = u.params + ".bias";
  b.layer = layer;
  b.shape = {width};
  b.init = [](int64_t) { return 0.0f; };
  b.decay = false;
  b.tp_replicated = true;
  b.replica_whole = l.rows_whole;
  b.replica_copy = !splits_over(weight.dims[1], spec::kDataAxis);
  specs.push_back(b);
}

void SplitFcChain::bind(ParamStore& store) {
  for (auto& [layer, l] : index_) {
    l.weight = &store.get(l.desc.params + ".weight");
    if (l.desc.bias) l.bias_param = &store.get(l.desc.params + ".bias");
  }
}

MeshTensor SplitFcChain::reshards(const std::string& node, Phase phase, MeshTensor x, int32_t layer,
                                  int64_t mb) {
  for (const models::GraphStep& s : walk_.steps)
    if (s.phase == phase && s.kind == models::GraphStep::Kind::kReshard && s.node == node)
      x = traced_reshard(ctx_, ranks_, x, s, layer, mb);
  return x;
}

Tensor SplitFcChain::forward(int32_t layer, const Tensor& x, int64_t mb) {
  Backend& be = *ctx_.backend;
  const Layer& l = index_.at(layer);
  const FcChainLayer& u = l.desc;
  const std::string& name = l.node->op.name;
  State& st = state_[mb];
  const bool first = l.node->inputs[0].tensor == chain_.graph.input;
  MeshTensor in = first ? MeshTensor{x.view({x.numel()}), chain_.features} : st.value;
  in = reshards(name, Phase::kFwd, std::move(in), layer, mb);
  // out[rows, cols] = in[rows, depth] W[depth, cols]: the rank's blocks.
  const std::vector<int64_t> e = ranks_.local_extents(l.sharded.output);
  const int64_t rows = e[0], cols = e[1], depth = l.weight->compute.dim(0);
  MeshTensor out{be.empty({rows * cols}), l.sharded.output};
  Tensor y = out.data.view({rows, cols});
  // The bias once in a partial sum: on the ranks first along the axes it is partial over.
  const Param* bias = l.bias_param;
  for (const std::string& axis : out.layout.partial)
    if (ranks_.axis(axis).coord != 0) bias = nullptr;
  {
    auto s = ctx_.recorder->scope(ctx_.op(OpName(name, u.product), layer, Phase::kFwd, mb));
    be.matmul(in.data.view({rows, depth}), l.weight->compute,
              bias != nullptr ? &bias->compute : nullptr, y);
  }
  Saved& saved = st.layers[layer];
  saved.input = std::move(in);
  if (u.relu) {
    saved.pre = y;
    Tensor a = be.empty({rows, cols});
    auto s = ctx_.recorder->scope(ctx_.op(OpName(name, u.activation), layer, Phase::kFwd, mb));
    be.relu(y, a);
    out.data = a.view({rows * cols});
  }
  if (l.node->output == chain_.graph.output)
    out = reshards(chain_.graph.output, Phase::kFwd, std::move(out), layer, mb);
  st.value = out;
  return l.node->output == chain_.graph.output ? out.data.view({micro_batch_, u.out}) : out.data;
}

Tensor SplitFcChain::backward(int32_t layer, const Tensor& dy, int64_t mb) {
  Backend& be = *ctx_.backend;
  const Layer& l = index_.at(layer);
  const FcChainLayer& u = l.desc;
  const std::string& name = l.node->op.name;
  State& st = state_.at(mb);
  const Saved& saved = st.layers.at(layer);
  const bool last = l.node->output == chain_.graph.output;
  MeshTensor d = last ? MeshTensor{dy.view({dy.numel()}), chain_.logits} : st.gradient;
  d = reshards(name, Phase::kBwd, std::move(d), layer, mb);
  const std::vector<int64_t> e = ranks_.local_extents(d.layout);
  const int64_t rows = e[0], cols = e[1], depth = l.weight->compute.dim(0);
  Tensor g = d.data.view({rows, cols});
  if (u.relu) {
    Tensor dr = be.empty({rows, cols});
    auto s = ctx_.recorder->scope(ctx_.op(OpName(name, u.activation), layer, Phase::kBwd, mb));
    be.relu_backward(saved.pre, g, dr);
    g = dr;
  }
  MeshTensor dx{be.empty({rows * depth}), l.input_gradient};
  Tensor dxv = dx.data.view({rows, depth});
  {
    auto s = ctx_.recorder->scope(ctx_.op(OpName(name, u.product), layer, Phase::kBwd, mb));
    be.matmul_backward(saved.input.data.view({rows, depth}), l.weight->compute, g, &dxv,
                       l.weight->grad, l.bias_param != nullptr ? &l.bias_param->grad : nullptr);
  }
  st.layers.erase(layer);
  if (l.node->inputs[0].tensor != chain_.graph.input) {
    st.gradient = dx;
    return dx.data;
  }
  dx = reshards(chain_.graph.input, Phase::kBwd, std::move(dx), layer, mb);
  return dx.data.view({micro_batch_, u.in});
}

}  // namespace sextant::exec
