// File helpers: JSON parsing with located errors, atomic writes (temp file + fsync + rename).
#include "sextant/spec/json_io.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "sextant/spec/gzip.hpp"
#include "sextant/spec/limits.hpp"

namespace sextant::spec {

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(path.string(), "", "", fmt::format("cannot open: {}", std::strerror(errno)));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw InputError(path.string(), "", "", "read error");
  return buffer.str();
}

namespace {

struct LineColumn {
  size_t line = 1, column = 1;
};

// The line and column of byte `offset` (0-based) of `text`.
LineColumn line_column(std::string_view text, size_t offset) {
  LineColumn lc;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++lc.line;
      lc.column = 1;
    } else {
      ++lc.column;
    }
  }
  return lc;
}

// Refuses nesting deeper than kMaxJsonDepth before the parser builds (and later recursively
// destroys) a tree that deep. Brackets inside strings do not count.
void check_depth(std::string_view text, const std::string& source) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        const LineColumn lc = line_column(text, i);
        throw InputError(source, "", "",
                         fmt::format("JSON nested deeper than {} levels at line {}, column {}",
                                     kMaxJsonDepth, lc.line, lc.column));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

// nlohmann keeps the last of two equal keys in an object without a word; a file that names a
// field twice says two things, so it is refused naming the key and where it is. The frames of the
// objects and arrays being read: in an object the keys seen so far, in an array the next index;
// `at`, the member or element being read, makes the JSON pointer of the message.
class DuplicateKeyCheck {
 public:
  explicit DuplicateKeyCheck(const std::string& source) : source_(&source) {}
  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        element_begins();
        frames_.push_back({});
        break;
      case Json::parse_event_t::array_start:
        element_begins();
        frames_.push_back({true, 0, "", {}});
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (!frames_.empty()) frames_.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!frames_.empty() && parsed.is_string()) key(parsed.get_ref<const std::string&>());
        break;
      case Json::parse_event_t::value:
        element_begins();
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool array = false;
    int64_t next = 0;
    std::string at;
    std::vector<std::string> keys;
  };
  void element_begins() {
    if (!frames_.empty() && frames_.back().array)
      frames_.back().at = std::to_string(frames_.back().next++);
  }
  void key(const std::string& k) {
    Frame& f = frames_.back();
    if (std::find(f.keys.begin(), f.keys.end(), k) != f.keys.end()) {
      std::string pointer;
      for (size_t i = 0; i + 1 < frames_.size(); ++i) pointer += "/" + frames_[i].at;
      throw InputError(*source_, pointer + "/" + k, "",
                       "given twice in one object: say each field once");
    }
    f.keys.push_back(k);
    f.at = k;
  }
  const std::string* source_;
  std::vector<Frame> frames_;
};

}  // namespace

Json parse_json_text(std::string_view text, const std::string& source) {
  check_depth(text, source);
  if (std::ssize(text) > kJsonMemoryCheckBytes) {
    // Parsing takes ~8x the text: refused with the figures rather than ended by bad_alloc (or
    // the kernel's OOM killer) minutes later.
    const double needed = kJsonMemoryPerByte * static_cast<double>(text.size());
    const int64_t available = available_memory_bytes();
    if (available > 0 && needed > static_cast<double>(available))
      throw InputError(source, "",
                       fmt::format("{:.1f} GB of JSON", 1e-9 * static_cast<double>(text.size())),
                       fmt::format("parsing it takes about {:.0f} GB of memory and {:.1f} GB are "
                                   "available (a trace: cut it with --trace-ranks / "
                                   "--trace-steps)",
                                   1e-9 * needed, 1e-9 * static_cast<double>(available)));
  }
  try {
    return Json::parse(text, DuplicateKeyCheck(source));
  } catch (const Json::parse_error& e) {
    // nlohmann reports the byte offset (1-based); turn it into line:column for people.
    const LineColumn lc = line_column(text, e.byte > 0 ? e.byte - 1 : 0);
    const size_t line = lc.line, column = lc.column;
    std::string what = e.what();
    // Keep only the description after "parse error at line ..., column ...: ".
    if (auto pos = what.find("syntax error"); pos != std::string::npos) what = what.substr(pos);
    throw InputError(source, "", "",
                     fmt::format("invalid JSON at line {}, column {}: {}", line, column, what));
  } catch (const Json::out_of_range& e) {
    // A number past a double's range ("1e400"); nlohmann gives no position for it.
    std::string what = e.what();
    if (auto pos = what.find("number overflow"); pos != std::string::npos) what = what.substr(pos);
    throw InputError(source, "", "", fmt::format("invalid JSON: {}", what));
  }
}

