// Hugging Face config.json import. Only the fields that shape the model are read; the many other
// fields of such files (tokenizer ids, dtype, ...) are ignored on purpose.
#include "sextant/models/hf_import.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "sextant/spec/limits.hpp"

namespace sextant::models {

using spec::Json;

bool is_hf_config(const Json& json) {
  return json.is_object() && json.contains("model_type") && !json.contains("schema");
}

namespace {

// Reads the fields of one HF config, recording problems with their JSON pointer.
class HfReader {
 public:
  HfReader(const Json& json, Diagnostics& diag) : json_(json), diag_(diag) {}

  int64_t positive(std::string_view key) {
    auto it = json_.find(key);
    if (it == json_.end()) {
      diag_.add(spec::pointer_join("", key), "", "missing required field");
      return 1;
    }
    if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
      diag_.add(spec::pointer_join("", key), spec::short_dump(*it), "must be an integer > 0");
      return 1;
    }
    return it->get<int64_t>();
  }
  std::optional<int64_t> optional_positive(std::string_view key) {
    auto it = json_.find(key);
    if (it == json_.end() || it->is_null()) return std::nullopt;
    return positive(key);
  }
  bool flag(std::string_view key, bool fallback) {
    auto it = json_.find(key);
    if (it == json_.end()) return fallback;
    if (!it->is_boolean()) {
      diag_.add(spec::pointer_join("", key), spec::short_dump(*it), "must be true or false");
      return fallback;
    }
    return it->get<bool>();
  }
  double number(std::string_view key, double fallback) {
    auto it = json_.find(key);
    if (it == json_.end() || !it->is_number()) return fallback;
    return it->get<double>();
  }
  std::string text(std::string_view key, std::string fallback) {
    auto it = json_.find(key);
    if (it == json_.end() || !it->is_string()) return fallback;
    return it->get<std::string>();
  }

 private:
  const Json& json_;
  Diagnostics& diag_;
};

// The activation a GPT-2 or BERT config names (transformers/activations.py ACT2CLS): "gelu_new"
// is NewGELUActivation, the tanh formula written as tensor arithmetic; "gelu" (F.gelu) and
// "gelu_pytorch_tanh" (F.gelu(approximate="tanh")) are one PyTorch kernel each.
spec::Activation hf_activation(HfReader& r, Diagnostics& diag, const char* field,
                               const char* fallback) {
  const std::string act = r.text(field, fallback);
  if (act == "gelu_new") return spec::Activation::kGeluNew;
  if (act == "gelu" || act == "gelu_pytorch_tanh") return spec::Activation::kGelu;
  if (act == "relu") return spec::Activation::kRelu;
  diag.add(std::string("/") + field, spec::short_dump(Json(act)),
           "must be gelu_new, gelu, gelu_pytorch_tanh or relu");
  return spec::Activation::kGelu;
}

// Training sequence length of an imported model: its context length, capped, because long-context
// variants (Llama-3.1: 131072) are trained mostly at shorter lengths. --seq-len overrides it.
constexpr int64_t kMaxImportedSeqLen = 8192;

}  // namespace

