// Sharded checkpoints: each rank writes its parameters and optimizer state to its own file
// (temporary name, then rename), and rank 0 then writes a manifest with every file's size and
// checksum. A checkpoint counts only once its manifest exists; resuming verifies each file
// against it, so a truncated or mismatched shard is refused with a clear error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sextant/exec/communicator.hpp"

namespace sextant::exec {

struct Shard {
  int64_t step = 0;  // steps completed
  std::vector<float> values, m, v;
};

// Collective over `world`: every rank saves its shard of step `step` under dir/step-NNNNNNNN/.
void save_checkpoint(const std::string& dir, const std::string& plan, const Shard& shard,
                     Communicator& world);
// Collective: the newest complete checkpoint's shard of this rank, std::nullopt when there is
// none. Throws InputError (on every rank) when a checkpoint is unusable: missing or truncated
// file, checksum mismatch, another plan or world size, or another parameter count.
std::optional<Shard> load_checkpoint(const std::string& dir, const std::string& plan,
                                     int64_t elements, Communicator& world);

}  // namespace sextant::exec
