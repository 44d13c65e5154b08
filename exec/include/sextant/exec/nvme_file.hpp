// A rank's state offloaded to NVMe, ZeRO-Infinity's (Rajbhandari et al., SC'21; DeepSpeed's
// offload_optimizer and offload_param with device "nvme" and their nvme_path): fp32 values in a
// file of its own between the uses that read them.
// - The optimizer states: the rank's shard of the fp32 master weights and the two Adam moments,
//   which the host step reads whole before it updates them and writes back after (the simulator's
//   offload.adamw prices the two passes of sim::kNvmeOptimizerStateBytes per parameter at the
//   NVMe bandwidth). The executor keeps the gradients in the host pool, as DeepSpeed keeps them in
//   pinned host memory.
// - The parameters: the rank's shard of every layer, written after each host step
//   (offload.params_to_nvme) and read one layer's shard at a time before its gather
//   (offload.params_to_device, NVMe to host to device, as DeepSpeed's parameter swapper stages
//   them through pinned host buffers).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace sextant::exec {

class NvmeFile {
 public:
  // A file for `rank` in `dir` (created when missing; empty: the system's temporary directory),
  // named by what it holds (`contents`: "optimizer-states", "parameters") and by the process
  // too, so that two jobs sharing a directory keep apart. Throws InputError naming the directory
  // when it cannot be written.
  NvmeFile(const std::filesystem::path& dir, int64_t rank, const std::string& contents);
  ~NvmeFile();  // removes the file
  NvmeFile(const NvmeFile&) = delete;
  NvmeFile& operator=(const NvmeFile&) = delete;

  // Writes `pieces` one after another as the whole file (fp32, native byte order).
  void write(const std::vector<std::span<const float>>& pieces);
  // Reads the file back into `pieces`, which must add up to what was written; a file that is
  // shorter or longer is an error naming it, the bytes expected and found.
  void read(const std::vector<std::span<float>>& pieces) const;
  // Reads `out.size()` values starting at value `offset` of the file (one layer's shard); a range
  // beyond the file is an error naming it and both extents.
  void read_at(int64_t offset, std::span<float> out) const;

  const std::filesystem::path& path() const { return path_; }
  int64_t bytes() const { return bytes_; }  // of the last write

 private:
  std::filesystem::path path_;
  std::string contents_;
  int64_t bytes_ = 0;
};

}  // namespace sextant::exec
