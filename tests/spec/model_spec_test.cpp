// ModelSpec decoding, validation and round trip.
#include "sextant/spec/model_spec.hpp"

#include <gtest/gtest.h>

#include "expect_input_error.hpp"

namespace sextant::spec {
namespace {

Json tiny() {
  return Json::parse(R"({
    "schema": "sextant.model/1", "name": "t", "kind": "transformer",
    "transformer": {"architecture": "decoder", "layers": 2, "hidden": 64, "heads": 4,
      "ffn_hidden": 256, "vocab": 100, "seq_len": 32, "activation": "gelu", "norm": "layernorm",
      "tied_embeddings": true, "position_embedding": "learned", "bias": true}})");
}

TEST(ModelSpec, DecodesAndDefaultsKvHeadsToHeads) {
  ModelSpec m = model_from_json(tiny(), "t.json");
  ASSERT_TRUE(m.is_transformer());
  EXPECT_EQ(m.transformer().kv_heads, 4);
  EXPECT_EQ(m.transformer().max_positions, 32);
  EXPECT_EQ(m.transformer().head_dim(), 16);
}

TEST(ModelSpec, RoundTripsThroughJson) {
  ModelSpec m = model_from_json(tiny(), "t.json");
  ModelSpec again = model_from_json(to_json(m), "again");
  EXPECT_EQ(to_json(m), to_json(again));
}

TEST(ModelSpec, RejectsHeadsThatDoNotDivideHidden) {
  Json j = tiny();
  j["transformer"]["heads"] = 5;
  EXPECT_INPUT_ERROR(model_from_json(j, "t.json"),
                     "t.json: /transformer/heads = 5: must divide hidden (64)");
}

TEST(ModelSpec, RejectsKvHeadsThatDoNotDivideHeads) {
  Json j = tiny();
  j["transformer"]["kv_heads"] = 3;
  EXPECT_INPUT_ERROR(model_from_json(j, "t.json"), "/transformer/kv_heads = 3: must divide heads");
}

TEST(ModelSpec, RejectsWrongSchemaAndUnknownKind) {
  Json j = tiny();
  j["schema"] = "sextant.model/2";
  EXPECT_INPUT_ERROR(model_from_json(j, "t.json"), "/schema = \"sextant.model/2\"");
  j = tiny();
  j["kind"] = "rnn";
  EXPECT_INPUT_ERROR(model_from_json(j, "t.json"), "must be one of transformer, mlp or cnn");
}

TEST(ModelSpec, RejectsTypoInNestedKey) {
  Json j = tiny();
  j["transformer"]["hiden"] = 64;
  EXPECT_INPUT_ERROR(model_from_json(j, "t.json"), "/transformer/hiden: unknown field");
}

TEST(ModelSpec, RejectsShortLearnedPositionTable) {
  Json j = tiny();
  j["transformer"]["max_positions"] = 16;
  EXPECT_INPUT_ERROR(model_from_json(j, "t.json"), "must be >= seq_len (32)");
}

TEST(ModelSpec, RejectsCnnWhoseFeatureMapVanishes) {
  Json j = Json::parse(R"({"schema": "sextant.model/1", "name": "c", "kind": "cnn",
    "cnn": {"input": {"channels": 3, "height": 8, "width": 8},
            "layers": [{"type": "conv", "out_channels": 4, "kernel": 11, "bias": false},
                       {"type": "fc", "out_features": 2, "bias": true}]}})");
  EXPECT_INPUT_ERROR(model_from_json(j, "c.json"), "/cnn/layers/0: the feature map shrinks");
}

