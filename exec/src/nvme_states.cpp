// The optimizer states' file of a rank whose optimizer is offloaded to NVMe.
#include "sextant/exec/nvme_states.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <system_error>

#include "sextant/spec/error.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::exec {

NvmeStates::NvmeStates(const std::filesystem::path& dir, int64_t rank) {
  const std::filesystem::path where = dir.empty() ? std::filesystem::temp_directory_path() : dir;
  std::error_code ec;
  std::filesystem::create_directories(where, ec);
  if (ec)
    throw InputError(
        "--nvme-dir", "", where.string(),
        fmt::format("a directory the optimizer states can be written to: {}", ec.message()));
  path_ = where / fmt::format("sextant-optimizer-states.pid{}.rank{}.bin", ::getpid(), rank);
  if (const std::string problem = spec::unwritable_reason(path_); !problem.empty())
    throw InputError("--nvme-dir", "", where.string(),
                     "a directory the optimizer states can be written to: " + problem);
}

NvmeStates::~NvmeStates() {
  std::error_code ignored;  // a destructor reports nothing; a file left behind is harmless
  std::filesystem::remove(path_, ignored);
}

void NvmeStates::write(const std::vector<std::span<const float>>& pieces) {
  std::ofstream out(path_, std::ios::binary | std::ios::trunc);
  int64_t bytes = 0;
  for (std::span<const float> p : pieces) {
    out.write(reinterpret_cast<const char*>(p.data()),
              static_cast<std::streamsize>(p.size_bytes()));
    bytes += static_cast<int64_t>(p.size_bytes());
  }
  out.flush();
  if (!out)
    throw InputError(path_.string(), "", fmt::format("{} bytes", bytes),
                     "room to write the optimizer states (the NVMe offload's file)");
  bytes_ = bytes;
}

void NvmeStates::read(const std::vector<std::span<float>>& pieces) const {
  int64_t want = 0;
  for (std::span<float> p : pieces) want += static_cast<int64_t>(p.size_bytes());
  std::error_code ec;
  const auto size = std::filesystem::file_size(path_, ec);
  if (ec || static_cast<int64_t>(size) != want)
    throw InputError(path_.string(), "", ec ? ec.message() : fmt::format("{} bytes", size),
                     fmt::format("the {} bytes of optimizer states this rank wrote", want));
  std::ifstream in(path_, std::ios::binary);
  for (std::span<float> p : pieces)
    in.read(reinterpret_cast<char*>(p.data()), static_cast<std::streamsize>(p.size_bytes()));
  if (!in)
    throw InputError(path_.string(), "", "a short read",
                     fmt::format("the {} bytes of optimizer states this rank wrote", want));
}

}  // namespace sextant::exec
