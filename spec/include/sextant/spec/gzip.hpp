// gzip (RFC 1952) through zlib: traces are large and compress ~10x, and PyTorch writes .json.gz.
// Perfetto and chrome://tracing open gzip-compressed JSON traces as they are.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace sextant::spec {

// True when the file name ends in ".gz".
bool is_gzip_name(const std::filesystem::path& path);
// The decompressed contents of a gzip file; throws InputError naming the file when it cannot be
// read, is not gzip, or decompresses past kMaxDecompressedBytes (limits.hpp).
std::string read_gzip_file(const std::filesystem::path& path);
// `text` compressed as one gzip member (the default level: ~10x on traces at ~50 MB/s).
std::string gzip_compress(std::string_view text);

}  // namespace sextant::spec
