// File helpers: located parse errors and atomic writes.
#include "sextant/spec/json_io.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "expect_input_error.hpp"
#include "sextant/spec/gzip.hpp"
#include "sextant/spec/limits.hpp"

namespace sextant::spec {
namespace {

namespace fs = std::filesystem;

TEST(JsonIo, ParseErrorNamesSourceLineAndColumn) {
  try {
    parse_json_text("{\n  \"a\": 1,\n  \"b\": ]\n}", "bad.json");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  }
}

TEST(JsonIo, AKeyGivenTwiceInOneObjectIsRefusedWithItsPointer) {
  // The same key in two objects, or in objects of an array, is fine; twice in one is not.
  EXPECT_NO_THROW(
      parse_json_text(R"({"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 1}, {"x": 2}]})", "ok.json"));
  try {
    parse_json_text(R"({"a": 1, "c": [{"x": 1}, [0, {"y": 1, "x": 2, "y": 3}]]})", "twice.json");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "twice.json: /c/1/1/y: given twice in one object: say each field once");
  }
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// RFC 1952: a gzip file is one or more members, read as their concatenation (it was read as
// "truncated" JSON: the first member alone).
TEST(Gzip, AFileOfSeveralMembersIsTheirConcatenation) {
  const fs::path file = fs::temp_directory_path() / "sextant_two_members.json.gz";
  write_bytes(file, gzip_compress(R"({"a": [1, )") + gzip_compress("2]}"));
  EXPECT_EQ(read_json_file(file).at("a"), Json::array({1, 2}));
  write_bytes(file, gzip_compress(R"({"a": 1})") + "trailing bytes");
  EXPECT_INPUT_ERROR(read_json_file(file), "not a readable gzip file");
  fs::remove(file);
}

// A "bomb": 64 MiB of one byte deflates ~1000x. Refused once the text passes 100x the file,
// long before the absolute limit of 4 GiB (a 4.3 MB bomb took 12.6 GB of memory).
TEST(Gzip, ADecompressionPastTheRatioOfAnyTraceIsRefused) {
  const fs::path file = fs::temp_directory_path() / "sextant_bomb.json.gz";
  const std::string packed = gzip_compress(std::string(size_t{64} << 20, ' '));
  ASSERT_LT(std::ssize(packed) * kMaxGzipRatio, int64_t{64} << 20);  // a ratio past 100
  write_bytes(file, packed);
  EXPECT_INPUT_ERROR(read_gzip_file(file), "decompresses to more than 100x its");
  // A real trace's ratio (12-15x; here ~30x of repeated events) reads.
  std::string events = R"({"traceEvents": [)";
  for (int i = 0; i < 20000; ++i)
    events += fmt::format(R"({}{{"name": "op{}", "ph": "X", "ts": {}, "dur": 5}})",
                          i == 0 ? "" : ", ", i % 7, i * 10);
  events += "]}";
  write_bytes(file, gzip_compress(events));
  EXPECT_EQ(read_json_file(file).at("traceEvents").size(), 20000u);
  fs::remove(file);
}

TEST(JsonIo, MissingFileIsAnInputError) {
  EXPECT_THROW(read_json_file("/nonexistent/sextant.json"), InputError);
}

TEST(JsonIo, AtomicWriteReplacesContentAndLeavesNoTemporary) {
  fs::path dir = fs::temp_directory_path() / "sextant_json_io_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::path file = dir / "out.json";
  write_json_file(file, Json{{"a", 1}});
  write_json_file(file, Json{{"a", 2}});
  EXPECT_EQ(read_json_file(file).at("a"), 2);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1) << "a temporary file was left behind";
  fs::remove_all(dir);
}

TEST(JsonIo, AWriteThroughASymlinkReplacesItsTargetAndKeepsTheLink) {
  fs::path dir = fs::temp_directory_path() / "sextant_json_io_link_test";
  fs::remove_all(dir);
  fs::create_directories(dir / "real");
  fs::create_symlink("real/out.json", dir / "link.json");  // dangling until the first write
  write_json_file(dir / "link.json", Json{{"a", 1}});
  write_json_file(dir / "link.json", Json{{"a", 2}});
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(dir / "link.json")));
  EXPECT_EQ(read_json_file(dir / "real" / "out.json").at("a"), 2);
  EXPECT_EQ(unwritable_reason(dir / "link.json"), "");
  EXPECT_NE(unwritable_reason(dir / "real"), "");  // a directory is no file to write
  fs::remove_all(dir);
}

TEST(JsonIo, ASpecialFileIsWrittenInPlaceAndAFullOneFails) {
  // /dev/null stays a device (a rename would have replaced it, had we been allowed to); /dev/full
  // refuses every byte, and the write says so.
  write_file_atomically("/dev/null", "{}\n");
  EXPECT_FALSE(fs::is_regular_file("/dev/null"));
  if (fs::exists("/dev/full")) {
    try {
      write_file_atomically("/dev/full", "{}\n");
      FAIL() << "a write to /dev/full succeeded";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("/dev/full: write failed"), std::string::npos)
          << e.what();
    }
  }
}

TEST(JsonIo, AtomicWriteIntoMissingDirectoryFailsClearly) {
  try {
    write_file_atomically("/nonexistent-dir/x.json", "{}");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace sextant::spec
