// ModelSpec JSON decoding (types, required and unknown keys) and validation (rules between fields).
#include "sextant/spec/model_spec.hpp"

#include <fmt/format.h>

#include <array>

#include "sextant/spec/amoeba_cell.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/limits.hpp"

namespace sextant::spec {

namespace {
constexpr std::array<std::pair<std::string_view, Architecture>, 2> kArchitectures{
    {{"decoder", Architecture::kDecoder}, {"encoder", Architecture::kEncoder}}};
constexpr std::array<std::pair<std::string_view, Activation>, 4> kActivations{
    {{"gelu", Activation::kGelu},
     {"swiglu", Activation::kSwiglu},
     {"relu", Activation::kRelu},
     {"gelu_new", Activation::kGeluNew}}};
constexpr std::array<std::pair<std::string_view, Norm>, 2> kNorms{
    {{"layernorm", Norm::kLayerNorm}, {"rmsnorm", Norm::kRmsNorm}}};
constexpr std::array<std::pair<std::string_view, PositionEmbedding>, 3> kPositions{
    {{"learned", PositionEmbedding::kLearned},
     {"rope", PositionEmbedding::kRope},
     {"none", PositionEmbedding::kNone}}};
constexpr std::array<std::pair<std::string_view, ModelKind>, 3> kKinds{
    {{"transformer", ModelKind::kTransformer}, {"mlp", ModelKind::kMlp}, {"cnn", ModelKind::kCnn}}};
constexpr std::array<std::pair<std::string_view, InceptionModule>, 5> kInceptionModules{
    {{"a", InceptionModule::kA},
     {"b", InceptionModule::kB},
     {"c", InceptionModule::kC},
     {"d", InceptionModule::kD},
     {"e", InceptionModule::kE}}};
constexpr std::array<std::pair<std::string_view, CnnLayerKind>, 10> kCnnLayers{
    {{"conv", CnnLayerKind::kConv},
     {"max_pool", CnnLayerKind::kMaxPool},
     {"avg_pool", CnnLayerKind::kAvgPool},
     {"adaptive_avg_pool", CnnLayerKind::kAdaptiveAvgPool},
     {"fc", CnnLayerKind::kFc},
     {"bottleneck", CnnLayerKind::kBottleneck},
     {"up_conv", CnnLayerKind::kUpConv},
     {"concat", CnnLayerKind::kConcat},
     {"amoeba_cell", CnnLayerKind::kAmoebaCell},
     {"inception", CnnLayerKind::kInception}}};
}  // namespace

EnumNames<Architecture> architecture_names() {
  return kArchitectures;
}
EnumNames<Activation> activation_names() {
  return kActivations;
}
EnumNames<Norm> norm_names() {
  return kNorms;
}
EnumNames<PositionEmbedding> position_embedding_names() {
  return kPositions;
}
EnumNames<ModelKind> model_kind_names() {
  return kKinds;
}
EnumNames<CnnLayerKind> cnn_layer_kind_names() {
  return kCnnLayers;
}
EnumNames<InceptionModule> inception_module_names() {
  return kInceptionModules;
}

namespace {

const Range kPositive = Range::at_least(1);
// CNN sizes (spec/limits.hpp): extents, channels and features, repeats.
const Range kCnnExtent = Range::between(1, static_cast<double>(kMaxCnnExtent));
const Range kCnnPadding = Range::between(0, static_cast<double>(kMaxCnnExtent));
const Range kCnnWidth = Range::between(1, static_cast<double>(kMaxWidth));
const Range kCnnRepeats = Range::between(1, static_cast<double>(kMaxLayers));

TransformerSpec decode_transformer(ObjectReader& r) {
  TransformerSpec t;
  t.architecture = r.enumeration("architecture", architecture_names()).value_or(t.architecture);
  t.layers = r.integer("layers", kPositive).value_or(1);
  t.hidden = r.integer("hidden", kPositive).value_or(1);
  t.heads = r.integer("heads", kPositive).value_or(1);
  t.kv_heads = r.integer("kv_heads", kPositive, Presence::kOptional).value_or(t.heads);
  t.ffn_hidden = r.integer("ffn_hidden", kPositive).value_or(1);
  t.vocab = r.integer("vocab", kPositive).value_or(1);
  t.seq_len = r.integer("seq_len", kPositive).value_or(1);
  t.activation = r.enumeration("activation", activation_names()).value_or(t.activation);
  t.norm = r.enumeration("norm", norm_names()).value_or(t.norm);
  t.tied_embeddings = r.boolean("tied_embeddings").value_or(false);
  t.position_embedding = r.enumeration("position_embedding", position_embedding_names())
                             .value_or(t.position_embedding);
  t.max_positions = r.integer("max_positions", kPositive, Presence::kOptional).value_or(t.seq_len);
  t.bias = r.boolean("bias").value_or(true);
  t.dropout = r.boolean("dropout", Presence::kOptional).value_or(false);
  t.type_vocab = r.integer("type_vocab", Range::non_negative(), Presence::kOptional).value_or(0);
  t.pooler = r.boolean("pooler", Presence::kOptional).value_or(false);
  if (auto moe = r.object("moe", Presence::kOptional)) {
    MoeSpec m;
    m.experts = moe->integer("experts", kPositive).value_or(1);
    m.top_k = moe->integer("top_k", kPositive).value_or(1);
    m.expert_ffn_hidden =
        moe->integer("expert_ffn_hidden", kPositive, Presence::kOptional).value_or(t.ffn_hidden);
    m.shared_experts =
        moe->integer("shared_experts", Range::non_negative(), Presence::kOptional).value_or(0);
    m.capacity_factor =
        moe->number("capacity_factor", Range::non_negative(), Presence::kOptional).value_or(0);
    m.dense_layers =
        moe->integer("dense_layers", Range::non_negative(), Presence::kOptional).value_or(0);
    m.load_imbalance =
        moe->number("load_imbalance", Range::between(1, 1e3), Presence::kOptional).value_or(0);
    if (moe->diagnostics().ok() && m.top_k > m.experts) {
      moe->problem("top_k", std::to_string(m.top_k),
                   fmt::format("must be <= experts ({})", m.experts));
    }
    if (moe->diagnostics().ok() && m.experts < 2)
      moe->problem("experts", std::to_string(m.experts),
                   "must be >= 2 (one expert is a dense MLP)");
    if (moe->diagnostics().ok() && m.dense_layers >= t.layers)
      moe->problem("dense_layers", std::to_string(m.dense_layers),
                   fmt::format("must be below the model's {} layers", t.layers));
    if (moe->diagnostics().ok() && m.capacity_factor > 0 &&
        m.capacity_factor * static_cast<double>(m.top_k) < 1.0 / static_cast<double>(m.experts))
      moe->problem("capacity_factor", fmt::format("{:g}", m.capacity_factor),
                   "leaves an expert less than one token slot per token routed");
    moe->finish();
    t.moe = m;
  }
  r.finish();
  if (!r.diagnostics().ok()) return t;
  for (const auto& [field, value, expected] : transformer_limit_problems(t))
    r.problem(field, std::to_string(value), expected);
  if (!r.diagnostics().ok()) return t;
  // Rules between fields.
  if (t.hidden % t.heads != 0) {
    r.problem("heads", std::to_string(t.heads), fmt::format("must divide hidden ({})", t.hidden));
  } else if (t.heads % t.kv_heads != 0) {
    r.problem("kv_heads", std::to_string(t.kv_heads),
              fmt::format("must divide heads ({})", t.heads));
  }
  if (t.position_embedding == PositionEmbedding::kLearned && t.max_positions < t.seq_len) {
    r.problem("max_positions", std::to_string(t.max_positions),
              fmt::format("must be >= seq_len ({}) with learned position embeddings", t.seq_len));
  }
  return t;
}

MlpSpec decode_mlp(ObjectReader& r) {
  MlpSpec m;
  m.widths = r.integer_array("widths", kPositive).value_or(std::vector<int64_t>{});
  m.activation = r.enumeration("activation", activation_names()).value_or(m.activation);
  m.bias = r.boolean("bias").value_or(true);
  r.finish();
  if (r.diagnostics().ok() && m.widths.size() < 2) {
    r.problem("widths", fmt::format("[{}]", fmt::join(m.widths, ",")),
              "needs at least an input and an output width");
  }
  if (r.diagnostics().ok() && m.activation != Activation::kRelu &&
      m.activation != Activation::kGelu) {
    r.problem("activation", fmt::format("\"{}\"", enum_name(activation_names(), m.activation)),
              "must be relu or gelu for an MLP");
  }
  return m;
}

// An Inception module: which one, its width (modules a and c only), the paper's widths' divisor.
void decode_inception(ObjectReader& r, CnnLayer& l) {
  l.module = r.enumeration("module", inception_module_names()).value_or(InceptionModule::kA);
  const bool widened = l.module == InceptionModule::kA || l.module == InceptionModule::kC;
  l.width = r.integer("width", kCnnWidth, widened ? Presence::kRequired : Presence::kOptional)
                .value_or(0);
  if (!widened && l.width != 0)
    r.problem("width", std::to_string(l.width),
              "only modules a (pool_features) and c (channels_7x7) take a width");
  l.divisor = r.integer("divisor", kCnnWidth, Presence::kOptional).value_or(1);
  if (!inception_divisor_fits(l.divisor))
    r.problem("divisor", std::to_string(l.divisor),
              "must divide every channel count of the paper's modules (48, 64, 96, 192, 320, "
              "384, 448): 1, 2, 4, 8 or 16");
  l.blocks = r.integer("blocks", kCnnRepeats, Presence::kOptional).value_or(1);
  if (inception_reduces(l.module) && l.blocks > 1)
    r.problem("blocks", std::to_string(l.blocks),
              "a reduction module (b, d) runs once (\"blocks\": 1); repeat the others");
}

CnnLayer decode_cnn_layer(ObjectReader& r) {
  CnnLayer l;
  l.kind = r.enumeration("type", cnn_layer_kind_names()).value_or(CnnLayerKind::kConv);
  switch (l.kind) {
    case CnnLayerKind::kConv:
      l.out_channels = r.integer("out_channels", kCnnWidth).value_or(1);
      l.kernel = r.integer("kernel", kCnnExtent).value_or(1);
      l.stride = r.integer("stride", kCnnExtent, Presence::kOptional).value_or(1);
      l.padding = r.integer("padding", kCnnPadding, Presence::kOptional).value_or(0);
      l.bias = r.boolean("bias").value_or(false);
      l.batch_norm = r.boolean("batch_norm", Presence::kOptional).value_or(false);
      l.relu = r.boolean("relu", Presence::kOptional).value_or(false);
      l.skip = r.boolean("skip", Presence::kOptional).value_or(false);
      break;
    case CnnLayerKind::kMaxPool:
    case CnnLayerKind::kAvgPool:
      l.kernel = r.integer("kernel", kCnnExtent).value_or(1);
      l.stride = r.integer("stride", kCnnExtent, Presence::kOptional).value_or(l.kernel);
      l.padding = r.integer("padding", kCnnPadding, Presence::kOptional).value_or(0);
      l.skip = r.boolean("skip", Presence::kOptional).value_or(false);
      // PyTorch's pools refuse more ("pad should be at most half of effective kernel size"): a
      // window of padding alone has nothing to pool.
      if (2 * l.padding > l.kernel)
        r.problem("padding", std::to_string(l.padding),
                  fmt::format("at most half the pool's kernel ({})", l.kernel));
      break;
    case CnnLayerKind::kUpConv:
      l.out_channels = r.integer("out_channels", kCnnWidth).value_or(1);
      l.kernel = r.integer("kernel", kCnnExtent).value_or(1);
      l.stride = r.integer("stride", kCnnExtent, Presence::kOptional).value_or(l.kernel);
      l.bias = r.boolean("bias").value_or(false);
      break;
    case CnnLayerKind::kConcat:
      break;
    case CnnLayerKind::kAdaptiveAvgPool:
      l.output = r.integer("output", kCnnExtent).value_or(1);
      break;
    case CnnLayerKind::kFc:
      l.out_features = r.integer("out_features", kCnnWidth).value_or(1);
      l.bias = r.boolean("bias").value_or(true);
      l.relu = r.boolean("relu", Presence::kOptional).value_or(false);
      break;
    case CnnLayerKind::kBottleneck:
      l.mid_channels = r.integer("mid_channels", kCnnWidth).value_or(1);
      l.out_channels = r.integer("out_channels", kCnnWidth).value_or(1);
      l.stride = r.integer("stride", kCnnExtent, Presence::kOptional).value_or(1);
      l.blocks = r.integer("blocks", kCnnRepeats, Presence::kOptional).value_or(1);
      break;
    case CnnLayerKind::kAmoebaCell:
      l.filters = r.integer("filters", kCnnWidth).value_or(4);
      l.reduction = r.boolean("reduction", Presence::kOptional).value_or(false);
      l.blocks = r.integer("blocks", kCnnRepeats, Presence::kOptional).value_or(1);
      if (l.filters % 4 != 0)
        r.problem("filters", std::to_string(l.filters),
                  "must be a multiple of 4 (the cell's convolutions narrow to filters/4, its "
                  "factorized reductions join two halves)");
      break;
    case CnnLayerKind::kInception:
      decode_inception(r, l);
      break;
  }
  r.finish();
  return l;
}

CnnSpec decode_cnn(ObjectReader& r) {
  CnnSpec c;
  if (auto in = r.object("input")) {
    c.in_channels = in->integer("channels", kCnnWidth).value_or(1);
    c.depth = in->integer("depth", kCnnExtent, Presence::kOptional).value_or(0);
    c.height = in->integer("height", kCnnExtent).value_or(1);
    c.width = in->integer("width", kCnnExtent).value_or(1);
    in->finish();
  }
  if (const Json* layers = r.array("layers")) {
    std::string base = pointer_join(r.pointer(), "layers");
    for (size_t i = 0; i < layers->size(); ++i) {
      ObjectReader lr = element_reader(*layers, base, i, r.diagnostics());
      c.layers.push_back(decode_cnn_layer(lr));
    }
    if (layers->empty()) r.problem("layers", "[]", "needs at least one layer");
  }
  r.finish();
  if (!r.diagnostics().ok()) return c;
  // Shapes must stay positive, once flattened by fc only fc may follow, and each concat needs a
  // kept map at least as large as the current one.
  CnnMap m{c.in_channels, c.input_depth(), c.height, c.width};
  std::vector<CnnMap> kept;
  bool flat = false;
  const std::string layers_at = pointer_join(r.pointer(), "layers");
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const CnnLayer& l = c.layers[i];
    std::string at = pointer_join(layers_at, i);
    if (flat && l.kind != CnnLayerKind::kFc) {
      r.diagnostics().add(at, "", "only fc layers may follow an fc layer");
      return c;
    }
    switch (l.kind) {
      case CnnLayerKind::kConcat: {
        if (kept.empty()) {
          r.diagnostics().add(at, "\"concat\"",
                              "needs an earlier layer with \"skip\": true whose map it joins");
          return c;
        }
        const CnnMap& k = kept.back();
        if (k.d < m.d || k.h < m.h || k.w < m.w) {
          r.diagnostics().add(at, "\"concat\"",
                              fmt::format("the kept map ({}x{}x{}) is smaller than the current one "
                                          "({}x{}x{}): it is cropped, never padded",
                                          k.d, k.h, k.w, m.d, m.h, m.w));
          return c;
        }
        break;
      }
      case CnnLayerKind::kBottleneck:
        if (c.volumes()) {
          r.diagnostics().add(at, "\"bottleneck\"",
                              "bottleneck blocks are ResNet's 2D blocks: not for volumes (depth)");
          return c;
        }
        break;
      case CnnLayerKind::kAmoebaCell:
        if (c.volumes()) {
          r.diagnostics().add(at, "\"amoeba_cell\"",
                              "AmoebaNet's cells are 2D: not for volumes (depth)");
          return c;
        }
        if (l.reduction && (m.h % 2 != 0 || m.w % 2 != 0)) {
          r.diagnostics().add(at, "\"amoeba_cell\"",
                              fmt::format("a reduction cell halves its {}x{} map: it needs even "
                                          "rows and columns (its cells' inputs must align)",
                                          m.h, m.w));
          return c;
        }
        if (l.reduction && l.blocks > 1) {
          r.diagnostics().add(at, std::to_string(l.blocks),
                              "a reduction cell runs once (\"blocks\": 1); repeat normal cells");
          return c;
        }
        break;
      case CnnLayerKind::kInception:
        if (c.volumes()) {
          r.diagnostics().add(at, "\"inception\"",
                              "Inception's modules are 2D: not for volumes (depth)");
          return c;
        }
        break;
      default:
        break;
    }
    if (l.kind == CnnLayerKind::kFc) flat = true;
    m = next_cnn_map(c, l, m, kept);
    if (m.d <= 0 || m.h <= 0 || m.w <= 0) {
      r.diagnostics().add(at, "",
                          fmt::format("the feature map shrinks to {}: kernel, stride or padding "
                                      "too large for the input",
                                      c.volumes() ? fmt::format("{}x{}x{}", m.d, m.h, m.w)
                                                  : fmt::format("{}x{}", m.h, m.w)));
      return c;
    }
    const double elements = static_cast<double>(m.c) * static_cast<double>(m.d) *
                            static_cast<double>(m.h) * static_cast<double>(m.w);
    if (elements > kMaxCnnMapElements) {
      r.diagnostics().add(at, "",
                          fmt::format("the feature map grows to {:.3g} elements a sample, past "
                                      "the limit of {:.3g} (spec/limits.hpp)",
                                      elements, kMaxCnnMapElements));
      return c;
    }
    if (l.skip) kept.push_back(m);
  }
  if (!kept.empty())
    r.problem(
        "layers", "",
        fmt::format("{} map(s) kept with \"skip\" but never joined by a concat", kept.size()));
  if (!flat && c.layers.back().kind != CnnLayerKind::kConv)
    r.problem("layers", "",
              "must end with an fc layer (the classifier) or a conv (a per-pixel classifier: "
              "segmentation)");
  return c;
}

}  // namespace

