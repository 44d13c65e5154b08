#include "validators.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

namespace sextant::cli {
namespace {

CLI::Validator at_least(double lowest, bool inclusive, const char* what, const char* tag) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || !std::isfinite(v))
          return fmt::format("expected {}, got '{}'", what, text);
        if (inclusive ? v < lowest : v <= lowest)
          return fmt::format("must be {}, got {}", what, text);
        return "";
      },
      tag);
}

}  // namespace

CLI::Validator positive() {
  return at_least(0, false, "a positive number", "POSITIVE");
}

CLI::Validator non_negative() {
  return at_least(0, true, "a number >= 0", "NON-NEGATIVE");
}

CLI::Validator positive_at_most(double highest) {
  return CLI::Validator(
      [highest](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || !std::isfinite(v) || v <= 0 || v > highest)
          return fmt::format("must be a positive number of at most {:g}, got {}", highest, text);
        return "";
      },
      "POSITIVE");
}

}  // namespace sextant::cli