spec::ModelSpec import_hf_config(const Json& json, const std::string& source,
                                 const std::string& name) {
  Diagnostics diag(source);
  if (!is_hf_config(json)) {
    diag.add("/model_type", "", "missing: not a Hugging Face config.json");
    diag.throw_if_any();
  }
  HfReader r(json, diag);
  std::string type =
      json.at("model_type").is_string() ? json.at("model_type").get<std::string>() : "";
  spec::ModelSpec model;
  model.name = name;
  model.source = "Hugging Face config.json (" + source + ")";
  spec::TransformerSpec t;
  if (type == "gpt2") {
    t.architecture = spec::Architecture::kDecoder;
    t.hidden = r.positive("n_embd");
    t.layers = r.positive("n_layer");
    t.heads = r.positive("n_head");
    t.kv_heads = t.heads;
    t.max_positions = r.positive("n_positions");
    t.vocab = r.positive("vocab_size");
    t.ffn_hidden = r.optional_positive("n_inner").value_or(4 * t.hidden);
    // GPT2Config's default activation_function is "gelu_new".
    t.activation = hf_activation(r, diag, "activation_function", "gelu_new");
    t.norm = spec::Norm::kLayerNorm;
    t.position_embedding = spec::PositionEmbedding::kLearned;
    t.tied_embeddings = r.flag("tie_word_embeddings", true);
    t.bias = true;
    t.dropout = r.number("resid_pdrop", 0.1) > 0;
  } else if (type == "llama" || type == "mistral" || type == "mixtral") {
    t.architecture = spec::Architecture::kDecoder;
    t.hidden = r.positive("hidden_size");
    t.layers = r.positive("num_hidden_layers");
    t.heads = r.positive("num_attention_heads");
    t.kv_heads = r.optional_positive("num_key_value_heads").value_or(t.heads);
    t.ffn_hidden = r.positive("intermediate_size");
    t.vocab = r.positive("vocab_size");
    t.max_positions = r.positive("max_position_embeddings");
    std::string act = r.text("hidden_act", "silu");
    if (act != "silu" && act != "swish") {
      diag.add("/hidden_act", spec::short_dump(Json(act)), "must be \"silu\" (SwiGLU) for Llama");
    }
    t.activation = spec::Activation::kSwiglu;
    t.norm = spec::Norm::kRmsNorm;
    t.position_embedding = spec::PositionEmbedding::kRope;
    t.tied_embeddings = r.flag("tie_word_embeddings", false);
    t.bias = r.flag("attention_bias", false);
    t.dropout = r.number("attention_dropout", 0.0) > 0;
    if (type == "mixtral") {  // MixtralConfig: every layer's MLP is a mixture of experts
      spec::MoeSpec moe;
      moe.experts = r.positive("num_local_experts");
      moe.top_k = r.positive("num_experts_per_tok");
      moe.expert_ffn_hidden = t.ffn_hidden;
      if (moe.experts < 2 || moe.top_k > moe.experts)
        diag.add("/num_experts_per_tok", std::to_string(moe.top_k),
                 fmt::format("must be between 1 and num_local_experts ({}), with at least 2 "
                             "experts",
                             moe.experts));
      t.moe = moe;
    }
  } else if (type == "bert") {
    t.architecture = spec::Architecture::kEncoder;
    t.hidden = r.positive("hidden_size");
    t.layers = r.positive("num_hidden_layers");
    t.heads = r.positive("num_attention_heads");
    t.kv_heads = t.heads;
    t.ffn_hidden = r.positive("intermediate_size");
    t.vocab = r.positive("vocab_size");
    t.max_positions = r.positive("max_position_embeddings");
    t.type_vocab = r.optional_positive("type_vocab_size").value_or(2);
    t.activation = hf_activation(r, diag, "hidden_act", "gelu");
    t.norm = spec::Norm::kLayerNorm;
    t.position_embedding = spec::PositionEmbedding::kLearned;
    t.tied_embeddings = true;
    t.bias = true;
    t.dropout = r.number("hidden_dropout_prob", 0.1) > 0;
    t.pooler = true;
  } else {
    diag.add("/model_type", spec::short_dump(json.at("model_type")),
             "unsupported: must be gpt2, llama, mistral, mixtral or bert");
  }
  diag.throw_if_any();
  t.seq_len = std::min(t.max_positions, kMaxImportedSeqLen);
  for (const auto& [field, value, expected] : spec::transformer_limit_problems(t))
    diag.add("/" + field, std::to_string(value), expected);
  diag.throw_if_any();
  if (t.hidden % t.heads != 0) {
    diag.add("/num_attention_heads", std::to_string(t.heads),
             fmt::format("must divide the hidden size ({})", t.hidden));
  } else if (t.heads % t.kv_heads != 0) {
    diag.add("/num_key_value_heads", std::to_string(t.kv_heads),
             fmt::format("must divide the attention heads ({})", t.heads));
  }
  diag.throw_if_any();
  model.body = t;
  return model;
}

}  // namespace sextant::models