CnnMap next_cnn_map(const CnnSpec& cnn, const CnnLayer& l, CnnMap m, std::vector<CnnMap>& kept) {
  auto window = [&](int64_t extent) {
    return window_output(extent, l.kernel, l.stride, l.padding);
  };
  switch (l.kind) {
    case CnnLayerKind::kConv:
    case CnnLayerKind::kMaxPool:
    case CnnLayerKind::kAvgPool:
      if (cnn.volumes()) m.d = window(m.d);
      m.h = window(m.h);
      m.w = window(m.w);
      if (l.kind == CnnLayerKind::kConv) m.c = l.out_channels;
      break;
    case CnnLayerKind::kUpConv:
      if (cnn.volumes()) m.d = up_window_output(m.d, l.kernel, l.stride);
      m.h = up_window_output(m.h, l.kernel, l.stride);
      m.w = up_window_output(m.w, l.kernel, l.stride);
      m.c = l.out_channels;
      break;
    case CnnLayerKind::kConcat:
      SEXTANT_CHECK(!kept.empty(), "a concat without a kept map");
      m.c += kept.back().c;
      kept.pop_back();
      break;
    case CnnLayerKind::kAdaptiveAvgPool:
      m.h = m.w = l.output;
      if (cnn.volumes()) m.d = l.output;
      break;
    case CnnLayerKind::kBottleneck:
      m.h = bottleneck_output(m.h, l.stride);
      m.w = bottleneck_output(m.w, l.stride);
      m.c = l.out_channels;
      break;
    case CnnLayerKind::kFc:
      m = {l.out_features, 1, 1, 1};
      break;
    case CnnLayerKind::kAmoebaCell:
      if (l.reduction) {
        m.h /= 2;
        m.w /= 2;
      }
      m.c = amoeba_output_channels(l.filters, l.reduction);
      break;
    case CnnLayerKind::kInception:
      if (inception_reduces(l.module)) {
        m.h = window_output(m.h, 3, 2, 0);
        m.w = window_output(m.w, 3, 2, 0);
      }
      m.c = inception_output_channels(l.module, m.c, l.width, l.divisor);
      break;
  }
  return m;
}

