// A transformer block as a per-op graph (op_graph.hpp): norm, QKV, attention, projection,
// residual, norm, FC1, activation, FC2, residual, each an einsum over named dimensions, so that any
// op can be split its own way. Today's uniform layouts are particular splits of it: data
// parallelism splits the batch of every op over one mesh axis; Megatron-LM's tensor parallelism
// (Shoeybi et al. 2019, §3) splits the heads of QKV, attention and the projection and the FFN of
// FC1, the activation and FC2 over another, which leaves the projection and FC2 partial sums over
// it; sequence parallelism (Korthikanti et al. 2022, §4.2.2) splits the sequence of the norms and
// residuals over that axis too. The resharding rule then gives their collectives.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "sextant/models/op_graph.hpp"
#include "sextant/models/op_id.hpp"

namespace sextant::models {

struct BlockDims {
  int64_t batch = 1;  // sequences of one micro-batch over the whole mesh
  int64_t seq = 1;
  int64_t hidden = 1;
  int64_t heads = 1;
  int64_t head_dim = 1;
  int64_t ffn = 1;
  int64_t kv_heads = 0;  // grouped-query attention's key/value heads; 0: as many as heads
  int64_t gate = 1;      // FC1's outputs per FFN column: 2 for SwiGLU
};

// Dimension names: b (batch), s (sequence), h (hidden), a (heads), c (QKV's outputs per head:
// (heads + 2 kv_heads) head_dim / heads), d (head_dim), g (the gate), f (ffn). Tensors: x (the
// block's input), x1 (normed), qkv, ctx (attention's output), attn (the projection's), r1 (first
// residual), x2, fc1, act, fc2, y. Throws InputError when the key/value heads do not share out
// over the heads evenly.
OpGraph transformer_block_graph(const BlockDims& dims);

// The op of the block graph each op of a dense block's lowering belongs to (models/src/
// transformer_lowering.cpp: "attn.qkv" -> "qkv", the attention core's ops -> "attention"); "" for
// the layer's own (the weights' autocast) and its collectives, which per-op splits rebuild.
std::string_view block_op_of(OpId id);

struct BlockSplit {
  std::map<std::string, OpSplit> ops;  // by node name
  spec::TensorLayout stream;           // the residual stream's layout: the block's input and output
};

// A uniform layout as per-op splits: the batch over `data_axis`, Megatron's tensor parallelism
// over `tensor_axis` and, with `sequence_parallel`, the norms' and residuals' sequence over it too
// ("" for an axis: not split that way).
BlockSplit megatron_block_split(const BlockDims& dims, const std::string& data_axis,
                                const std::string& tensor_axis, bool sequence_parallel);

}  // namespace sextant::models
