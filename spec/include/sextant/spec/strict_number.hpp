// Numbers in text, read strictly: the one parser of command-line values and of text measurement
// files (nccl-tests output). strtoll's base 0 reads "010" as 8 and "0x10" as 16, strtod accepts
// "nan", "inf" and hex, and std::stoll stops at the first letter ("12abc" is 12): none of these is
// what a user or a benchmark meant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace sextant::spec {

// "" when `text` is a plain decimal integer that fits int64 (no leading zeros, no '+', no
// exponent; no sign at all when `is_unsigned`), else why not, quoting the text.
std::string strict_integer_problem(const std::string& text, bool is_unsigned);
// "" when `text` is a finite decimal number ([-+]digits[.digits][e[-+]digits]), else why not.
std::string strict_decimal_problem(const std::string& text);

// The value, or nullopt where the *_problem function above objects.
std::optional<int64_t> strict_integer(const std::string& text);
std::optional<double> strict_decimal(const std::string& text);

}  // namespace sextant::spec