std::vector<CnnMap> cnn_layer_maps(const CnnSpec& cnn) {
  std::vector<CnnMap> maps, kept;
  CnnMap m{cnn.in_channels, cnn.input_depth(), cnn.height, cnn.width};
  for (const CnnLayer& l : cnn.layers) {
    m = next_cnn_map(cnn, l, m, kept);
    if (l.skip) kept.push_back(m);
    maps.push_back(m);
  }
  return maps;
}

bool CnnSpec::has_skips() const {
  for (const CnnLayer& l : layers)
    if (l.skip) return true;
  return false;
}

bool CnnSpec::has_cells() const {
  for (const CnnLayer& l : layers)
    if (l.kind == CnnLayerKind::kAmoebaCell || l.kind == CnnLayerKind::kInception) return true;
  return false;
}

bool CnnSpec::has_inception() const {
  for (const CnnLayer& l : layers)
    if (l.kind == CnnLayerKind::kInception) return true;
  return false;
}

ModelSpec model_from_json(const Json& json, const std::string& source) {
  Diagnostics diag(source);
  ObjectReader r(json, "", diag);
  ModelSpec m;
  if (!r.is_object()) diag.throw_if_any();
  r.expect_schema(kModelSchema);
  m.name = r.string("name").value_or("");
  m.description = r.string("description", Presence::kOptional).value_or("");
  m.source = r.string("source", Presence::kOptional).value_or("");
  std::optional<ModelKind> kind = r.enumeration("kind", model_kind_names());
  if (kind) {
    switch (*kind) {
      case ModelKind::kTransformer:
        if (auto t = r.object("transformer")) m.body = decode_transformer(*t);
        break;
      case ModelKind::kMlp:
        if (auto t = r.object("mlp")) m.body = decode_mlp(*t);
        break;
      case ModelKind::kCnn:
        if (auto t = r.object("cnn")) m.body = decode_cnn(*t);
        break;
    }
  }
  if (m.name.empty() && r.has("name")) r.problem("name", "\"\"", "must not be empty");
  r.finish();
  diag.throw_if_any();
  return m;
}

