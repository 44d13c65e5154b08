// Per-op convolution splits bounded in bytes (conv_split_bound.hpp).
#include "sextant/models/conv_split_bound.hpp"

#include <algorithm>

#include "sextant/spec/error.hpp"

namespace sextant::models {

std::vector<ConvSplitBound> conv_split_bounds(const LoweredModel& lowered, int64_t samples,
                                              int64_t replicas, int64_t activation_bytes,
                                              int64_t gradient_bytes) {
  std::vector<ConvSplitBound> out;
  if (replicas < 2) return out;
  const auto r = static_cast<double>(replicas);
  const auto b = static_cast<double>(samples);
  for (const Layer& layer : lowered.layers) {
    for (const ConvShape& c : layer.convolutions) {
      const auto least = static_cast<double>(std::min(c.input, c.output));
      out.push_back({layer.name + "." + c.unit,
                     2 * (r - 1) * b * least * static_cast<double>(activation_bytes),
                     2 * (r - 1) / r * static_cast<double>(c.params * gradient_bytes)});
    }
  }
  return out;
}

const ConvSplitBound& closest_to_paying(const std::vector<ConvSplitBound>& bounds) {
  SEXTANT_CHECK(!bounds.empty(), "no convolution to bound");
  return *std::max_element(bounds.begin(), bounds.end(), [](const auto& x, const auto& y) {
    return x.most_saved_bytes * y.least_moved_bytes < y.most_saved_bytes * x.least_moved_bytes;
  });
}

std::vector<std::string> could_pay(const std::vector<ConvSplitBound>& bounds) {
  std::vector<std::string> out;
  for (const ConvSplitBound& b : bounds)
    if (b.could_pay()) out.push_back(b.conv);
  return out;
}

double most_net_saved_bytes(const std::vector<ConvSplitBound>& bounds) {
  double net = 0;
  for (const ConvSplitBound& b : bounds)
    net += std::max(0.0, b.most_saved_bytes - b.least_moved_bytes);
  return net;
}

}  // namespace sextant::models
