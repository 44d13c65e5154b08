// File helpers: located parse errors and atomic writes.
#include "sextant/spec/json_io.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

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