namespace {

Json transformer_json(const TransformerSpec& t) {
  Json j = {{"architecture", enum_name(architecture_names(), t.architecture)},
            {"layers", t.layers},
            {"hidden", t.hidden},
            {"heads", t.heads},
            {"kv_heads", t.kv_heads},
            {"ffn_hidden", t.ffn_hidden},
            {"vocab", t.vocab},
            {"seq_len", t.seq_len},
            {"activation", enum_name(activation_names(), t.activation)},
            {"norm", enum_name(norm_names(), t.norm)},
            {"tied_embeddings", t.tied_embeddings},
            {"position_embedding", enum_name(position_embedding_names(), t.position_embedding)},
            {"max_positions", t.max_positions},
            {"bias", t.bias},
            {"dropout", t.dropout}};
  if (t.type_vocab > 0) j["type_vocab"] = t.type_vocab;
  if (t.pooler) j["pooler"] = true;
  if (t.moe) {
    j["moe"] = {{"experts", t.moe->experts},
                {"top_k", t.moe->top_k},
                {"expert_ffn_hidden", t.moe->expert_ffn_hidden},
                {"shared_experts", t.moe->shared_experts},
                {"capacity_factor", t.moe->capacity_factor},
                {"dense_layers", t.moe->dense_layers}};
    if (t.moe->load_imbalance > 0) j["moe"]["load_imbalance"] = t.moe->load_imbalance;
  }
  return j;
}

Json cnn_layer_json(const CnnLayer& l) {
  Json j = {{"type", enum_name(cnn_layer_kind_names(), l.kind)}};
  switch (l.kind) {
    case CnnLayerKind::kConv:
      j.update({{"out_channels", l.out_channels},
                {"kernel", l.kernel},
                {"stride", l.stride},
                {"padding", l.padding},
                {"bias", l.bias},
                {"batch_norm", l.batch_norm},
                {"relu", l.relu}});
      if (l.skip) j["skip"] = true;
      break;
    case CnnLayerKind::kMaxPool:
    case CnnLayerKind::kAvgPool:
      j.update({{"kernel", l.kernel}, {"stride", l.stride}, {"padding", l.padding}});
      if (l.skip) j["skip"] = true;
      break;
    case CnnLayerKind::kUpConv:
      j.update({{"out_channels", l.out_channels},
                {"kernel", l.kernel},
                {"stride", l.stride},
                {"bias", l.bias}});
      break;
    case CnnLayerKind::kConcat:
      break;
    case CnnLayerKind::kAdaptiveAvgPool:
      j["output"] = l.output;
      break;
    case CnnLayerKind::kFc:
      j.update({{"out_features", l.out_features}, {"bias", l.bias}, {"relu", l.relu}});
      break;
    case CnnLayerKind::kBottleneck:
      j.update({{"mid_channels", l.mid_channels},
                {"out_channels", l.out_channels},
                {"stride", l.stride},
                {"blocks", l.blocks}});
      break;
    case CnnLayerKind::kAmoebaCell:
      j.update({{"filters", l.filters}, {"reduction", l.reduction}, {"blocks", l.blocks}});
      break;
    case CnnLayerKind::kInception:
      j["module"] = enum_name(inception_module_names(), l.module);
      if (l.width != 0) j["width"] = l.width;
      if (l.divisor != 1) j["divisor"] = l.divisor;
      j["blocks"] = l.blocks;
      break;
  }
  return j;
}

}  // namespace

