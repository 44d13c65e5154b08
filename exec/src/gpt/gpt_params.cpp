// A GPT stage's parameters on one rank.
#include "gpt_params.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>

namespace sextant::exec {

bool gpt_moe_layer(const spec::TransformerSpec& m, int32_t layer, int32_t head_layer) {
  return m.moe && layer > 0 && layer < head_layer && layer - 1 >= m.moe->dense_layers;
}

namespace {

// Column c of a local shard of a column-parallel weight whose global columns are consecutive
// groups of `width` (gate | up), each split over the t ranks -> global column.
int64_t column_of(int64_t c, int64_t width, int64_t t, int64_t r) {
  const int64_t local = width / t;
  return c / local * width + r * local + c % local;
}

class Builder {
 public:
  Builder(const spec::TransformerSpec& m, const GptSplit& split, uint64_t seed)
      : m_(m),
        s_(split),
        seed_(seed),
        h_(m.hidden),
        gate_(m.activation == spec::Activation::kSwiglu ? 2 : 1),
        proj_std_(kInitStd / std::sqrt(2.0f * static_cast<float>(m.layers))) {}

  GptParams build(const std::vector<int32_t>& layers, int32_t head_layer, bool has_embedding) {
    const int64_t h = h_;
    for (int32_t layer : layers) {
      if (layer == 0) {
        embedding_table("embed.table", 0, false);
        if (m_.position_embedding == spec::PositionEmbedding::kLearned)
          add("embed.position", 0, {m_.max_positions, h},
              normal("wpe", kInitStd, [](int64_t i) { return i; }), true, true);
      } else if (layer == head_layer) {
        add("head.norm.gamma", layer, {h}, constant(1), false, true);
        if (layernorm()) add("head.norm.beta", layer, {h}, constant(0), false, true);
        if (!m_.tied_embeddings && s_.head != nullptr) {
          split_head(layer);
        } else if (!m_.tied_embeddings) {
          add("head.weight", layer, {s_.vocab_local, h}, vocab_rows("lm_head"), true, false);
        } else if (!has_embedding) {
          embedding_table("head.tied_table", layer, true);
        }
      } else if (s_.grid) {
        grid_block(fmt::format("block{}", layer - 1), layer);
      } else if (s_.per_op != nullptr) {
        split_block(fmt::format("block{}", layer - 1), layer);
      } else {
        block(fmt::format("block{}", layer - 1), layer, gpt_moe_layer(m_, layer, head_layer));
      }
    }
    return std::move(out_);
  }

 private:
  template <typename Index>
  std::function<float(int64_t)> normal(std::string name, float std_dev, Index global_index) const {
    return [seed = seed_, name = std::move(name), std_dev, global_index](int64_t i) {
      return std_dev * init_normal(seed, name, global_index(i));
    };
  }
  static std::function<float(int64_t)> constant(float v) {
    return [v](int64_t) { return v; };
  }
  void add(std::string name, int32_t layer, std::vector<int64_t> shape,
           std::function<float(int64_t)> init, bool decay, bool replicated,
           bool tied_copy = false) {
    out_.specs.push_back(
        {std::move(name), layer, std::move(shape), std::move(init), decay, replicated, tied_copy});
    out_.specs.back().tp_partial = replicated && s_.sequence_parallel;
  }
  bool layernorm() const { return m_.norm == spec::Norm::kLayerNorm; }

  // Vocabulary-parallel rows [r*vl, (r+1)*vl) of the global table `global`; padded rows are 0.
  std::function<float(int64_t)> vocab_rows(std::string global) const {
    return [seed = seed_, global = std::move(global), r = s_.r, vl = s_.vocab_local, h = h_,
            vocab = m_.vocab](int64_t i) {
      const int64_t row = r * vl + i / h;
      return row < vocab ? kInitStd * init_normal(seed, global, row * h + i % h) : 0.0f;
    };
  }
  // The output weights under a per-op split of the logits: the rank's block of vocabulary rows
  // (stored [V, h] as the table), whole on every replica's gradient when the replicas share the
  // tokens (Param::replica_whole), partial over t when the tp ranks split them.
  void split_head(int32_t layer) {
    const models::PerOpHead& head = *s_.head;
    const models::ShardedOp sh = head.sharded(head.chosen);
    const spec::TensorLayout& w = sh.operands[1];  // [h, V]
    const int64_t v0 = s_.mesh->origin(w)[1], rows = s_.mesh->local_extents(w)[1];
    ParamSpec p{
        "head.weight", layer, {rows, h_}, [seed = seed_, v0, h = h_, vocab = m_.vocab](int64_t i) {
          const int64_t row = v0 + i / h;
          return row < vocab ? kInitStd * init_normal(seed, "lm_head", row * h + i % h) : 0.0f;
        }};
    p.tp_replicated = w.split_by(spec::kTensorAxis) == nullptr;
    p.tp_partial = p.tp_replicated && sh.operands[0].split_by(spec::kTensorAxis) != nullptr;
    p.replica_whole =
        head.rows_whole_over_replicas(head.chosen) && head.mesh.size(spec::kDataAxis) > 1;
    p.replica_copy = w.split_by(spec::kDataAxis) == nullptr;
    out_.specs.push_back(std::move(p));
  }
  void embedding_table(std::string name, int32_t layer, bool tied_copy) {
    add(std::move(name), layer, {s_.vocab_local, h_}, vocab_rows("wte"), true, false, tied_copy);
  }

