// ModelSpec: what is trained. A transformer (decoder or encoder), an MLP or a CNN, as plain data
// with JSON decoding ("sextant.model/1") that reports every problem with its JSON pointer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "sextant/spec/inception_module.hpp"
#include "sextant/spec/json_reader.hpp"

namespace sextant::spec {

enum class Architecture { kDecoder, kEncoder };
// kGelu and kGeluNew compute the same function (GELU's tanh approximation, Hendrycks & Gimpel
// 2016); kGeluNew is how Hugging Face writes it (transformers/activations.py NewGELUActivation,
// GPT-2's "activation_function": "gelu_new"): Python arithmetic on tensors, which eager PyTorch
// runs as one kernel per operator (models/src/transformer_fusion.cpp prices the chain).
enum class Activation { kGelu, kSwiglu, kRelu, kGeluNew };
enum class Norm { kLayerNorm, kRmsNorm };
enum class PositionEmbedding { kLearned, kRope, kNone };

EnumNames<Architecture> architecture_names();
EnumNames<Activation> activation_names();
EnumNames<Norm> norm_names();
EnumNames<PositionEmbedding> position_embedding_names();

// A mixture-of-experts MLP (Shazeer et al. 2017; GShard; Switch; Mixtral, Jiang et al. 2024;
// DeepSeekMoE, Dai et al. 2024): a router sends each token to its top_k of `experts` MLPs of
// expert_ffn_hidden, whose outputs are summed by the router's weights; `shared_experts` more run on
// every token. The first dense_layers blocks keep the dense MLP of ffn_hidden (DeepSeek's
// first_k_dense_replace).
struct MoeSpec {
  int64_t experts = 0;            // routed experts per MoE layer
  int64_t top_k = 0;              // experts each token is routed to
  int64_t expert_ffn_hidden = 0;  // each expert's MLP width (model files: default ffn_hidden)
  int64_t shared_experts = 0;     // experts every token goes through (DeepSeek), 0: none
  // Tokens an expert takes, as a multiple of its even share (tokens x top_k / experts): its
  // input is padded (or cut) to that capacity (GShard, Switch; Megatron-LM
  // --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity). 0: dropless, every
  // routed token computed, the router assumed balanced.
  double capacity_factor = 0;
  int64_t dense_layers = 0;  // the first blocks keep the dense MLP
  // Dropless under expert parallelism: the routed copies the most loaded ep rank receives over
  // the mean (a trained router's skew, e.g. from a run's per-expert token counts). 0: the floor
  // that routing at random already gives (models/moe_load.hpp).
  double load_imbalance = 0;
};

struct TransformerSpec {
  Architecture architecture = Architecture::kDecoder;
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;  // == heads for multi-head attention, fewer for grouped-query attention
  int64_t ffn_hidden = 0;
  int64_t vocab = 0;
  int64_t seq_len = 0;
  Activation activation = Activation::kGelu;
  Norm norm = Norm::kLayerNorm;
  bool tied_embeddings = false;
  PositionEmbedding position_embedding = PositionEmbedding::kLearned;
  int64_t max_positions = 0;  // rows of the learned position table
  bool bias = true;           // linear layers and norms carry bias terms
  bool dropout = false;       // dropout after attention and MLP (keeps masks for backward)
  int64_t type_vocab = 0;     // BERT token-type embeddings (0 = none)
  bool pooler = false;        // BERT pooler (hidden x hidden dense)
  std::optional<MoeSpec> moe;

