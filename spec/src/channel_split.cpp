// The rules of a CNN's channel and filter split.
#include "sextant/spec/channel_split.hpp"

#include <fmt/format.h>

namespace sextant::spec {

ChannelAlgorithm channel_algorithm(bool input_whole, int64_t input_elements,
                                   int64_t output_elements) {
  if (input_whole) return ChannelAlgorithm::kWholeInput;
  return output_elements <= input_elements ? ChannelAlgorithm::kStationaryX
                                           : ChannelAlgorithm::kStationaryY;
}

ChannelBlock channel_block(int64_t channels, int64_t tp, int64_t rank) {
  const int64_t count = channels / tp;
  return {rank * count, count};
}

std::string channel_split_problem(const CnnSpec& cnn, int64_t tp) {
  if (tp <= 1) return "";
  if (cnn.volumes() || cnn.has_skips())
    return "splits the channels of 2D CNNs without skip connections: volumes and U-Net's kept "
           "maps are not modelled under a channel split yet";
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
