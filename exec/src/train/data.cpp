// Data sources.
#include "data.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "sextant/exec/parameters.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::exec {

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class SyntheticTokens : public TokenSource {
 public:
  SyntheticTokens(int64_t vocab, uint64_t seed) : vocab_(vocab), seed_(seed) {}
  void sequence(int64_t index, int64_t seq_len, std::vector<int32_t>& out) const override {
    uint64_t h = mix(seed_ ^ mix(static_cast<uint64_t>(index)));
    const int64_t start = static_cast<int64_t>(h % static_cast<uint64_t>(vocab_));
    const int64_t step = 1 + static_cast<int64_t>((h >> 32) % 7);
    out.resize(static_cast<size_t>(seq_len + 1));
    for (int64_t i = 0; i <= seq_len; ++i)
      out[static_cast<size_t>(i)] = static_cast<int32_t>((start + i * step) % vocab_);
  }

 private:
  int64_t vocab_;
  uint64_t seed_;
};

class TextTokens : public TokenSource {
 public:
  explicit TextTokens(std::string bytes) : bytes_(std::move(bytes)) {}
  void sequence(int64_t index, int64_t seq_len, std::vector<int32_t>& out) const override {
    const uint64_t span = bytes_.size() - static_cast<uint64_t>(seq_len);
    const uint64_t start = mix(static_cast<uint64_t>(index)) % span;
    out.resize(static_cast<size_t>(seq_len + 1));
    for (int64_t i = 0; i <= seq_len; ++i)
      out[static_cast<size_t>(i)] =
          static_cast<unsigned char>(bytes_[start + static_cast<uint64_t>(i)]);
  }

 private:
  std::string bytes_;
};

}  // namespace

std::unique_ptr<TokenSource> make_synthetic_tokens(int64_t vocab, uint64_t seed) {
  return std::make_unique<SyntheticTokens>(vocab, seed);
}

std::unique_ptr<TokenSource> make_text_tokens(const std::string& path, int64_t seq_len) {
  std::string bytes = spec::read_text_file(path);
  if (static_cast<int64_t>(bytes.size()) < seq_len + 2) {
    throw InputError(path, "", fmt::format("{} bytes", bytes.size()),
                     fmt::format("a text file needs at least seq_len + 2 = {} bytes", seq_len + 2));
  }
  return std::make_unique<TextTokens>(std::move(bytes));
}

std::pair<int64_t, int64_t> classifier_shape(const spec::ModelSpec& model) {
  if (model.kind() == spec::ModelKind::kMlp)
    return {model.mlp().widths.front(), model.mlp().widths.back()};
  const spec::CnnSpec& c = model.cnn();
  return {c.in_channels * c.input_depth() * c.height * c.width, c.layers.back().out_features};
}

namespace {

// The teacher's weights, [read, classes], the same for every sample: drawn once per (seed, inputs
// read, classes) and kept, since drawing ResNet-50's 1024 x 1000 for every image cost ~2 s a step
// of 32 (the first GPU run, bench/results/gpu_h200_cnn.md). The values and the order of the sums
// are those of drawing them in place.
const std::vector<float>& teacher_weights(uint64_t seed, int64_t read, int64_t classes) {
  struct Cache {
    uint64_t seed = 0;
    int64_t read = -1, classes = -1;
    std::vector<float> w;
  };
  static thread_local Cache cache;
  if (cache.seed != seed || cache.read != read || cache.classes != classes) {
    cache.w.resize(static_cast<size_t>(read * classes));
    for (int64_t i = 0; i < read * classes; ++i)
      cache.w[static_cast<size_t>(i)] = init_normal(seed, "teacher", i);
    cache.seed = seed;
    cache.read = read;
    cache.classes = classes;
  }
  return cache.w;
}

}  // namespace

void classification_sample(uint64_t seed, int64_t index, int64_t inputs, int64_t classes,
                           std::vector<float>& features, int32_t& label) {
  features.resize(static_cast<size_t>(inputs));
  const std::string key = fmt::format("sample{}", index);
  for (int64_t j = 0; j < inputs; ++j) features[static_cast<size_t>(j)] = init_normal(seed, key, j);
  float best = -1e30f;
  label = 0;
  const int64_t read = std::min(inputs, kTeacherInputs);
  if (classes == 0) return;
  const std::vector<float>& teacher = teacher_weights(seed, read, classes);
  for (int64_t c = 0; c < classes; ++c) {
    float score = 0;
    for (int64_t j = 0; j < read; ++j)
      score += features[static_cast<size_t>(j)] * teacher[static_cast<size_t>(j * classes + c)];
    if (score > best) {
      best = score;
      label = static_cast<int32_t>(c);
    }
  }
}

void segmentation_sample(uint64_t seed, int64_t index, const spec::CnnSpec& cnn,
                         std::vector<float>& image, std::vector<int32_t>& labels) {
  const int64_t channels = cnn.in_channels, depth = cnn.input_depth(), height = cnn.height,
                width = cnn.width;
  int32_t unused = 0;
  classification_sample(seed, index, channels * depth * height * width, 0, image, unused);
  const spec::CnnMap out = spec::cnn_layer_maps(cnn).back();
  const int64_t front = spec::centre_crop_offset(depth, out.d);
  const int64_t top = spec::centre_crop_offset(height, out.h);
  const int64_t left = spec::centre_crop_offset(width, out.w);
  labels.assign(static_cast<size_t>(out.d * out.h * out.w), 0);
  for (int64_t z = 0; z < out.d; ++z)
    for (int64_t i = 0; i < out.h; ++i)
      for (int64_t j = 0; j < out.w; ++j) {
        float best = -1e30f;
        for (int64_t c = 0; c < out.c; ++c) {
          float score = 0;
          for (int64_t ch = 0; ch < channels; ++ch)
            score += image[static_cast<size_t>(
                         ((ch * depth + front + z) * height + top + i) * width + left + j)] *
                     init_normal(seed, "pixel_teacher", ch * out.c + c);
          if (score > best) {
            best = score;
            labels[static_cast<size_t>((z * out.h + i) * out.w + j)] = static_cast<int32_t>(c);
          }
        }
      }
}

}  // namespace sextant::exec
