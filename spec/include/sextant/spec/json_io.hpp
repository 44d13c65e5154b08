// Reading JSON files with errors that name the file, and writing outputs atomically.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "sextant/spec/json_reader.hpp"
#include "sextant/spec/limits.hpp"

namespace sextant::spec {

// Reads and parses a JSON file, gzip-compressed when its name ends in .gz. Throws InputError naming
// the file when it cannot be opened, decompressed or parsed (with the line and column of a syntax
// error).
Json read_json_file(const std::filesystem::path& path);
// Parses JSON text that came from `source` (a file name or a description); throws InputError,
// also for nesting deeper than kMaxJsonDepth (limits.hpp; checked before parsing).
Json parse_json_text(std::string_view text, const std::string& source);
// Reads a whole text file; throws InputError naming the file when it cannot be read.
std::string read_text_file(const std::filesystem::path& path);

// Why write_file_atomically(path, ...) would fail before writing anything (the directory is
// missing, not a directory, or not writable), or "" when it should not. For checks before work.
std::string unwritable_reason(const std::filesystem::path& path);

// Writes `content` to `path` atomically: a temporary file in the same directory, flushed, then
// renamed over `path`, so that a reader never sees a half-written file. A symlink is followed and
// its target replaced (the link stays); a special file (a terminal, a pipe, /dev/stdout) is
// written in place. Throws std::runtime_error (with the path and the system's reason) on failure,
// a full device's included.
void write_file_atomically(const std::filesystem::path& path, std::string_view content);
// Writes `json` pretty-printed (2-space indent, trailing newline) atomically.
void write_json_file(const std::filesystem::path& path, const Json& json);

}  // namespace sextant::spec
