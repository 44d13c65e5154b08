// A CNN's classifier, or an MLP's layers, as a per-op graph (issue 60; FlexFlow's parameter
// dimension, Jia et al.
// SysML'19 §3; Krizhevsky's "one weird trick", arXiv:1404.5997: convolutions data-parallel, fully
// connected layers model-parallel). Its trailing fully connected layers, each an einsum
// [b, f_(k-1)] x [f_(k-1), f_k] -> [b, f_k] (the ReLU after it elementwise on the output), on the
// plan's mesh of dp replicas ("d") by tp ranks ("t"); the features enter and the logits leave
// with the batch over d, as the uniform data-parallel layout holds them. A plan's per_op names the
// lowered layers ("layer18") and splits b, f_(k-1) or f_k: a weight split over d is each replica's
// own shard (the op reads every replica's rows, gathered), whose gradient no replica sums.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sextant/models/lowering.hpp"
#include "sextant/models/op_graph.hpp"
#include "sextant/spec/per_op_plan.hpp"

namespace sextant::models {

struct FcChain {
  spec::DeviceMesh mesh;
  OpGraph graph;                           // nodes named as the fc layers' lowered layers
  std::vector<size_t> layers;              // their indices in the lowered model, in order
  std::map<std::string, OpSplit> uniform;  // each fc data-parallel: b over d
  spec::TensorLayout features, logits;     // what enters and what leaves: b over d
};

// One fc layer of the chain: its lowered layer's name and index, its input and output features.
struct FcLayer {
  std::string name;
  size_t index = 0;
  int64_t in = 0, out = 0;
};

// The chain of `layers` (in order, each reading the last's output) over `micro_batch` samples a
// replica, on dp x tp ranks.
FcChain fc_chain(const std::vector<FcLayer>& layers, int64_t micro_batch, int64_t dp, int64_t tp);

// The trailing fc layers of a CNN (every layer of an MLP) lowered for its uniform layout and one
// replica's micro-batch, on dp x tp ranks (nullopt: the model ends in no fc layer).
std::optional<FcChain> cnn_fc_chain(const LoweredModel& lowered, int64_t dp, int64_t tp);

// A plan's splits of the chain's layers, by layer name (the uniform split for a layer it does not
// name), checked: each op one of the chain's layers, and no split of the features a layer with a
// ReLU contracts (it rectifies its summed output). Throws InputError naming /per_op.
std::map<std::string, OpSplit> fc_chain_splits(const LoweredModel& lowered, const FcChain& chain,
                                               const spec::OpSplits& per_op);

// Whether a layer's split leaves its rows (the batch) whole on every replica: each replica then
// computes the whole batch's gradient of its weights (its shard, or a copy), which no replica sums
// (Layer::replica_whole_params).
bool fc_rows_whole(const OpSplit& split);

// A plan's per-op splits applied to a CNN lowered for its uniform layout (LoweringOptions::per_op):
// each changed fc layer's GEMM on its blocks, its parameters' shards (Layer::replica_whole_params
// where it reads every replica's rows), its kept input, and the resharding rule's collectives
// between the layers (over d in the replicas' group). Throws InputError for an op that is not one
// of the fc layers, and with tp, a spatial split or ZeRO (not modelled with them).
void apply_fc_splits(LoweredModel& lowered, const LoweringOptions& options);

}  // namespace sextant::models
