// A chain of fc layers under a plan's per-op splits (models/cnn_fc_graph.hpp): a CNN's trailing fc
// layers, or an MLP's layers. The chain is walked as the lowering walks it. Each layer's GEMM runs
// on the rank's blocks of its input and weight, its ReLU on its output block, and each reshard step
// of the walk on the tensor it names (mesh_tensor.hpp), traced as the lowering names it; the
// logits come back in this replica's rows for the loss. A bias is added once, on the ranks first
// along the axes the layer's output is a partial sum over. Parameters are the rank's blocks of
// the whole tensors, each element drawn from its global index, so that every layout starts from
// the single rank's model; a layer whose rows are whole on every replica keeps its gradients out
// of the replicas' sums (Param::replica_whole). Runs in fp32 on one pipeline stage, without tp or
// a spatial split (spec/executor_support.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cnn/cnn_units.hpp"
#include "mesh_tensor.hpp"
#include "sextant/exec/parameters.hpp"
#include "sextant/models/cnn_fc_graph.hpp"

namespace sextant::exec {

// One layer of a chain, as its stage names it.
struct FcChainLayer {
  int32_t layer = 0;   // the lowered layer
  std::string name;    // the lowered layer's name: its ops' and the plan's per_op key
  std::string params;  // its parameters' prefix: "<params>.weight", "<params>.bias"
  int64_t in = 0, out = 0;
  bool relu = false, bias = false, classifier = false;
  models::OpId product = models::OpId::kUnitFc, activation = models::OpId::kUnitRelu;
};
// A CNN's trailing fc units as a chain.
std::vector<FcChainLayer> cnn_fc_chain_layers(const std::vector<cnn::Unit>& units);

class SplitFcChain {
 public:
  // The chain of `layers` (consecutive lowered layers), `micro_batch` samples a replica, under
  // the context's plan's per_op.
  SplitFcChain(Context& ctx, std::vector<FcChainLayer> layers, int64_t micro_batch);
  // Whether lowered layer `layer` is one of the chain's.
  bool holds(int32_t layer) const { return index_.contains(layer); }
  // The parameters of the chain's layer `layer` (its weight and bias blocks), drawn with `seed`.
  void add_params(int32_t layer, uint64_t seed, std::vector<ParamSpec>& specs) const;
  // Finds the parameters in the built store.
  void bind(ParamStore& store);
  // Layer `layer`'s forward. `x`: the first layer's input, this replica's [micro_batch, features]
  // (later layers read what the one before made). Returns the output block; the last layer's are
  // the logits of this replica's rows, [micro_batch, classes].
  Tensor forward(int32_t layer, const Tensor& x, int64_t mb);
  // Layer `layer`'s backward. `dy`: the last layer's logits gradient in this replica's rows
  // (earlier layers read what the one after made). Returns the first layer's input gradient in
  // this replica's rows, [micro_batch, features] (for the others, the block it made).
  Tensor backward(int32_t layer, const Tensor& dy, int64_t mb);
  // Drops what a micro-batch kept.
  void forget(int64_t mb) { state_.erase(mb); }

 private:
  struct Layer {
    FcChainLayer desc;
    const models::GraphNode* node = nullptr;
    models::ShardedOp sharded;
    spec::TensorLayout input_gradient;  // the layout of its input's gradient
    bool rows_whole = false;
    Param* weight = nullptr;
    Param* bias_param = nullptr;
  };
  struct Saved {
    MeshTensor input;
    Tensor pre;  // the output before its ReLU
  };
  struct State {
    std::map<int32_t, Saved> layers;
    MeshTensor value, gradient;  // carried from layer to layer
  };

  // The walk's reshard steps of `phase` whose op is `node`, run on `x` in order.
  MeshTensor reshards(const std::string& node, spec::Phase phase, MeshTensor x, int32_t layer,
                      int64_t mb);

  Context& ctx_;
  int64_t micro_batch_;
  models::FcChain chain_;
  std::map<std::string, models::OpSplit> chosen_;
  MeshRanks ranks_;
  models::GraphWalk walk_;
  std::map<int32_t, Layer> index_;  // by lowered layer
  std::map<int64_t, State> state_;  // by micro-batch
};

}  // namespace sextant::exec