Json read_json_file(const std::filesystem::path& path) {
  if (is_gzip_name(path)) return parse_json_text(read_gzip_file(path), path.string());
  return parse_json_text(read_text_file(path), path.string());
}

namespace {

// What a write to `path` lands on: a special file (a terminal, a pipe, /dev/null: written in
// place, as it cannot be replaced), or the regular file the path names through any symlinks (the
// file a temporary is renamed over, so that the symlink stays a symlink).
struct WriteTarget {
  std::filesystem::path file;
  bool special = false;
};
WriteTarget write_target(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status followed = fs::status(path, ec);
  if (fs::exists(followed) && !fs::is_regular_file(followed) && !fs::is_directory(followed))
    return {path, true};
  fs::path file = path;
  for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(file, ec)); ++hops) {
    const fs::path link = fs::read_symlink(file, ec);
    if (ec) break;
    file = link.is_absolute() ? link : file.parent_path() / link;
  }
  return {file, false};
}

// Writes `content` to an existing special file in place, checking every write and the close.
void write_in_place(const std::filesystem::path& path, std::string_view content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    throw std::runtime_error(
        fmt::format("{}: cannot open for writing: {}", path.string(), std::strerror(errno)));
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw std::runtime_error(
          fmt::format("{}: write failed: {}", path.string(), std::strerror(err)));
    }
    written += static_cast<size_t>(n);
  }
  if (::close(fd) != 0)
    throw std::runtime_error(
        fmt::format("{}: close failed: {}", path.string(), std::strerror(errno)));
}

}  // namespace

std::string unwritable_reason(const std::filesystem::path& target) {
  const WriteTarget t = write_target(target);
  if (t.special)
    return ::access(t.file.c_str(), W_OK) == 0
               ? ""
               : fmt::format("{} is not writable: {}", t.file.string(), std::strerror(errno));
  const std::filesystem::path& path = t.file;
  std::error_code is_dir_ec;
  if (std::filesystem::is_directory(path, is_dir_ec))
    return fmt::format("{} is a directory", path.string());
  std::filesystem::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec))
    return fmt::format("directory {} does not exist", dir.string());
  if (!std::filesystem::is_directory(dir, ec))
    return fmt::format("{} is not a directory", dir.string());
  if (::access(dir.c_str(), W_OK) != 0)
    return fmt::format("directory {} is not writable: {}", dir.string(), std::strerror(errno));
  return "";
}

void write_file_atomically(const std::filesystem::path& target, std::string_view content) {
  const WriteTarget t = write_target(target);
  if (t.special) return write_in_place(t.file, content);
  const std::filesystem::path& path = t.file;
  std::filesystem::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  std::string tmpl = (dir / ("." + path.filename().string() + ".tmp.XXXXXX")).string();
  int fd = ::mkstemp(tmpl.data());
  if (fd < 0) {
    throw std::runtime_error(fmt::format("{}: cannot create a temporary file in {}: {}",
                                         path.string(), dir.string(), std::strerror(errno)));
  }
  size_t written = 0;
  while (written < content.size()) {
    ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmpl.c_str());
      throw std::runtime_error(
          fmt::format("{}: write failed: {}", path.string(), std::strerror(err)));
    }
    written += static_cast<size_t>(n);
  }
  ::fchmod(fd, 0644);
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmpl.c_str());
    throw std::runtime_error(
        fmt::format("{}: flush failed: {}", path.string(), std::strerror(err)));
  }
  std::error_code ec;
  std::filesystem::rename(tmpl, path, ec);
  if (ec) {
    ::unlink(tmpl.c_str());
    throw std::runtime_error(fmt::format("{}: rename failed: {}", path.string(), ec.message()));
  }
}

void write_json_file(const std::filesystem::path& path, const Json& json) {
  write_file_atomically(path, json.dump(2) + "\n");
}

}  // namespace sextant::spec
