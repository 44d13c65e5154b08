// Every command-line value read strictly. CLI11 reads integers with strtoll's base 0 ("010" is 8,
// "0x10" is 16), floating-point values accept "nan" and "inf", and an empty string is a value.
// make_values_strict gives every option of an app and its subcommands a check, run before the
// conversion: a number must be a plain finite decimal that fits its type (no octal, hex,
// exponent for integers, sign for unsigned ones; spec/strict_number.hpp), and a text value must
// not be empty.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace sextant::cli {

void make_values_strict(CLI::App& app);

}  // namespace sextant::cli
