// Inception-v3's modules: torchvision's models/inception.py, InceptionA to InceptionE.
#include "sextant/spec/inception_module.hpp"

#include <fmt/format.h>

#include <array>

namespace sextant::spec {

namespace {

using Kind = InceptionStep::Kind;

// A BasicConv2d: a kh x kw convolution (strides s, padding p on each side), batch norm, ReLU.
InceptionStep conv(int64_t channels, int64_t kh, int64_t kw, int64_t s = 1, int64_t ph = 0,
                   int64_t pw = 0) {
  return {Kind::kConvBnRelu, channels, kh, kw, s, s, ph, pw};
}
InceptionStep same(int64_t channels, int64_t kh, int64_t kw) {
  return conv(channels, kh, kw, 1, (kh - 1) / 2, (kw - 1) / 2);
}
// The 3x3 average pool of stride 1 and padding 1 the non-reducing modules' pool branches take.
InceptionStep avg_pool() {
  return {Kind::kAvgPool, 0, 3, 3, 1, 1, 1, 1};
}
// The reductions' 3x3 max pool of stride 2 without padding.
InceptionStep max_pool() {
  return {Kind::kMaxPool, 0, 3, 3, 2, 2, 0, 0};
}

}  // namespace

std::vector<InceptionBranch> inception_branches(InceptionModule module, int64_t in_channels,
                                                int64_t width, int64_t divisor) {
  (void)in_channels;  // every branch reads the module's input; pools keep its channels
  auto n = [divisor](int64_t paper) { return paper / divisor; };
  switch (module) {
    case InceptionModule::kA:  // Figure 5 with the 5x5 kept in its first branch, as torchvision
      return {{{conv(n(64), 1, 1)}, {}},
              {{conv(n(48), 1, 1), same(n(64), 5, 5)}, {}},
              {{conv(n(64), 1, 1), same(n(96), 3, 3), same(n(96), 3, 3)}, {}},
              {{avg_pool(), conv(width, 1, 1)}, {}}};
    case InceptionModule::kB:
      return {{{conv(n(384), 3, 3, 2)}, {}},
              {{conv(n(64), 1, 1), same(n(96), 3, 3), conv(n(96), 3, 3, 2)}, {}},
              {{max_pool()}, {}}};
    case InceptionModule::kC:  // Figure 6, n = 7
      return {{{conv(n(192), 1, 1)}, {}},
              {{conv(width, 1, 1), same(width, 1, 7), same(n(192), 7, 1)}, {}},
              {{conv(width, 1, 1), same(width, 7, 1), same(width, 1, 7), same(width, 7, 1),
                same(n(192), 1, 7)},
               {}},
              {{avg_pool(), conv(n(192), 1, 1)}, {}}};
    case InceptionModule::kD:
      return {
          {{conv(n(192), 1, 1), conv(n(320), 3, 3, 2)}, {}},
          {{conv(n(192), 1, 1), same(n(192), 1, 7), same(n(192), 7, 1), conv(n(192), 3, 3, 2)}, {}},
          {{max_pool()}, {}}};
    case InceptionModule::kE:  // Figure 7: the 3x3s' outputs split into 1x3 and 3x1
      return {
          {{conv(n(320), 1, 1)}, {}},
          {{conv(n(384), 1, 1)}, {{same(n(384), 1, 3)}, {same(n(384), 3, 1)}}},
          {{conv(n(448), 1, 1), same(n(384), 3, 3)}, {{same(n(384), 1, 3)}, {same(n(384), 3, 1)}}},
          {{avg_pool(), conv(n(192), 1, 1)}, {}}};
  }
  return {};
}

int64_t inception_output_channels(InceptionModule module, int64_t in_channels, int64_t width,
                                  int64_t divisor) {
  // A branch ends with its last convolution's channels (each split's, summed), or keeps the input's
  // after a lone pool.
  auto channels_after = [in_channels](const std::vector<InceptionStep>& steps) {
    int64_t c = in_channels;
    for (const InceptionStep& s : steps)
      if (s.kind == Kind::kConvBnRelu) c = s.channels;
    return c;
  };
  int64_t total = 0;
  for (const InceptionBranch& b : inception_branches(module, in_channels, width, divisor)) {
    if (b.split.empty()) {
      total += channels_after(b.steps);
      continue;
    }
    for (const auto& part : b.split) total += part.back().channels;
  }
  return total;
}

bool inception_reduces(InceptionModule module) {
  return module == InceptionModule::kB || module == InceptionModule::kD;
}

bool inception_divisor_fits(int64_t divisor) {
  // Every channel count of the paper's modules (48, 64, 96, 192, 320, 384, 448).
  constexpr std::array<int64_t, 7> kPaper{48, 64, 96, 192, 320, 384, 448};
  for (int64_t c : kPaper)
    if (divisor <= 0 || c % divisor != 0) return false;
  return true;
}

std::string inception_branch_scope(const std::string& name, size_t branch) {
  return fmt::format("{}.b{}", name, branch);
}
std::string inception_step_scope(const std::string& name, size_t branch, size_t step) {
  return fmt::format("{}.b{}.{}", name, branch, step);
}
std::string inception_split_scope(const std::string& name, size_t branch, size_t part,
                                  size_t step) {
  return fmt::format("{}.b{}.s{}.{}", name, branch, part, step);
}

}  // namespace sextant::spec
