// What a checkpoint says about itself: the manifest (sextant.checkpoint_manifest/1, one per step
// directory, written last) and each shard's header line (sextant.checkpoint/1). Decoded with the
// readers every input uses, so a damaged or foreign checkpoint is refused naming its file and
// field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sextant/spec/json_reader.hpp"

namespace sextant::exec {

struct ManifestEntry {
  std::string file;  // the shard's file name inside the step directory
  int64_t bytes = 0;
  std::string checksum;  // FNV-1a of the whole file, 16 hex digits
};

struct Manifest {
  int64_t step = 0;
  int64_t world = 0;
  std::string plan;
  std::vector<ManifestEntry> shards;  // one per rank, in rank order
};

struct ShardHeader {
  int64_t step = 0;
  int64_t rank = 0;
  int64_t world = 0;
  std::string plan;
  int64_t elements = 0;  // parameters of this rank's shard (values, m and v follow, fp32 each)
};

Manifest manifest_from_json(const spec::Json& json, const std::string& source);
spec::Json to_json(const Manifest& manifest);
ShardHeader shard_header_from_json(const spec::Json& json, const std::string& source);
spec::Json to_json(const ShardHeader& header);

}  // namespace sextant::exec
