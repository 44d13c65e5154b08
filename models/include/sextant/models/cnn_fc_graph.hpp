// A CNN's classifier as a per-op graph (issue 60; FlexFlow's parameter dimension, Jia et al.
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

// The trailing fc layers of a CNN lowered for one replica's micro-batch, on dp x tp ranks
// (nullopt: the model ends in no fc layer).
std::optional<FcChain> cnn_fc_chain(const LoweredModel& lowered, int64_t dp, int64_t tp);

// A plan's per-op splits applied to a CNN lowered for its uniform layout (LoweringOptions::per_op):
// each changed fc layer's GEMM on its blocks, its parameters' shards (Layer::replica_whole_params
// where it reads every replica's rows), its kept input, and the resharding rule's collectives
// between the layers (over d in the replicas' group). Throws InputError for an op that is not one
// of the fc layers, and with tp, a spatial split or ZeRO (not modelled with them).
void apply_fc_splits(LoweredModel& lowered, const LoweringOptions& options);

}  // namespace sextant::models
