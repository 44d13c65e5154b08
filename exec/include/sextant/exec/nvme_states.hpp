// ZeRO-Infinity's optimizer states on NVMe (DeepSpeed's offload_optimizer with device "nvme" and
// its nvme_path; Rajbhandari et al., SC'21): between steps a rank's shard of the fp32 master
// weights and the two Adam moments lives in a file of its own, which the host step reads before
// it updates them and writes back after (the simulator's offload.adamw prices the two passes of
// sim::kNvmeOptimizerStateBytes per parameter at the NVMe bandwidth). The executor keeps the
// gradients in the host pool, as DeepSpeed keeps them in pinned host memory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

namespace sextant::exec {

class NvmeStates {
 public:
  // A file for `rank` in `dir` (created when missing; empty: the system's temporary directory),
  // named by the process too, so that two jobs sharing a directory keep apart. Throws InputError
  // naming the directory when it cannot be written.
  NvmeStates(const std::filesystem::path& dir, int64_t rank);
  ~NvmeStates();  // removes the file
  NvmeStates(const NvmeStates&) = delete;
  NvmeStates& operator=(const NvmeStates&) = delete;

  // Writes `pieces` one after another as the whole file (fp32, native byte order).
  void write(const std::vector<std::span<const float>>& pieces);
  // Reads the file back into `pieces`, which must add up to what was written; a file that is
  // shorter or longer is an error naming it, the bytes expected and found.
  void read(const std::vector<std::span<float>>& pieces) const;

  const std::filesystem::path& path() const { return path_; }
  int64_t bytes() const { return bytes_; }  // of the last write

 private:
  std::filesystem::path path_;
  int64_t bytes_ = 0;
};

}  // namespace sextant::exec
