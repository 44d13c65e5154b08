// Channel and filter parallelism for CNNs (Dryden et al., SC'19, "Channel and filter parallelism
// for large-scale CNN training", §III): a plan's tp ranks each hold a block of the channels of
// every feature map (tp = 1 for MLPs; transformers split heads). A convolution from channel-split
// input to channel-split output runs one of three algorithms, whichever moves fewest bytes:
//   stationary-x: each rank convolves its input channels with its slice of every filter and the
//     partial outputs are reduce-scattered by filter block (backward: the output gradient is
//     all-gathered; the input gradient stays local);
//   stationary-y: the input is all-gathered and each rank computes its block of filters whole
//     (backward: the partial input gradients are reduce-scattered);
//   stationary-w: the weights stay, split both ways over a grid of the tp ranks (LBANN's
//     DiHydrogen distconv, ChannelParallelismAlgorithm::W: the filter tensor's channels split
//     over one axis and its filters over the other): a rank gathers its channel group's input
//     from the ranks of its gather group, convolves it with its block of the group's filters and
//     reduce-scatters the partial outputs over its reduce group (backward: the twins, the output
//     gradient gathered over the reduce group and the partial input gradients reduce-scattered
//     over the gather group). Stationary-x and -y are its grids of one column and one row.
// Per rank and pass, with X and Y the input and output maps, x moves Y (tp-1)/tp, y moves
// X (tp-1)/tp and w moves X (g-1)/tp + Y (r-1)/tp on an r x g grid (r * g = tp): w wins where the
// two maps are close in size (3x3 convolutions between equal widths: at tp 4, half of x's bytes
// plus a third). Batch norm, ReLU, pooling and the residual add work channel by channel, locally.
// The image is whole on every rank: the first convolution computes its filter block without a
// gather. The first fc reads the split maps flattened (channel-major, so each rank holds a block
// of its rows) and all-reduces its partial outputs; the classifier after it runs whole on every
// rank. With a spatial split beside it each tp rank holds its channels of its spatial rank's block
// of every map: the channel collectives move blocks, and the halos, batch-norm sums and pooled
// sums (over the spatial ranks) carry the rank's channels. The one home of these rules: the plan
// check, the lowering and the executor ask them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::spec {

// (ChannelAlgorithm, the four ways a convolution runs, is declared in plan.hpp: a plan may choose
// one per convolution.)

// Stationary-w's grid of the tp ranks. tp rank t belongs to reduce group t / reduce_ranks: the
// reduce_ranks consecutive tp ranks that hold the same block of filters (1/gather_ranks of them)
// and reduce-scatter their partial outputs, after which t holds filter block t of the output as
// under x and y; and to gather group t % reduce_ranks: the gather_ranks tp ranks
// t % reduce_ranks + k * reduce_ranks, which all-gather their channel blocks of the input (the
// channel group their weights read). The reduce groups are the more local ones; reduce_ranks is
// the smallest divisor of tp not below its square root (tp 4: 2 x 2, tp 8: 4 x 2). tp 2 and prime
// tp have no grid (any() false): x and y cover them.
struct ChannelFilterGrid {
  int64_t reduce_ranks = 1;
  int64_t gather_ranks = 1;
  bool any() const { return reduce_ranks > 1 && gather_ranks > 1; }
};
ChannelFilterGrid channel_filter_grid(int64_t tp);
// The channel blocks (of a map's tp blocks) stationary-w's tp rank `rank` convolves, in the order
// its gather group's all-gather packs them: rank % reduce_ranks + k * reduce_ranks, k <
// gather_ranks.
std::vector<int64_t> gathered_channel_blocks(int64_t tp, int64_t rank);

// The algorithm of a convolution whose input map has `input_elements` and output map
// `output_elements` (per sample) over `tp` ranks: the one moving fewest bytes (ties go to
// stationary-x, which keeps the input gradient local, then to stationary-y).
ChannelAlgorithm channel_algorithm(bool input_whole, int64_t input_elements,
                                   int64_t output_elements, int64_t tp);
// The algorithm a convolution runs: kWholeInput when it reads the whole image; else `chosen[index]`
// when the plan chose them (Plan::channel_algorithms; `index` counts the convolutions reading
// split maps, in the lowering's order), else the byte rule's. The lowering and the executor ask it.
ChannelAlgorithm convolution_algorithm(const std::vector<ChannelAlgorithm>& chosen, int64_t index,
                                       bool input_whole, int64_t input_elements,
                                       int64_t output_elements, int64_t tp);
// What is wrong with a plan's choice of algorithms for `tp` ranks, or "": stationary-x, -y or -w
// each (kWholeInput is the image's, never chosen), -w only on a tp with a grid, and none without
// a channel split. (That there is one per convolution the lowering checks: it counts them.)
std::string channel_algorithms_problem(const std::vector<ChannelAlgorithm>& chosen, int64_t tp);

// The channels {begin, count} of a `channels`-channel map that tp rank `rank` of `tp` holds (tp
// divides channels).
struct ChannelBlock {
  int64_t begin = 0;
  int64_t count = 0;
};
ChannelBlock channel_block(int64_t channels, int64_t tp, int64_t rank);

// What is wrong with splitting `cnn`'s channels over `tp` ranks, or "" when nothing is: the model
// must start with a convolution (the image is whole, its gradient unneeded) and tp must divide the
// channels of every convolution's output (and so of every split input).
std::string channel_split_problem(const CnnSpec& cnn, int64_t tp);
// The ranks splitting a CNN's channels under `plan`: its tp, or 1 under SUPER's branch split
// (spec/branch_parallel.hpp), whose tp ranks keep every map whole.
inline int64_t channel_split_ranks(const Plan& plan) {
  return plan.branch_parallel ? 1 : plan.tp;
}

}  // namespace sextant::spec
