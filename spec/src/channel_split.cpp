// The rules of a CNN's channel and filter split.
#include "sextant/spec/channel_split.hpp"

#include <fmt/format.h>

#include "sextant/spec/error.hpp"

namespace sextant::spec {

ChannelFilterGrid channel_filter_grid(int64_t tp) {
  int64_t reduce = 1;
  while (reduce * reduce < tp) ++reduce;
  while (tp % reduce != 0) ++reduce;
  return {reduce, tp / reduce};
}

std::vector<int64_t> gathered_channel_blocks(int64_t tp, int64_t rank) {
  const ChannelFilterGrid g = channel_filter_grid(tp);
  std::vector<int64_t> blocks;
  for (int64_t k = 0; k < g.gather_ranks; ++k)
    blocks.push_back(rank % g.reduce_ranks + k * g.reduce_ranks);
  return blocks;
}

ChannelAlgorithm channel_algorithm(bool input_whole, int64_t input_elements,
                                   int64_t output_elements, int64_t tp) {
  if (input_whole) return ChannelAlgorithm::kWholeInput;
  // Elements each rank sends or receives, times tp (Dryden et al. §III-A's volumes; the ring
  // collectives move (n - 1)/n of their buffer): x's reduce-scatter of the output, y's all-gather
  // of the input, w's all-gather of X/r over g ranks and reduce-scatter of Y/g over r ranks.
  const int64_t x = output_elements * (tp - 1), y = input_elements * (tp - 1);
  ChannelAlgorithm best = ChannelAlgorithm::kStationaryX;
  int64_t least = x;
  if (y < least) {
    best = ChannelAlgorithm::kStationaryY;
    least = y;
  }
  if (const ChannelFilterGrid g = channel_filter_grid(tp); g.any()) {
    const int64_t w =
        input_elements * (g.gather_ranks - 1) + output_elements * (g.reduce_ranks - 1);
    if (w < least) best = ChannelAlgorithm::kStationaryW;
  }
  return best;
}

ChannelAlgorithm convolution_algorithm(const std::vector<ChannelAlgorithm>& chosen, int64_t index,
                                       bool input_whole, int64_t input_elements,
                                       int64_t output_elements, int64_t tp) {
  if (input_whole || chosen.empty())
    return channel_algorithm(input_whole, input_elements, output_elements, tp);
  SEXTANT_CHECK(index >= 0 && index < static_cast<int64_t>(chosen.size()),
                "convolution {} of the {} the plan chose algorithms for", index, chosen.size());
  return chosen[static_cast<size_t>(index)];
}

std::string channel_algorithms_problem(const std::vector<ChannelAlgorithm>& chosen, int64_t tp) {
  if (chosen.empty()) return "";
  if (tp <= 1) return "chooses the convolutions' algorithms of a channel split: needs tp > 1";
  for (size_t i = 0; i < chosen.size(); ++i) {
    if (chosen[i] == ChannelAlgorithm::kWholeInput)
      return fmt::format("entry {}: x, y or w (\"whole\" is the image's convolution, never chosen)",
                         i);
    if (chosen[i] == ChannelAlgorithm::kStationaryW && !channel_filter_grid(tp).any())
      return fmt::format(
          "entry {}: w splits the weights over a grid of the tp ranks, which tp {} does not have "
          "(x or y; tp 4 is 2 x 2, tp 8 is 4 x 2)",
          i, tp);
  }
  return "";
}

ChannelBlock channel_block(int64_t channels, int64_t tp, int64_t rank) {
  const int64_t count = channels / tp;
  return {rank * count, count};
}

std::string channel_split_problem(const CnnSpec& cnn, int64_t tp) {
  if (tp <= 1) return "";
  if (cnn.volumes() || cnn.has_skips() || cnn.has_cells())
    return "splits the channels of 2D CNNs without skip connections: volumes, U-Net's kept "
           "maps and multi-branch units (AmoebaNet's cells, Inception's modules) are not modelled "
           "under a channel split yet";
  if (cnn.layers.empty() || cnn.layers.back().kind != CnnLayerKind::kFc)
    return "splits the channels of a classifier (a last fc layer all-reduces them): a per-pixel "
           "head's logits would stay split by channel";
  if (cnn.layers.front().kind != CnnLayerKind::kConv)
    return "needs a CNN that starts with a conv layer to split its channels (the image is whole "
           "on every rank)";
  for (size_t i = 0; i < cnn.layers.size(); ++i) {
    const CnnLayer& l = cnn.layers[i];
    if (l.kind == CnnLayerKind::kFc) break;  // the classifier: its first layer reads the split
    for (int64_t channels : {l.out_channels, l.mid_channels}) {
      if ((l.kind == CnnLayerKind::kConv || l.kind == CnnLayerKind::kBottleneck) && channels > 0 &&
          channels % tp != 0)
        return fmt::format("must divide the {} channels of layer {} ({})", channels, i,
                           enum_name(cnn_layer_kind_names(), l.kind));
    }
  }
  return "";
}

}  // namespace sextant::spec