  // A block under Megatron-LM's 1D split: QKV and FC1 column-parallel, the projection and FC2
  // row-parallel, norms and the row-parallel biases whole on every tp rank.
  void block(const std::string& b, int32_t layer, bool moe) {
    const int64_t h = h_, t = s_.t, r = s_.r;
    const int64_t hd = h;  // heads * head_dim
    const int64_t f = m_.ffn_hidden;
    add(b + ".ln1.gamma", layer, {h}, constant(1), false, true);
    if (layernorm()) add(b + ".ln1.beta", layer, {h}, constant(0), false, true);
    // Global columns: q (hd), k and v (kv_hidden each); this rank holds its share of each.
    const int64_t kvd = m_.kv_hidden(), full = hd + 2 * kvd, local = full / t;
    auto qkv_column = [=](int64_t c) {
      const int64_t q = hd / t, kv = kvd / t;
      if (c < q) return r * q + c;
      if (c < q + kv) return hd + r * kv + (c - q);
      return hd + kvd + r * kv + (c - q - kv);
    };
    add(b + ".attn.qkv.weight", layer, {h, local},
        normal(b + ".attn.qkv.weight", kInitStd,
               [=](int64_t i) { return i / local * full + qkv_column(i % local); }),
        true, false);
    if (m_.bias) add(b + ".attn.qkv.bias", layer, {local}, constant(0), false, false);
    add(b + ".attn.proj.weight", layer, {hd / t, h},
        normal(b + ".attn.proj.weight", proj_std_,
               [=](int64_t i) { return (r * hd / t + i / h) * h + i % h; }),
        true, false);
    if (m_.bias) add(b + ".attn.proj.bias", layer, {h}, constant(0), false, true);
    add(b + ".ln2.gamma", layer, {h}, constant(1), false, true);
    if (layernorm()) add(b + ".ln2.beta", layer, {h}, constant(0), false, true);
    if (moe) return moe_mlp(b, layer);
    const int64_t g = gate_;
    add(b + ".mlp.fc1.weight", layer, {h, g * f / t},
        normal(b + ".mlp.fc1.weight", kInitStd,
               [=](int64_t i) {
                 int64_t row = i / (g * f / t), col = i % (g * f / t);
                 return row * g * f + column_of(col, f, t, r);
               }),
        true, false);
    if (m_.bias) add(b + ".mlp.fc1.bias", layer, {g * f / t}, constant(0), false, false);
    add(b + ".mlp.fc2.weight", layer, {f / t, h},
        normal(b + ".mlp.fc2.weight", proj_std_,
               [=](int64_t i) { return (r * f / t + i / h) * h + i % h; }),
        true, false);
    if (m_.bias) add(b + ".mlp.fc2.bias", layer, {h}, constant(0), false, true);
  }

  // A MoE block's MLP on this rank: the router whole on every tp rank (each routes its own
  // tokens under sequence parallelism, spec::moe_tensor_parallel_problem: its gradient a partial
  // sum over tp, as a norm's); this rank's routed experts under their global index (every layout
  // draws expert e alike) and the shared experts as one MLP, each split over tp as the dense MLP
  // is (FC1's columns, gate and up apart; FC2's rows). Routed experts are Param::expert under ep.
  void moe_mlp(const std::string& b, int32_t layer) {
    const int64_t h = h_, f = m_.moe->expert_ffn_hidden, g = gate_, E = m_.moe->experts;
    const int64_t t = s_.t, r = s_.r;
    auto weight = [&](std::string name, std::vector<int64_t> shape,
                      std::function<float(int64_t)> init, bool replicated, bool expert) {
      ParamSpec s;
      s.name = std::move(name);
      s.layer = layer;
      s.shape = std::move(shape);
      s.init = std::move(init);
      s.tp_replicated = replicated;
      s.tp_partial = replicated && s_.sequence_parallel;
      s.expert = expert;
      out_.specs.push_back(std::move(s));
    };
    // An expert of width `width` (the shared experts together: their summed width).
    auto expert = [&](const std::string& x, int64_t width, bool routed) {
      const int64_t local = width / t;
      weight(x + ".fc1.weight", {h, g * local},
             normal(x + ".fc1.weight", kInitStd,
                    [=](int64_t i) {
                      return i / (g * local) * g * width + column_of(i % (g * local), width, t, r);
                    }),
             false, routed);
      weight(x + ".fc2.weight", {local, h},
             normal(x + ".fc2.weight", proj_std_,
                    [=](int64_t i) { return (r * local + i / h) * h + i % h; }),
             false, routed);
    };
    weight(b + ".moe.router.weight", {h, E},
           normal(b + ".moe.router.weight", kInitStd, [](int64_t i) { return i; }), true, false);
    for (int64_t e = 0; e < s_.local_experts; ++e)
      expert(fmt::format("{}.moe.expert{}", b, s_.first_expert + e), f, s_.experts_split);
    if (const int64_t fs = m_.moe->shared_experts * f; fs > 0) expert(b + ".moe.shared", fs, false);
  }

