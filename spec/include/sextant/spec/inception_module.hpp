// Inception-v3's modules (Szegedy et al. 2016, "Rethinking the Inception Architecture for Computer
// Vision", Figures 5-7 and Table 1), as torchvision's models/inception.py builds them
// (InceptionA to InceptionE): parallel branches of convolutions and a pool, each convolution
// followed by batch norm and ReLU (BasicConv2d), their outputs joined along the channels in
// branch order. The one home of a module's structure: the model check, the lowering and the
// executor ask it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sextant::spec {

// a: 35x35 (1x1, 5x5, double 3x3, pool); b: 35 -> 17 reduction; c: 17x17 with 1x7 and 7x1
// factorized convolutions; d: 17 -> 8 reduction; e: 8x8 with split 1x3 / 3x1 outputs.
enum class InceptionModule { kA, kB, kC, kD, kE };

// One step of a branch: a kh x kw convolution of strides sh x sw padded by ph x pw, then batch
// norm and ReLU, to `channels`; or a k x k pool (kh, sh, ph) of the whole input, an average
// counting its zero padding (torchvision's F.avg_pool2d default).
struct InceptionStep {
  enum class Kind { kConvBnRelu, kMaxPool, kAvgPool };
  Kind kind = Kind::kConvBnRelu;
  int64_t channels = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;
};

// A branch's steps in order; when `split` is not empty, each of its step lists applied to the
// steps' output and the results joined along the channels (module e's 1x3 and 3x1 pairs).
struct InceptionBranch {
  std::vector<InceptionStep> steps;
  std::vector<std::vector<InceptionStep>> split;
};

// The branches of `module` on `in_channels` channels, in torchvision's join order. `width` is
// module a's pool_features and module c's channels_7x7 (unused by b, d and e); every other
// channel count of the paper is divided by `divisor` (1 for Inception-v3; narrower test models).
std::vector<InceptionBranch> inception_branches(InceptionModule module, int64_t in_channels,
                                                int64_t width, int64_t divisor);
// The channels a module joins.
int64_t inception_output_channels(InceptionModule module, int64_t in_channels, int64_t width,
                                  int64_t divisor);
// Whether the module is a grid reduction (b, d): its stride-2 3x3 windows without padding take
// `extent` rows to window_output(extent, 3, 2, 0).
bool inception_reduces(InceptionModule module);
// Whether `divisor` divides every channel count of the paper's modules (not `width`).
bool inception_divisor_fits(int64_t divisor);

// The scope of branch `branch` of module `name` ("layerN.bI"), of step `step` of its steps
// ("layerN.bI.J") and of step `step` of its split `part` ("layerN.bI.sK.J"): the names the
// lowering and the executor give the module's ops (a convolution's product, batch norm and ReLU;
// a pool), a split branch's join (the branch's scope) and the module's join (`name`).
std::string inception_branch_scope(const std::string& name, size_t branch);
std::string inception_step_scope(const std::string& name, size_t branch, size_t step);
std::string inception_split_scope(const std::string& name, size_t branch, size_t part, size_t step);

}  // namespace sextant::spec
