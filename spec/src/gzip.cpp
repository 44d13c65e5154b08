// gzip compression and decompression with zlib's stream API (windowBits 15 + 16 selects the gzip
// wrapper: zlib manual, deflateInit2 / inflateInit2).
#include "sextant/spec/gzip.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <stdexcept>

#include "sextant/spec/error.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/limits.hpp"

namespace sextant::spec {

namespace {

constexpr int kGzipWindowBits = 15 + 16;

}  // namespace

bool is_gzip_name(const std::filesystem::path& path) {
  return path.extension() == ".gz";
}

std::string read_gzip_file(const std::filesystem::path& path) {
  const std::string packed = read_text_file(path);
  if (std::ssize(packed) >= kMaxDecompressedBytes)  // zlib counts input in 32 bits
    throw InputError(path.string(), "", "", "larger than the limit on decompressed input");
  // Checked as it grows: the absolute limit, and the ratio a real trace never reaches.
  const int64_t limit =
      std::min(kMaxDecompressedBytes, kMaxGzipRatio * std::max<int64_t>(std::ssize(packed), 1024));
  z_stream z{};
  if (inflateInit2(&z, kGzipWindowBits) != Z_OK)
    throw std::runtime_error("zlib: inflateInit2 failed");
  auto fail = [&](const std::string& why) {
    inflateEnd(&z);
    throw InputError(path.string(), "", "", why);
  };
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(packed.data()));
  z.avail_in = static_cast<uInt>(packed.size());
  std::string text;
  std::array<char, 1 << 16> buffer{};
  while (true) {
    z.next_out = reinterpret_cast<Bytef*>(buffer.data());
    z.avail_out = static_cast<uInt>(buffer.size());
    const int rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END)
      fail("not a readable gzip file: " +
           std::string(z.msg != nullptr ? z.msg : (rc == Z_BUF_ERROR ? "truncated" : "error")));
    text.append(buffer.data(), buffer.size() - z.avail_out);
    if (std::ssize(text) > limit)
      fail(limit == kMaxDecompressedBytes
               ? fmt::format("decompresses past {} GiB", kMaxDecompressedBytes >> 30)
               : fmt::format("decompresses to more than {}x its {} bytes (no trace compresses "
                             "past ~40x): a damaged or malicious file",
                             kMaxGzipRatio, packed.size()));
    if (rc != Z_STREAM_END) continue;
    // RFC 1952: a gzip file is one or more members, read as their concatenation (`gzip -c a b`,
    // pigz, appended logs).
    if (z.avail_in == 0) break;
    if (inflateReset(&z) != Z_OK) fail("not a readable gzip file: a damaged member");
  }
  inflateEnd(&z);
  return text;
}

std::string gzip_compress(std::string_view text) {
  z_stream z{};
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, kGzipWindowBits, 8, Z_DEFAULT_STRATEGY) !=
      Z_OK)
    throw std::runtime_error("zlib: deflateInit2 failed");
  std::string packed;
  std::array<char, 1 << 16> buffer{};
  size_t pos = 0;
  int flush = Z_NO_FLUSH;
  while (flush != Z_FINISH) {
    // zlib counts input in 32-bit units: feed at most 1 GiB at a time.
    const size_t chunk = std::min<size_t>(text.size() - pos, size_t{1} << 30);
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data() + pos));
    z.avail_in = static_cast<uInt>(chunk);
    pos += chunk;
    flush = pos == text.size() ? Z_FINISH : Z_NO_FLUSH;
    do {
      z.next_out = reinterpret_cast<Bytef*>(buffer.data());
      z.avail_out = static_cast<uInt>(buffer.size());
      deflate(&z, flush);  // cannot fail with valid state and an output buffer (zlib manual)
      packed.append(buffer.data(), buffer.size() - z.avail_out);
    } while (z.avail_out == 0);
  }
  deflateEnd(&z);
  return packed;
}

}  // namespace sextant::spec
