// A rank's file of an NVMe offload: what is written is read back bit for bit, whole or a range at a
// time, a file of another size or a range beyond it is refused naming it, a directory that cannot
// be written is refused naming the option, and the file goes with the job.
#include "sextant/exec/nvme_file.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <fstream>
#include <limits>

#include "sextant/spec/error.hpp"

namespace sextant::exec {
namespace {

std::filesystem::path scratch(const std::string& name) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(NvmeFile, WhatIsWrittenIsReadBackBitForBit) {
  const std::filesystem::path dir = scratch("sextant-nvme-states-test");
  std::filesystem::path file;
  {
    NvmeFile states(dir, 3, "optimizer-states");  // creates the directory
    file = states.path();
    EXPECT_EQ(file.parent_path(), dir);
    EXPECT_NE(file.filename().string().find("rank3"), std::string::npos);
    EXPECT_NE(file.filename().string().find("optimizer-states"), std::string::npos);
    // Three arrays' spans, as the trainer hands them (master weights, m, v), with values whose
    // bits a text round trip would lose: a subnormal, a negative zero, a NaN payload.
    std::vector<float> a = {1.0f / 3, -0.0f, std::numeric_limits<float>::denorm_min()};
    std::vector<float> b = {std::numeric_limits<float>::quiet_NaN(), 7.5f};
    std::vector<float> c = {1e30f};
    states.write({a, b, c});
    // 6 floats of 4 bytes.
    EXPECT_EQ(states.bytes(), 24);
    EXPECT_EQ(std::filesystem::file_size(file), 24u);
    std::vector<float> ra(3, 9.0f), rb(2, 9.0f), rc(1, 9.0f);
    states.read({ra, rb, rc});
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_EQ(std::bit_cast<uint32_t>(ra[i]), std::bit_cast<uint32_t>(a[i])) << i;
    EXPECT_TRUE(std::isnan(rb[0]));
    EXPECT_EQ(rb[1], 7.5f);
    EXPECT_EQ(rc[0], 1e30f);
    // Pieces adding up to another size than the file's: refused, naming the file and both sizes.
    std::vector<float> more(7);
    try {
      states.read({more});
      ADD_FAILURE() << "a read of 28 bytes from a 24-byte file was accepted";
    } catch (const InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
      EXPECT_NE(msg.find("24 bytes"), std::string::npos) << msg;
      EXPECT_NE(msg.find("28 bytes"), std::string::npos) << msg;
    }
  }
  EXPECT_FALSE(std::filesystem::exists(file));  // removed with the job
  std::filesystem::remove_all(dir);
}

// The parameters' file is read one layer's shard at a time: values [offset, offset + n) of what
// was written, the pieces laid end to end (here [10, 11, 12] then [20, 21]: value 2 is 12, values
// 3-4 are 20 and 21). A range past the 5 values (20 bytes) is refused naming the file and both
// extents.
TEST(NvmeFile, AShardIsReadFromItsPlaceInTheFile) {
  const std::filesystem::path dir = scratch("sextant-nvme-params-test");
  NvmeFile params(dir, 0, "parameters");
  EXPECT_NE(params.path().filename().string().find("parameters"), std::string::npos);
  std::vector<float> first = {10, 11, 12}, second = {20, 21};
  params.write({first, second});
  std::vector<float> one(1), two(2);
  params.read_at(2, one);
  EXPECT_EQ(one[0], 12.0f);
  params.read_at(3, two);
  EXPECT_EQ(two, (std::vector<float>{20, 21}));
  params.read_at(1, two);  // across the pieces' boundary: the file is one array
  EXPECT_EQ(two, (std::vector<float>{11, 12}));
  for (int64_t offset : {4, -1}) {
    try {
      params.read_at(offset, two);
      ADD_FAILURE() << "a read of 2 values at " << offset << " from 5 was accepted";
    } catch (const InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(params.path().string()), std::string::npos) << msg;
      EXPECT_NE(msg.find("20 bytes"), std::string::npos) << msg;
      EXPECT_NE(msg.find("of the parameters"), std::string::npos) << msg;
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(NvmeFile, ADirectoryThatCannotBeWrittenIsRefusedNamingTheOption) {
  // A regular file where the directory should be: nothing can be created under it.
  const std::filesystem::path blocker = scratch("sextant-nvme-blocker");
  { std::ofstream(blocker) << "x"; }
  try {
    NvmeFile states(blocker / "states", 0, "optimizer-states");
    ADD_FAILURE() << "a directory under a regular file was accepted";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--nvme-dir"), std::string::npos) << msg;
    EXPECT_NE(msg.find("sextant-nvme-blocker"), std::string::npos) << msg;
  }
  std::filesystem::remove(blocker);
}

}  // namespace
}  // namespace sextant::exec
