// The layers of a GPT stage (gpt_stage.cpp): the embedding, the transformer blocks and the output
// layer are one lowered layer each (models::LoweredModel::layers), with their own parameters and
// what their forward keeps for backward, by micro-batch. The stage runs this rank's layers in
// order; what they share (the shapes on this rank, the layer pairs' operators, the context-
// parallel attention, the experts) lives here, built once by the stage.
#pragma once

#include <cstdint>
#include <vector>

#include "linear_pairs.hpp"
#include "moe/moe_layer.hpp"
#include "sextant/exec/context.hpp"
#include "sextant/exec/cp_attention.hpp"
#include "sextant/exec/parameters.hpp"
#include "sextant/spec/model_spec.hpp"
#include "train/stage_model.hpp"

namespace sextant::exec {

inline constexpr float kRopeBase = 1e4f;  // rotary embeddings' base: RoFormer, Llama 1 and 2

// A micro-batch's shapes on this rank.
struct GptShape {
  int64_t t = 1, r = 0;    // the layer group (Groups::tp) and the rank's place in it
  int64_t batch = 0;       // sequences per micro-batch (a z slice's on a grid)
  int64_t split = 1;       // ranks splitting the heads and the ffn: tp, or a grid's y
  int64_t seq = 0;         // tokens per sequence
  int64_t rows = 0;        // rows between the layer pairs' GEMMs: batch x (the rank's) seq
  int64_t local_rows = 0;  // rows in norms and residuals (rows / tp under sequence parallelism)
  int64_t h = 0, heads_local = 0, f_local = 0;
  int64_t gate = 1;         // FC1's outputs per ffn column: 2 for SwiGLU
  int64_t vocab_local = 0;  // rows of the rank's (padded) vocabulary shard
  int64_t vocab_valid = 0;  // of which real tokens
  bool sequence_parallel = false;
  QkvLayout qkv;  // this rank's heads (and its rows of each sequence, under cp)
};

// What the layers of one stage share; owned by the stage, which outlives its layers.
struct GptParts {
  Context* ctx = nullptr;
  const spec::TransformerSpec* model = nullptr;
  GptShape shape;
  LinearPairs* pairs = nullptr;  // the layer pairs and the tp collectives
  GridLinear* grid = nullptr;    // on a 3D tensor grid, else null
  CpAttention* cp = nullptr;     // under context parallelism, else null
  MoeLayer* moe = nullptr;       // a mixture of experts' MLP, else null
};

class GptLayer {
 public:
  explicit GptLayer(const GptParts& parts) : parts_(parts) {}
  virtual ~GptLayer() = default;
  GptLayer(const GptLayer&) = delete;
  GptLayer& operator=(const GptLayer&) = delete;
  // Forward of micro-batch `mb` from `x` (the embedding reads the batch's tokens instead); keeps
  // what backward needs. The output layer returns an empty tensor and adds to its loss.
  virtual Tensor forward(const MicroBatch& mb, const Tensor& x) = 0;
  // Backward of micro-batch `mb` from the gradient of the layer's output (the output layer starts
  // from its loss); frees what forward kept. The embedding returns an empty tensor.
  virtual Tensor backward(const MicroBatch& mb, const Tensor& dy) = 0;

 protected:
  Context& ctx() const { return *parts_.ctx; }
  Backend& backend() const { return *parts_.ctx->backend; }
  const spec::TransformerSpec& model() const { return *parts_.model; }
  const GptShape& shape() const { return parts_.shape; }
  LinearPairs& pairs() const { return *parts_.pairs; }
  // Activations and their gradients: fp32, or bf16 in mixed precision.
  Tensor act(std::vector<int64_t> shape) const;
  Recorder::Scope rec(Recorder::Event e) const { return ctx().recorder->scope(std::move(e)); }
  bool layernorm() const { return model().norm == spec::Norm::kLayerNorm; }
  // LayerNorm (gamma, beta; saves mean and rstd) or RMSNorm (gamma; saves rstd).
  void norm(const Tensor& x, const Param& gamma, const Param* beta, Tensor& y, Tensor& mean,
            Tensor& rstd) const;
  void norm_backward(const Tensor& x, Param& gamma, Param* beta, const Tensor& mean,
                     const Tensor& rstd, const Tensor& dy, Tensor& dx) const;

  const GptParts& parts_;
};

}  // namespace sextant::exec
