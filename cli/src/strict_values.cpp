#include "strict_values.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>

namespace sextant::cli {

std::string strict_integer_problem(const std::string& text, bool is_unsigned) {
  size_t i = text.empty() || text[0] != '-' ? 0 : 1;
  if (is_unsigned && i == 1) return fmt::format("must be >= 0, got '{}'", text);
  const bool digits =
      i < text.size() && std::all_of(text.begin() + static_cast<ptrdiff_t>(i), text.end(),
                                     [](unsigned char c) { return std::isdigit(c) != 0; });
  if (!digits) return fmt::format("expected a decimal integer, got '{}'", text);
  if (text.size() - i > 1 && text[i] == '0')
    return fmt::format("expected a decimal integer without leading zeros, got '{}'", text);
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size())
    return fmt::format("'{}' is out of range", text);
  return "";
}

std::string strict_decimal_problem(const std::string& text) {
  // [-+]digits[.digits][e[-+]digits] or [-+].digits...: what strtod reads, less hex, nan and inf.
  size_t i = 0;
  if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
  size_t mantissa = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i, ++mantissa;
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i, ++mantissa;
  }
  bool ok = mantissa > 0;
  if (ok && i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
    size_t exponent = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i, ++exponent;
    ok = exponent > 0;
  }
  if (!ok || i != text.size()) return fmt::format("expected a decimal number, got '{}'", text);
  if (!std::isfinite(std::strtod(text.c_str(), nullptr)))
    return fmt::format("'{}' is out of range", text);
  return "";
}

namespace {

// CLI11's type name of an option, before the validators' tags ("INT:POSITIVE" -> "INT").
std::string base_type(const CLI::Option& option) {
  const std::string name = option.get_type_name();
  return name.substr(0, name.find_first_of(": "));
}

void strict_options(CLI::App& app) {
  for (CLI::Option* option : app.get_options({})) {
    if (option->get_type_size() == 0) continue;  // a flag takes no value
    const std::string type = base_type(*option);
    if (type == "INT" || type == "UINT") {
      const bool is_unsigned = type == "UINT";
      option->check(CLI::Validator(
          [is_unsigned](std::string& text) { return strict_integer_problem(text, is_unsigned); },
          ""));
    } else if (type == "FLOAT") {
      option->check(CLI::Validator(strict_decimal_problem, ""));
    } else {
      option->check(CLI::Validator(
          [](std::string& text) -> std::string {
            return text.empty() ? "expected a value, got an empty string" : "";
          },
          ""));
    }
  }
  for (CLI::App* sub : app.get_subcommands({})) strict_options(*sub);
}

}  // namespace

void make_values_strict(CLI::App& app) {
  strict_options(app);
}

}  // namespace sextant::cli