// Found by the trust probe of issue 59: sizes past any real CNN were accepted (a 2^32-wide input
// overflowed to "0 B of activations", padding 2^40 gave 1792 TiB) and a 1x1 map pooled by 2
// stayed 1x1, where PyTorch refuses.
TEST(ModelSpec, CnnSizesAreRefusedBeforeAnyWork) {
  auto cnn = [](const std::string& input, const std::string& layer) {
    return Json::parse(
        R"({"schema": "sextant.model/1", "name": "c", "kind": "cnn", "cnn": {"input": )" + input +
        R"(, "layers": [)" + layer + R"(, {"type": "fc", "out_features": 2, "bias": true}]}})");
  };
  const std::string small = R"({"channels": 3, "height": 8, "width": 8})";
  const std::string conv = R"({"type": "conv", "out_channels": 4, "kernel": 3, "bias": false})";
  EXPECT_NO_THROW(model_from_json(cnn(small, conv), "c.json"));
  EXPECT_INPUT_ERROR(
      model_from_json(cnn(R"({"channels": 3, "height": 4294967296, "width": 8})", conv), "c.json"),
      "/cnn/input/height = 4294967296: must be in [1, 65536]");
  EXPECT_INPUT_ERROR(model_from_json(cnn(small, R"({"type": "conv", "out_channels": 4, "kernel": 3,
                                     "padding": 1099511627776, "bias": false})"),
                                     "c.json"),
                     "/cnn/layers/0/padding = 1099511627776: must be in [0, 65536]");
  EXPECT_INPUT_ERROR(model_from_json(cnn(R"({"channels": 3, "height": 1, "width": 1})",
                                         R"({"type": "max_pool", "kernel": 2})"),
                                     "c.json"),
                     "/cnn/layers/0: the feature map shrinks to 0x0");
  EXPECT_INPUT_ERROR(
      model_from_json(cnn(small, R"({"type": "max_pool", "kernel": 2, "padding": 2})"), "c.json"),
      "/cnn/layers/0/padding = 2: at most half the pool's kernel (2)");
  // Within every limit alone, but 2^20 channels of a 2^16 x 2^16 map: 2^52 elements a sample.
  EXPECT_INPUT_ERROR(model_from_json(cnn(R"({"channels": 3, "height": 65536, "width": 65536})",
                                         R"({"type": "conv", "out_channels": 1048576, "kernel": 1,
                              "bias": false})"),
                                     "c.json"),
                     "/cnn/layers/0: the feature map grows to 4.5e+15 elements a sample");
}

TEST(ModelSpec, RejectsMlpWithOneWidth) {
  Json j = Json::parse(R"({"schema": "sextant.model/1", "name": "m", "kind": "mlp",
    "mlp": {"widths": [8], "activation": "relu", "bias": true}})");
  EXPECT_INPUT_ERROR(model_from_json(j, "m.json"), "needs at least an input and an output width");
}

}  // namespace
}  // namespace sextant::spec

namespace sextant::spec {
namespace {

TEST(ModelSpec, MixtureOfExpertsDefaultsRoundTripsAndRules) {
  Json j = Json::parse(R"({
    "schema": "sextant.model/1", "name": "t", "kind": "transformer",
    "transformer": {"architecture": "decoder", "layers": 2, "hidden": 64, "heads": 4,
      "ffn_hidden": 256, "vocab": 100, "seq_len": 32, "activation": "gelu", "norm": "layernorm",
      "tied_embeddings": true, "position_embedding": "learned", "bias": true,
      "moe": {"experts": 8, "top_k": 2}}})");
  const ModelSpec m = model_from_json(j, "t.json");
  ASSERT_TRUE(m.transformer().moe.has_value());
  const MoeSpec& moe = *m.transformer().moe;
  EXPECT_EQ(moe.expert_ffn_hidden, 256);  // the dense MLP's width unless given
  EXPECT_EQ(moe.shared_experts, 0);
  EXPECT_EQ(moe.capacity_factor, 0);  // dropless
  EXPECT_EQ(moe.dense_layers, 0);
  EXPECT_EQ(to_json(model_from_json(to_json(m), "again")), to_json(m));
  auto with = [&](const char* key, Json value) {
    Json k = j;
    k["transformer"]["moe"][key] = std::move(value);
    return k;
  };
  EXPECT_INPUT_ERROR(model_from_json(with("top_k", 9), "t.json"),
                     "/transformer/moe/top_k = 9: must be <= experts (8)");
  EXPECT_INPUT_ERROR(model_from_json(with("experts", 1), "t.json"), "/transformer/moe/");
  EXPECT_INPUT_ERROR(model_from_json(with("dense_layers", 2), "t.json"),
                     "/transformer/moe/dense_layers = 2: must be below the model's 2 layers");
  EXPECT_INPUT_ERROR(model_from_json(with("capacity_factor", -1), "t.json"),
                     "/transformer/moe/capacity_factor");
  EXPECT_INPUT_ERROR(model_from_json(with("experts_per_token", 2), "t.json"),
                     "/transformer/moe/experts_per_token: unknown field");
}

}  // namespace
}  // namespace sextant::spec
