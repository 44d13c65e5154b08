// The checkpoint manifest and shard header: what save writes reads back unchanged, and a damaged
// or foreign one is refused naming the file and the field (before: nlohmann's own exceptions, with
// neither, reached `run --resume` as "cannot read the checkpoint:
// [json.exception.type_error.302]").
#include "sextant/exec/checkpoint_manifest.hpp"

#include <gtest/gtest.h>

#include "sextant/spec/error.hpp"

namespace sextant::exec {
namespace {

Manifest two_rank_manifest() {
  return Manifest{
      .step = 4,
      .world = 2,
      .plan = "dp2.mb2",
      .shards = {{.file = "rank-00000.bin", .bytes = 1052, .checksum = "4c2b0b6e12a0f9d1"},
                 {.file = "rank-00001.bin", .bytes = 1052, .checksum = "0b3a5f9e7c1d2e40"}}};
}

std::string error_of(const spec::Json& j) {
  try {
    manifest_from_json(j, "ckpt/step-00000004/manifest.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(CheckpointManifest, RoundTrips) {
  const Manifest m = two_rank_manifest();
  const Manifest back = manifest_from_json(to_json(m), "m.json");
  EXPECT_EQ(back.step, 4);
  EXPECT_EQ(back.world, 2);
  EXPECT_EQ(back.plan, "dp2.mb2");
  ASSERT_EQ(back.shards.size(), 2u);
  EXPECT_EQ(back.shards[1].file, "rank-00001.bin");
  EXPECT_EQ(back.shards[1].bytes, 1052);
  EXPECT_EQ(back.shards[1].checksum, "0b3a5f9e7c1d2e40");

  const ShardHeader h{.step = 4, .rank = 1, .world = 2, .plan = "dp2.mb2", .elements = 87};
  const ShardHeader hb = shard_header_from_json(to_json(h), "rank-00001.bin");
  EXPECT_EQ(hb.rank, 1);
  EXPECT_EQ(hb.elements, 87);
  EXPECT_EQ(hb.plan, "dp2.mb2");
}

TEST(CheckpointManifest, DamageIsRefusedNamingFileAndField) {
  spec::Json j = to_json(two_rank_manifest());
  j["world"] = "two";
  std::string e = error_of(j);
  EXPECT_NE(e.find("manifest.json"), std::string::npos) << e;
  EXPECT_NE(e.find("/world"), std::string::npos) << e;

  j = to_json(two_rank_manifest());
  j["shards"].erase(1);  // one entry for two ranks: shards[1] would be read past the end
  e = error_of(j);
  EXPECT_NE(e.find("/shards"), std::string::npos) << e;
  EXPECT_NE(e.find("one entry per rank (2)"), std::string::npos) << e;

  j = to_json(two_rank_manifest());
  j["shards"][0]["bytes"] = -5;
  EXPECT_NE(error_of(j).find("/shards/0/bytes"), std::string::npos) << error_of(j);

  j = to_json(two_rank_manifest());
  j["schema"] = "sextant.checkpoint/1";  // a shard header where the manifest belongs
  EXPECT_NE(error_of(j).find("/schema"), std::string::npos) << error_of(j);

  EXPECT_NE(error_of(spec::Json::array()).find("manifest.json"), std::string::npos);

  spec::Json h =
      to_json(ShardHeader{.step = 1, .rank = 0, .world = 1, .plan = "dp1", .elements = 3});
  h["elements"] = 1.5;
  EXPECT_THROW(shard_header_from_json(h, "rank-00000.bin"), InputError);
}

}  // namespace
}  // namespace sextant::exec
