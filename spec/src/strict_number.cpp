#include "sextant/spec/strict_number.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace sextant::spec {

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

std::optional<int64_t> strict_integer(const std::string& text) {
  if (!strict_integer_problem(text, false).empty()) return std::nullopt;
  int64_t value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value;
}

std::optional<double> strict_decimal(const std::string& text) {
  if (!strict_decimal_problem(text).empty()) return std::nullopt;
  return std::strtod(text.c_str(), nullptr);
}

}  // namespace sextant::spec