  // A dense block under per-op splits (split_block.hpp): the norms whole on every rank; each
  // weight the rank's block of it under its op's split, its elements at their global index (QKV's
  // columns per head group: its q heads, then k and v, as the block graph's c lists them).
  void split_block(const std::string& b, int32_t layer) {
    const models::PerOpBlock& block = *s_.per_op;
    const int64_t h = h_, hd = m_.head_dim(), heads = m_.heads, kv = m_.kv_heads;
    const int64_t group = heads / kv, full = (heads + 2 * kv) * hd, c_extent = full / heads;
    auto norm = [&](const std::string& name, const char* op) {
      const bool partial = block.params_partial_over(op, spec::kTensorAxis, block.chosen);
      for (const char* part : {".gamma", ".beta"}) {
        if (part[1] == 'b' && !layernorm()) continue;
        ParamSpec p{name + part, layer, {h}, constant(part[1] == 'g' ? 1.0f : 0.0f), false, true};
        p.tp_partial = partial;
        out_.specs.push_back(std::move(p));
      }
    };
    // Global element of QKV's [h, a, c] at (row, head, column of the head): the head's group
    // holds its q heads' columns, then its k and its v head's.
    auto qkv_index = [=](const std::vector<int64_t>& g) {
      const int64_t gi = g[1] / group, o = (g[1] % group) * c_extent + g[2];
      const int64_t q = group * hd;
      const int64_t column = o < q        ? gi * q + o
                             : o < q + hd ? heads * hd + gi * hd + (o - q)
                                          : heads * hd + kv * hd + gi * hd + (o - q - hd);
      return g[0] * full + column;
    };
    auto weight = [&](const char* op, const std::string& name, float std_dev) {
      const models::GraphNode& n = block.node(op);
      const spec::TensorLayout l = block.sharded(n, block.chosen).operands[1];
      const std::vector<int64_t> local = s_.mesh->local_extents(l), at = s_.mesh->origin(l);
      std::vector<int64_t> global;
      for (const spec::TensorDim& d : l.dims) global.push_back(d.extent);
      int64_t rows = 1, cols = 1;  // the contracted dimensions, then the output's
      for (size_t i = 0; i < l.dims.size(); ++i)
        (std::find(n.op.output.begin(), n.op.output.end(), l.dims[i].name) == n.op.output.end()
             ? rows
             : cols) *= local[i];
      const bool qkv = std::string_view(op) == "qkv";
      ParamSpec p;
      p.name = name;
      p.layer = layer;
      p.shape = {rows, cols};
      p.init = [=, seed = seed_](int64_t i) {
        std::vector<int64_t> g(local.size());
        for (size_t k = local.size(); k-- > 0;) {
          g[k] = at[k] + i % local[k];
          i /= local[k];
        }
        int64_t index = 0;
        if (qkv) {
          index = qkv_index(g);
        } else {
          for (size_t k = 0; k < g.size(); ++k) index = index * global[k] + g[k];
        }
        return std_dev * init_normal(seed, name, index);
      };
      p.tp_replicated = l.split_by(spec::kTensorAxis) == nullptr;
      p.tp_partial = block.params_partial_over(op, spec::kTensorAxis, block.chosen);
      out_.specs.push_back(std::move(p));
    };
    // A bias (zeros) over the op's output columns, or h for a residual's.
    auto bias = [&](const char* op, const std::string& name) {
      const std::optional<spec::TensorLayout> l = block.bias_layout(op, block.chosen);
      if (!l) return;
      ParamSpec p{name,        layer, {l->shard_elements(block.mesh)},
                  constant(0), false, l->split_by(spec::kTensorAxis) == nullptr};
      p.tp_partial = block.params_partial_over(op, spec::kTensorAxis, block.chosen);
      out_.specs.push_back(std::move(p));
    };
    norm(b + ".ln1", "norm1");
    weight("qkv", b + ".attn.qkv.weight", kInitStd);
    bias("qkv", b + ".attn.qkv.bias");
    weight("proj", b + ".attn.proj.weight", proj_std_);
    bias("residual1", b + ".attn.proj.bias");
    norm(b + ".ln2", "norm2");
    weight("fc1", b + ".mlp.fc1.weight", kInitStd);
    bias("fc1", b + ".mlp.fc1.bias");
    weight("fc2", b + ".mlp.fc2.weight", proj_std_);
    bias("residual2", b + ".mlp.fc2.bias");
  }

