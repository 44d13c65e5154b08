// Hugging Face config.json import: the imported model has the checkpoint's exact parameter count.
#include "sextant/models/hf_import.hpp"

#include <gtest/gtest.h>

#include "expect_input_error.hpp"
#include "sextant/models/counts.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/json_io.hpp"
#include "test_paths.hpp"

namespace sextant::models {
namespace {

TEST(HfImport, Gpt2MatchesTheCheckpoint) {
  spec::ModelSpec m = resolve_model(test::data_path("hf/gpt2-config.json"));
  EXPECT_EQ(m.name, "gpt2-config");
  EXPECT_EQ(parameter_count(m), 124'439'808);  // Hugging Face gpt2
  EXPECT_TRUE(m.transformer().tied_embeddings);
  EXPECT_EQ(m.transformer().ffn_hidden, 3072);  // n_inner null -> 4 * n_embd
  // "activation_function": "gelu_new": Hugging Face's NewGELUActivation, as the zoo's GPT-2.
  EXPECT_EQ(m.transformer().activation, spec::Activation::kGeluNew);
  EXPECT_EQ(zoo_model("gpt2-124m").transformer().activation, spec::Activation::kGeluNew);
}

TEST(HfImport, ActivationsAreHuggingFacesOrAClearError) {
  spec::Json j = spec::read_json_file(test::data_path("hf/gpt2-config.json"));
  j["activation_function"] = "gelu_pytorch_tanh";  // F.gelu(approximate="tanh"): one kernel
  EXPECT_EQ(import_hf_config(j, "cfg.json", "x").transformer().activation, spec::Activation::kGelu);
  j.erase("activation_function");  // GPT2Config's default
  EXPECT_EQ(import_hf_config(j, "cfg.json", "x").transformer().activation,
            spec::Activation::kGeluNew);
  j["activation_function"] = "quick_gelu";
  EXPECT_INPUT_ERROR(import_hf_config(j, "cfg.json", "x"),
                     "cfg.json: /activation_function = \"quick_gelu\": must be gelu_new, gelu, "
                     "gelu_pytorch_tanh or relu");
}

TEST(HfImport, LlamaWithGroupedQueryAttention) {
  spec::ModelSpec m = resolve_model(test::data_path("hf/llama-2-70b-config.json"));
  EXPECT_EQ(m.transformer().kv_heads, 8);
  EXPECT_EQ(m.transformer().activation, spec::Activation::kSwiglu);
  EXPECT_EQ(parameter_count(m), 68'976'648'192);  // meta-llama/Llama-2-70b-hf
  EXPECT_EQ(spec::to_json(m)["transformer"], spec::to_json(zoo_model("llama2-70b"))["transformer"]);
}

// mistralai/Mixtral-8x7B-v0.1's config.json: the zoo's Mixtral, experts and all.
TEST(HfImport, MixtralIsAMixtureOfExperts) {
  spec::ModelSpec m = resolve_model(test::data_path("hf/mixtral-8x7b-config.json"));
  ASSERT_TRUE(m.transformer().moe.has_value());
  EXPECT_EQ(m.transformer().moe->experts, 8);
  EXPECT_EQ(m.transformer().moe->top_k, 2);
  EXPECT_EQ(parameter_count(m), parameter_count(zoo_model("mixtral-8x7b")));
  EXPECT_EQ(m.transformer().seq_len, 8192);  // imports cap the sequence (kMaxImportedSeqLen)
  m.transformer().seq_len = 32768;           // the zoo's: Mixtral's 32k training context
  EXPECT_EQ(spec::to_json(m)["transformer"],
            spec::to_json(zoo_model("mixtral-8x7b"))["transformer"]);
}

TEST(HfImport, BertLarge) {
  spec::ModelSpec m = resolve_model(test::data_path("hf/bert-large-uncased-config.json"));
  EXPECT_EQ(parameter_count(m), 335'141'888);
  EXPECT_EQ(m.transformer().architecture, spec::Architecture::kEncoder);
}

TEST(HfImport, UnsupportedTypeIsAClearError) {
  EXPECT_INPUT_ERROR(resolve_model(test::data_path("hf/t5-config.json")),
                     "/model_type = \"t5\": unsupported: must be gpt2, llama, mistral, mixtral or "
                     "bert");
}

TEST(HfImport, MissingFieldsAreListed) {
  spec::Json j = spec::Json::parse(R"({"model_type": "llama", "hidden_size": 64})");
  EXPECT_INPUT_ERROR(import_hf_config(j, "cfg.json", "x"),
                     "cfg.json: /num_hidden_layers: missing required field");
}

TEST(HfImport, UnknownZooNameListsTheZoo) {
  EXPECT_INPUT_ERROR(resolve_model("gpt5"), "unknown model: give a model file or one of");
}

}  // namespace
}  // namespace sextant::models
