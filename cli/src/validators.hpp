// Validators of command-line numbers with a message people can read (CLI11's own print their
// range with a 310-digit upper bound).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace sextant::cli {

// A number > 0 (integer or not, as the option's type says).
CLI::Validator positive();
// A number >= 0.
CLI::Validator non_negative();
// A number > 0 and at most `highest` (a bound past which the answer means nothing).
CLI::Validator positive_at_most(double highest);

}  // namespace sextant::cli
