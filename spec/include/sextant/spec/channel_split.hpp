// Channel and filter parallelism for CNNs (Dryden et al., SC'19, "Channel and filter parallelism
// for large-scale CNN training", §III): a plan's tp ranks each hold a block of the channels of
// every feature map (tp = 1 for MLPs; transformers split heads). A convolution from channel-split
// input to channel-split output runs one of two algorithms, whichever moves fewer bytes:
//   stationary-x: each rank convolves its input channels with its slice of every filter and the
//     partial outputs are reduce-scattered by filter block (backward: the output gradient is
//     all-gathered; the input gradient stays local);
//   stationary-y: the input is all-gathered and each rank computes its block of filters whole
//     (backward: the partial input gradients are reduce-scattered).
// Both move a whole map: the output for stationary-x, the input for stationary-y. Batch norm, ReLU,
// pooling and the residual add work channel by channel, locally. The image is whole on every
// rank: the first convolution computes its filter block without a gather. The first fc reads the
// split maps flattened (channel-major, so each rank holds a block of its rows) and all-reduces
// its partial outputs; the classifier after it runs whole on every rank. With a spatial split
// beside it each tp rank holds its channels of its spatial rank's block of every map: the channel
// collectives move blocks, and the halos, batch-norm sums and pooled sums (over the spatial
// ranks) carry the rank's channels. The one home of these rules: the plan check, the lowering and
// the executor ask them.
#pragma once

#include <cstdint>
#include <string>

#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::spec {

enum class ChannelAlgorithm {
  kWholeInput,   // the image, whole on every rank: no collective
  kStationaryX,  // reduce-scatter of the output (backward: all-gather of its gradient)
  kStationaryY,  // all-gather of the input (backward: reduce-scatter of its gradient)
};

// The algorithm of a convolution whose input map has `input_elements` and output map
// `output_elements` (per sample; ties go to stationary-x, which keeps the input gradient local).
ChannelAlgorithm channel_algorithm(bool input_whole, int64_t input_elements,
                                   int64_t output_elements);

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

}  // namespace sextant::spec
