// Training data, addressed by the global index of a sequence (or sample) so that every layout
// sees the same global batch: a synthetic token stream with learnable structure, a byte-level text
// file, and synthetic classification samples for MLPs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sextant/spec/model_spec.hpp"

namespace sextant::exec {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Writes seq_len + 1 tokens of sequence `index` (inputs are [0, seq_len), targets [1, seq_len]).
  virtual void sequence(int64_t index, int64_t seq_len, std::vector<int32_t>& out) const = 0;
};

// Arithmetic progressions modulo the vocabulary: a random start and a random step in 1..7 per
// sequence. Predictable from context, so the loss of a working model falls well below log(V).
std::unique_ptr<TokenSource> make_synthetic_tokens(int64_t vocab, uint64_t seed);
// The bytes of a text file (vocabulary 256); sequences start at pseudo-random offsets. Throws
// InputError when the file cannot be read or is shorter than a sequence.
std::unique_ptr<TokenSource> make_text_tokens(const std::string& path, int64_t seq_len);

// The features and classes of a classifier's samples: an MLP's first and last widths, a CNN's
// image (channels x height x width, NCHW order; channels x depth x height x width for a volume)
// and its last fc's outputs.
std::pair<int64_t, int64_t> classifier_shape(const spec::ModelSpec& model);

// MLP and CNN samples: Gaussian features, labelled by a fixed random linear teacher (argmax of W^T
// x) that reads the first kTeacherInputs features: a ResNet-50 image has 150,528, and a teacher
// over all of them (x 1000 classes) cost seconds of hashing per sample.
inline constexpr int64_t kTeacherInputs = 1024;
void classification_sample(uint64_t seed, int64_t index, int64_t inputs, int64_t classes,
                           std::vector<float>& features, int32_t& label);
// A segmentation sample of `cnn` (a CNN ending in a conv: a per-pixel classifier): the image as
// classification_sample draws it, and one label per pixel (voxel, for a volume) of the last map
// (NCHW or NCDHW order), which sits over the image's centre crop (spec::centre_crop_offset on each
// axis, as U-Net's valid convolutions leave it): the argmax of a fixed random linear teacher over
// the image's channels at the pixel it covers.
void segmentation_sample(uint64_t seed, int64_t index, const spec::CnnSpec& cnn,
                         std::vector<float>& image, std::vector<int32_t>& labels);

}  // namespace sextant::exec
