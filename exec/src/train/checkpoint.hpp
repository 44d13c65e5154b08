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
  // The training state of a compressed gradient exchange, each array one value per parameter
  // (GradientSync::save_state: the error-feedback residual, PowerSGD's Q factors), or none, and
  // under PipeDream-2BW after them the older weight version. How many follows from the plan,
  // which the manifest names.
  std::vector<std::vector<float>> exchange;
};

// Collective over `world`: every rank saves its shard of step `step` under dir/step-NNNNNNNN/.
void save_checkpoint(const std::string& dir, const std::string& plan, const Shard& shard,
                     Communicator& world);
// Collective: this rank's shard of the newest intact checkpoint, std::nullopt when `dir` holds
// none. A damaged one (missing or truncated shard, checksum mismatch) on any rank is skipped by
// every rank for the next older one, and `skipped` (rank 0's) says which and why; none intact
// throws InputError naming the newest's problem. Another plan, world size or parameter count
// throws at once: that directory belongs to another run.
std::optional<Shard> load_checkpoint(const std::string& dir, const std::string& plan,
                                     int64_t elements, Communicator& world,
                                     std::vector<std::string>* skipped = nullptr);

}  // namespace sextant::exec
