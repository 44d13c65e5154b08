// Whether a CNN's convolutions could pay split per op over the data-parallel ranks (issue 60;
// FlexFlow's parameter and attribute dimensions, Jia et al. SysML'19 §3), bounded in bytes without
// lowering any split.
//
// On R replicas of b samples each a step (every micro-batch's), a convolution split any way but
// by the batch reads the whole group's R x b samples, so one rank must either gather its input
// from the others or reduce its partial outputs to them: a split of its filters needs the R x b
// inputs whole (an all-gather: (R - 1) x b x input elements received; the input gradient
// reduce-scattered back the same way), a split of the channels it contracts leaves partial sums
// of the R x b outputs (a reduce-scatter: (R - 1) x b x output; the output gradient
// all-gathered), and a split of its positions keeps every filter on every rank, saving nothing.
// Whatever the neighbours' layouts, each such convolution moves at least
// 2 (R - 1) b min(input, output) activation elements a step per rank, forward and backward, on the
// critical path. What it can save is its parameters' gradient all-reduce over the R replicas,
// once a step: 2 (R - 1) / R x parameters (ring, Thakur et al. 2005), which data parallelism
// overlaps with the backward pass. Costs add over convolutions and savings do too, so splits of
// several convolutions pay only if one of them could alone:
//   could pay  <=>  2 (R - 1) b min(in, out) e_act  <  2 (R - 1) / R x params x e_grad,
// i.e. R b min(in, out) e_act < params e_grad. The bound is in bytes over the same ranks' links;
// neither FLOPs (the same per rank) nor memory (a split holds params / R) enter it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sextant/models/lowering.hpp"

namespace sextant::models {

struct ConvSplitBound {
  std::string conv;              // "layer12.conv2"
  double least_moved_bytes = 0;  // activations one rank must move a step, split any way but b
  double most_saved_bytes = 0;   // gradient bytes one rank's all-reduce it could save
  bool could_pay() const { return least_moved_bytes < most_saved_bytes; }
};

// Every convolution of `lowered` (a CNN) on `replicas` data-parallel ranks of `samples` each a
// step (micro-batch x micro-batches), with `activation_bytes` a map element and
// `gradient_bytes` a gradient element as the replicas reduce them. Empty for one replica (nothing
// to split over) and for a model without convolutions.
std::vector<ConvSplitBound> conv_split_bounds(const LoweredModel& lowered, int64_t samples,
                                              int64_t replicas, int64_t activation_bytes,
                                              int64_t gradient_bytes);

// The bound closest to paying (the largest saved / moved): the one to show. Requires a non-empty
// list.
const ConvSplitBound& closest_to_paying(const std::vector<ConvSplitBound>& bounds);

// The convolutions that could pay, in order.
std::vector<std::string> could_pay(const std::vector<ConvSplitBound>& bounds);

// The most bytes a step splits of these convolutions could save one rank: the sum of what each
// that could pay saves beyond what it moves (costs and savings add over convolutions).
double most_net_saved_bytes(const std::vector<ConvSplitBound>& bounds);

}  // namespace sextant::models
