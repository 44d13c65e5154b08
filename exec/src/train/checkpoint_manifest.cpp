// Decoding and encoding of the checkpoint manifest and shard headers.
#include "sextant/exec/checkpoint_manifest.hpp"

#include <fmt/format.h>

#include "sextant/spec/error.hpp"
#include "sextant/spec/limits.hpp"

namespace sextant::exec {

namespace {

constexpr std::string_view kManifestSchema = "sextant.checkpoint_manifest/1";
constexpr std::string_view kShardSchema = "sextant.checkpoint/1";
// Far above any job, low enough that step arithmetic cannot overflow.
constexpr int64_t kMaxSteps = int64_t{1} << 40;
constexpr double kMaxRanks = static_cast<double>(spec::kMaxRanks);

}  // namespace

Manifest manifest_from_json(const spec::Json& json, const std::string& source) {
  Diagnostics diag(source);
  spec::ObjectReader r(json, "", diag);
  if (!r.is_object()) diag.throw_if_any();
  r.expect_schema(kManifestSchema);
  Manifest m;
  if (auto v = r.integer("step", spec::Range::between(0, kMaxSteps))) m.step = *v;
  if (auto v = r.integer("world", spec::Range::between(1, kMaxRanks))) m.world = *v;
  if (auto v = r.string("plan")) m.plan = *v;
  if (const spec::Json* shards = r.array("shards")) {
    for (size_t i = 0; i < shards->size(); ++i) {
      spec::ObjectReader e = spec::element_reader(*shards, "/shards", i, diag);
      if (!e.is_object()) continue;
      ManifestEntry entry;
      if (auto v = e.string("file")) entry.file = *v;
      if (auto v = e.integer("bytes", spec::Range::at_least(0))) entry.bytes = *v;
      if (auto v = e.string("checksum")) entry.checksum = *v;
      e.finish();
      m.shards.push_back(std::move(entry));
    }
    if (m.world > 0 && std::ssize(*shards) != m.world) {
      r.problem("shards", fmt::format("{} entries", shards->size()),
                fmt::format("one entry per rank ({})", m.world));
    }
  }
  r.finish();
  diag.throw_if_any();
  return m;
}

spec::Json to_json(const Manifest& m) {
  spec::Json shards = spec::Json::array();
  for (const ManifestEntry& e : m.shards)
    shards.push_back({{"file", e.file}, {"bytes", e.bytes}, {"checksum", e.checksum}});
  return {{"schema", kManifestSchema},
          {"step", m.step},
          {"world", m.world},
          {"plan", m.plan},
          {"shards", std::move(shards)}};
}

ShardHeader shard_header_from_json(const spec::Json& json, const std::string& source) {
  Diagnostics diag(source);
  spec::ObjectReader r(json, "", diag);
  if (!r.is_object()) diag.throw_if_any();
  r.expect_schema(kShardSchema);
  ShardHeader h;
  if (auto v = r.integer("step", spec::Range::between(0, kMaxSteps))) h.step = *v;
  if (auto v = r.integer("world", spec::Range::between(1, kMaxRanks))) h.world = *v;
  if (auto v = r.integer("rank", spec::Range::between(0, kMaxRanks - 1))) h.rank = *v;
  if (auto v = r.string("plan")) h.plan = *v;
  if (auto v = r.integer("elements", spec::Range::at_least(0))) h.elements = *v;
  r.finish();
  diag.throw_if_any();
  return h;
}

spec::Json to_json(const ShardHeader& h) {
  return {{"schema", kShardSchema}, {"step", h.step}, {"rank", h.rank},
          {"world", h.world},       {"plan", h.plan}, {"elements", h.elements}};
}

}  // namespace sextant::exec