Json to_json(const ModelSpec& m) {
  Json j = {{"schema", kModelSchema}, {"name", m.name}};
  if (!m.description.empty()) j["description"] = m.description;
  if (!m.source.empty()) j["source"] = m.source;
  j["kind"] = enum_name(model_kind_names(), m.kind());
  switch (m.kind()) {
    case ModelKind::kTransformer:
      j["transformer"] = transformer_json(m.transformer());
      break;
    case ModelKind::kMlp:
      j["mlp"] = {{"widths", m.mlp().widths},
                  {"activation", enum_name(activation_names(), m.mlp().activation)},
                  {"bias", m.mlp().bias}};
      break;
    case ModelKind::kCnn: {
      Json layers = Json::array();
      for (const CnnLayer& l : m.cnn().layers) layers.push_back(cnn_layer_json(l));
      Json input = {
          {"channels", m.cnn().in_channels}, {"height", m.cnn().height}, {"width", m.cnn().width}};
      if (m.cnn().volumes()) input["depth"] = m.cnn().depth;
      j["cnn"] = {{"input", input}, {"layers", layers}};
      break;
    }
  }
  return j;
}

ModelSpec read_model_file(const std::string& path) {
  return model_from_json(read_json_file(path), path);
}

}  // namespace sextant::spec
