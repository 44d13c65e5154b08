// A rank's file of fp32 state offloaded to NVMe (optimizer states or parameters).
#include "sextant/exec/nvme_file.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <system_error>

#include "sextant/spec/error.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::exec {

NvmeFile::NvmeFile(const std::filesystem::path& dir, int64_t rank, const std::string& contents)
    : contents_(contents) {
  const std::filesystem::path where = dir.empty() ? std::filesystem::temp_directory_path() : dir;
  std::error_code ec;
  std::filesystem::create_directories(where, ec);
  if (ec)
    throw InputError(
        "--nvme-dir", "", where.string(),
        fmt::format("a directory the {} can be written to: {}", contents, ec.message()));
  path_ = where / fmt::format("sextant-{}.pid{}.rank{}.bin", contents, ::getpid(), rank);
  if (const std::string problem = spec::unwritable_reason(path_); !problem.empty())
    throw InputError("--nvme-dir", "", where.string(),
                     fmt::format("a directory the {} can be written to: {}", contents, problem));
}

NvmeFile::~NvmeFile() {
  std::error_code ignored;  // a destructor reports nothing; a file left behind is harmless
  std::filesystem::remove(path_, ignored);
}

void NvmeFile::write(const std::vector<std::span<const float>>& pieces) {
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
                     fmt::format("room to write the {} (the NVMe offload's file)", contents_));
  bytes_ = bytes;
}

void NvmeFile::read(const std::vector<std::span<float>>& pieces) const {
  int64_t want = 0;
  for (std::span<float> p : pieces) want += static_cast<int64_t>(p.size_bytes());
  std::error_code ec;
  const auto size = std::filesystem::file_size(path_, ec);
  if (ec || static_cast<int64_t>(size) != want)
    throw InputError(path_.string(), "", ec ? ec.message() : fmt::format("{} bytes", size),
                     fmt::format("the {} bytes of {} this rank wrote", want, contents_));
  std::ifstream in(path_, std::ios::binary);
  for (std::span<float> p : pieces)
    in.read(reinterpret_cast<char*>(p.data()), static_cast<std::streamsize>(p.size_bytes()));
  if (!in)
    throw InputError(path_.string(), "", "a short read",
                     fmt::format("the {} bytes of {} this rank wrote", want, contents_));
}

void NvmeFile::read_at(int64_t offset, std::span<float> out) const {
  const int64_t begin = offset * static_cast<int64_t>(sizeof(float));
  const auto want = static_cast<int64_t>(out.size_bytes());
  if (offset < 0 || begin + want > bytes_)
    throw InputError(
        path_.string(), "", fmt::format("{} bytes", bytes_),
        fmt::format("bytes [{}, {}) of the {} this rank wrote", begin, begin + want, contents_));
  std::ifstream in(path_, std::ios::binary);
  in.seekg(begin);
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(want));
  if (!in)
    throw InputError(
        path_.string(), "", "a short read",
        fmt::format("bytes [{}, {}) of the {} this rank wrote", begin, begin + want, contents_));
}

}  // namespace sextant::exec
