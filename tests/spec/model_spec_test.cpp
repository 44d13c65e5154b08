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

TEST(ModelSpec, RejectsMlpWithOneWidth) {
  Json j = Json::parse(R"({"schema": "sextant.model/1", "name": "m", "kind": "mlp",
    "mlp": {"widths": [8], "activation": "relu", "bias": true}})");
  EXPECT_INPUT_ERROR(model_from_json(j, "m.json"), "needs at least an input and an output width");
}

}  // namespace
}  // namespace sextant::spec