  // A block on a 3D tensor grid (grid_linear.hpp): the norms whole; each weight's block, of
  // which the rank holds the z-th 1/z of the elements (row-major, Param::grid_sharded); each bias
  // split as its layer's outputs. QKV and FC1: block (x rank, y rank), their columns split over
  // y as Megatron-LM splits them over tp; projection and FC2: block (y rank, x rank).
  void grid_block(const std::string& b, int32_t layer) {
    const uint64_t seed = seed_;
    const int64_t h = h_, f = m_.ffn_hidden, g = gate_, kvd = m_.kv_hidden(), full = h + 2 * kvd;
    const int64_t X = s_.x, Y = s_.y, Z = s_.z, gx = s_.gx, gy = s_.gy, gz = s_.gz;
    auto whole = [&](std::string name, int64_t n, float v, bool replicated) {
      add(std::move(name), layer, {n}, constant(v), false, replicated);
    };
    // Rows [row0, row0 + kl) of the global [K, N] weight, local column c at global column
    // column(c), nl columns; the rank's shard of that block.
    auto weight = [&](std::string name, int64_t N, int64_t row0, int64_t kl, int64_t nl,
                      std::function<int64_t(int64_t)> column, float std_dev) {
      const int64_t shard = kl * nl / Z, first = gz * shard;
      ParamSpec spec{name, layer, {shard}, nullptr, true, false, false};
      spec.init = [=](int64_t i) {
        const int64_t at = first + i, row = at / nl;
        return std_dev * init_normal(seed, name, (row0 + row) * N + column(at % nl));
      };
      spec.grid_sharded = true;
      out_.specs.push_back(std::move(spec));
    };
    auto bias = [&](std::string name, int64_t n, bool split_over_y) {
      (split_over_y ? out_.alike_over_x : out_.alike_over_y).insert(name);
      add(std::move(name), layer, {n}, constant(0), false, false);
    };
    whole(b + ".ln1.gamma", h, 1, true);
    if (layernorm()) whole(b + ".ln1.beta", h, 0, true);
    // q (h), k and v (kvd each): the y-th share of each, as the 1D split's qkv_column.
    auto qkv_column = [=](int64_t c) {
      const int64_t q = h / Y, kv = kvd / Y;
      if (c < q) return gy * q + c;
      if (c < q + kv) return h + gy * kv + (c - q);
      return h + kvd + gy * kv + (c - q - kv);
    };
    weight(b + ".attn.qkv.weight", full, gx * h / X, h / X, full / Y, qkv_column, kInitStd);
    if (m_.bias) bias(b + ".attn.qkv.bias", full / Y, true);
    auto plain = [](int64_t first) { return [first](int64_t c) { return first + c; }; };
    weight(b + ".attn.proj.weight", h, gy * h / Y, h / Y, h / X, plain(gx * h / X), proj_std_);
    if (m_.bias) bias(b + ".attn.proj.bias", h / X, false);
    whole(b + ".ln2.gamma", h, 1, true);
    if (layernorm()) whole(b + ".ln2.beta", h, 0, true);
    weight(
        b + ".mlp.fc1.weight", g * f, gx * h / X, h / X, g * f / Y,
        [=](int64_t c) { return column_of(c, f, Y, gy); }, kInitStd);
    if (m_.bias) bias(b + ".mlp.fc1.bias", g * f / Y, true);
    weight(b + ".mlp.fc2.weight", h, gy * f / Y, f / Y, h / X, plain(gx * h / X), proj_std_);
    if (m_.bias) bias(b + ".mlp.fc2.bias", h / X, false);
  }

  const spec::TransformerSpec& m_;
  const GptSplit s_;
  const uint64_t seed_;
  const int64_t h_, gate_;
  const float proj_std_;
  GptParams out_;
};

}  // namespace

GptParams gpt_params(const spec::TransformerSpec& m, const GptSplit& split,
                     const std::vector<int32_t>& layers, int32_t head_layer, bool has_embedding,
                     uint64_t seed) {
  return Builder(m, split, seed).build(layers, head_layer, has_embedding);
}

}  // namespace sextant::exec