  int64_t head_dim() const { return hidden / heads; }
  int64_t kv_hidden() const { return kv_heads * head_dim(); }
};

struct MlpSpec {
  std::vector<int64_t> widths;  // input, hidden..., classes
  Activation activation = Activation::kRelu;
  bool bias = true;
};

// up_conv: a transposed convolution (ConvTranspose2d/3d, no padding), out = (in - 1) stride +
// kernel; concat: the map the last unconsumed `skip` layer kept, cropped at its centre to the
// current map's extents, joined to it along the channels (U-Net's skip connections, Ronneberger
// et al. 2015; Cicek et al. 2016); amoeba_cell: AmoebaNet-D's normal or reduction cell
// (spec/amoeba_cell.hpp), reading the two previous cells' outputs; inception: one of Inception-v3's
// modules (spec/inception_module.hpp), branches joined along the channels.
enum class CnnLayerKind {
  kConv,
  kMaxPool,
  kAvgPool,
  kAdaptiveAvgPool,
  kFc,
  kBottleneck,
  kUpConv,
  kConcat,
  kAmoebaCell,
  kInception
};
EnumNames<CnnLayerKind> cnn_layer_kind_names();
EnumNames<InceptionModule> inception_module_names();

struct CnnLayer {
  CnnLayerKind kind = CnnLayerKind::kConv;
  int64_t out_channels = 0;  // conv, bottleneck, up_conv
  int64_t mid_channels = 0;  // bottleneck
  int64_t blocks = 1;        // bottleneck: repeated blocks, the first one may downsample;
                             // amoeba_cell, inception: repeated cells or modules
  int64_t filters = 0;       // amoeba_cell: channels of each of its states
  bool reduction = false;    // amoeba_cell: a reduction cell (halves the map)
  InceptionModule module = InceptionModule::kA;  // inception: which module
  int64_t width = 0;    // inception: module a's pool_features, module c's channels_7x7
  int64_t divisor = 1;  // inception: divides the paper's other channel counts (test models)
  int64_t kernel = 1;   // conv, pools
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t output = 1;        // adaptive pool output size (square)
  int64_t out_features = 0;  // fc
  bool bias = false;
  bool batch_norm = false;
  bool relu = false;
  bool skip = false;  // conv, pools: its output is also kept for a later concat
};

struct CnnSpec {
  int64_t in_channels = 0;
  int64_t depth = 0;  // 0: images (2D windows); >= 1: volumes, every window a cube (3D)
  int64_t height = 0;
  int64_t width = 0;
  std::vector<CnnLayer> layers;
  bool volumes() const { return depth > 0; }
  // Slices of the input along depth (1 for images).
  int64_t input_depth() const { return volumes() ? depth : 1; }
  // Whether a layer keeps a map for a concat (U-Net's skip connections).
  bool has_skips() const;
  // Whether the model has multi-branch units: AmoebaNet's cells (each reading the two previous
  // cells' outputs) or Inception's modules. They run unsplit (no channel or spatial split).
  bool has_cells() const;
  // Whether the model has Inception modules.
  bool has_inception() const;
};

// Rows (or columns) a window of `kernel` with `stride` and `padding` produces from `extent` input
// rows (PyTorch's Conv2d / MaxPool2d output size, floor mode); 0 when the window does not fit
// (PyTorch refuses; C++'s division rounds -1/2 to 0 and made a 1x1 map pooled by 2 stay 1x1).
// The one home of that formula.
inline int64_t window_output(int64_t extent, int64_t kernel, int64_t stride, int64_t padding) {
  const int64_t room = extent + 2 * padding - kernel;
  return room < 0 ? 0 : room / stride + 1;
}
// Rows a transposed convolution of `kernel` and `stride` (no padding) makes from `extent` rows
// (PyTorch's ConvTranspose2d / ConvTranspose3d output size).
inline int64_t up_window_output(int64_t extent, int64_t kernel, int64_t stride) {
  return (extent - 1) * stride + kernel;
}
// Where a concat's centre crop of a kept map of `kept` rows starts to make `extent` rows:
// floor((kept - extent) / 2), as U-Net implementations crop (Ronneberger et al. 2015's
// "correspondingly cropped feature map").
inline int64_t centre_crop_offset(int64_t kept, int64_t extent) {
  return (kept - extent) / 2;
}
// A bottleneck block's output rows: its strided 3x3 convolution (padding 1).
inline int64_t bottleneck_output(int64_t extent, int64_t stride) {
  return window_output(extent, 3, stride, 1);
}

// A CNN's feature map of one sample: channels, slices (1 for images), rows, columns.
struct CnnMap {
  int64_t c = 0, d = 1, h = 0, w = 0;
};
// The map layer `l` of `cnn` makes from `m`: the one home of the CNN's shape rules (the model
// check walks them, the executor sizes its data by them). A concat joins, and pops, the last map
// of `kept`; the caller pushes the result when `l.skip`. Assumes a layer the check accepted.
CnnMap next_cnn_map(const CnnSpec& cnn, const CnnLayer& l, CnnMap m, std::vector<CnnMap>& kept);
// The map after each layer of a checked model.
std::vector<CnnMap> cnn_layer_maps(const CnnSpec& cnn);

enum class ModelKind { kTransformer, kMlp, kCnn };
EnumNames<ModelKind> model_kind_names();

struct ModelSpec {
  std::string name;
  std::string description;
  std::string source;  // where the architecture numbers come from (paper, config.json)
  std::variant<TransformerSpec, MlpSpec, CnnSpec> body;

  ModelKind kind() const { return static_cast<ModelKind>(body.index()); }
  bool is_transformer() const { return kind() == ModelKind::kTransformer; }
  const TransformerSpec& transformer() const { return std::get<TransformerSpec>(body); }
  TransformerSpec& transformer() { return std::get<TransformerSpec>(body); }
  const MlpSpec& mlp() const { return std::get<MlpSpec>(body); }
  const CnnSpec& cnn() const { return std::get<CnnSpec>(body); }
};

inline constexpr std::string_view kModelSchema = "sextant.model/1";

// Decodes and validates a model; throws InputError (listing every problem) naming `source`.
ModelSpec model_from_json(const Json& json, const std::string& source);
Json to_json(const ModelSpec& model);
// Reads a model file; throws InputError naming the file.
ModelSpec read_model_file(const std::string& path);

}  // namespace sextant::spec
