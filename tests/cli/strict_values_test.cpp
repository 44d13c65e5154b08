// The command line's strict number and text checks (cli/src/strict_values.hpp), on a CLI11 app as
// main() builds one.
#include "strict_values.hpp"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "sextant/spec/strict_number.hpp"

namespace sextant::cli {
namespace {

using spec::strict_decimal_problem;
using spec::strict_integer_problem;

TEST(StrictValues, IntegersArePlainDecimals) {
  EXPECT_EQ(strict_integer_problem("64", false), "");
  EXPECT_EQ(strict_integer_problem("0", false), "");
  EXPECT_EQ(strict_integer_problem("-3", false), "");
  EXPECT_NE(strict_integer_problem("010", false), "");  // strtoll's base 0 reads 8
  EXPECT_NE(strict_integer_problem("0x10", false), "");
  EXPECT_NE(strict_integer_problem("1e20", false), "");
  EXPECT_NE(strict_integer_problem("4.0", false), "");
  EXPECT_NE(strict_integer_problem("", false), "");
  EXPECT_NE(strict_integer_problem("-", false), "");
  EXPECT_NE(strict_integer_problem("+4", false), "");
  EXPECT_NE(strict_integer_problem("99999999999999999999", false), "");  // past int64
  EXPECT_NE(strict_integer_problem("-1", true), "");                     // would wrap
}

TEST(StrictValues, DecimalsAreFiniteAndDecimal) {
  for (const char* ok : {"0.5", "1e-3", "-2", "+.5", "3.", "1E9", "1e300"})
    EXPECT_EQ(strict_decimal_problem(ok), "") << ok;
  for (const char* bad :
       {"nan", "NaN", "inf", "-inf", "0x1p3", "1e400", "e5", ".", "1e", "1.2.3", "5%", ""})
    EXPECT_NE(strict_decimal_problem(bad), "") << bad;
}

TEST(StrictValues, EveryOptionOfEverySubcommandIsChecked) {
  CLI::App app;
  int64_t gpus = 0;
  uint64_t seed = 0;
  double clip = 0;
  std::string stack;
  bool json = false;
  CLI::App* sub = app.add_subcommand("simulate");
  sub->add_option("--gpus", gpus);
  sub->add_option("--seed", seed);
  sub->add_option("--clip", clip);
  sub->add_option("--stack", stack);
  sub->add_flag("--json", json);
  make_values_strict(app);
  auto parse = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "simulate");
    std::reverse(args.begin(), args.end());  // CLI11 takes them last first
    app.parse(args);
  };
  parse({"--gpus", "8", "--seed", "7", "--clip", "1.5", "--stack", "torchtitan", "--json"});
  EXPECT_EQ(gpus, 8);
  EXPECT_EQ(seed, 7u);
  EXPECT_DOUBLE_EQ(clip, 1.5);
  EXPECT_TRUE(json);
  EXPECT_THROW(parse({"--gpus", "010"}), CLI::ValidationError);
  EXPECT_THROW(parse({"--seed", "-1"}), CLI::ValidationError);
  EXPECT_THROW(parse({"--clip", "nan"}), CLI::ValidationError);
  EXPECT_THROW(parse({"--stack", ""}), CLI::ValidationError);
}

}  // namespace
}  // namespace sextant::cli
