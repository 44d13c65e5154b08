// Human output wrapped to 100 columns (cli/src/fitted_output.hpp).
#include "fitted_output.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

namespace sextant::cli {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST(FittedOutput, ALongLineContinuesUnderItsValueColumn) {
  const std::string line =
      "   memory per GPU   1.45 GiB of 80.00 GiB (fits, 78.55 GiB free): weights 48.75 MiB, "
      "gradients 97.49 MiB, optimizer 390.0 MiB, activations 960.1 MiB";
  const std::vector<std::string> out = lines_of(wrap_line(line, 60));
  const std::string under(20, ' ');  // "1.45" starts at column 20
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0], "   memory per GPU   1.45 GiB of 80.00 GiB (fits, 78.55 GiB");
  EXPECT_EQ(out[1], under + "free): weights 48.75 MiB, gradients");
  EXPECT_EQ(out[2], under + "97.49 MiB, optimizer 390.0 MiB,");
  EXPECT_EQ(out[3], under + "activations 960.1 MiB");
}

TEST(FittedOutput, ShortLinesAndUnbreakableWordsStayWhole) {
  EXPECT_EQ(wrap_line("step 3  loss 4.2", 100), "step 3  loss 4.2");
  // Prose without a value column continues 4 past its indent; a long path stays whole.
  const std::string path(70, 'p');
  const std::vector<std::string> out = lines_of(wrap_line("  note: the file " + path + " x", 40));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0], "  note: the file");
  EXPECT_EQ(out[1], "      " + path);
  EXPECT_EQ(out[2], "      x");
  for (const std::string& l : lines_of(wrap_line(std::string(300, 'a') + " b c", 100)))
    EXPECT_FALSE(l.empty());
}

}  // namespace
}  // namespace sextant::cli
