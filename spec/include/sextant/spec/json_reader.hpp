// Reading JSON input in the "decode" step: typed getters that record every problem (missing key,
// wrong type, out-of-range value, unknown key) with its JSON pointer instead of throwing at the
// first one. Callers finish with Diagnostics::throw_if_any().
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sextant/spec/error.hpp"

namespace sextant::spec {

using Json = nlohmann::json;

enum class Presence { kRequired, kOptional };

// Allowed interval of a number; describes itself for error messages ("must be > 0").
struct Range {
  std::optional<double> min;
  std::optional<double> max;
  bool min_inclusive = true;
  bool max_inclusive = true;

  static Range any() { return {}; }
  static Range positive() { return {0.0, std::nullopt, false, true}; }
  static Range non_negative() { return {0.0, std::nullopt, true, true}; }
  static Range at_least(double lo) { return {lo, std::nullopt, true, true}; }
  static Range between(double lo, double hi) { return {lo, hi, true, true}; }
  static Range fraction() { return {0.0, 1.0, false, true}; }  // (0, 1]

  bool contains(double v) const;
  std::string describe() const;  // "must be > 0"
};

// Escapes a key for use in a JSON pointer (RFC 6901: "~" -> "~0", "/" -> "~1").
std::string pointer_join(std::string_view parent, std::string_view key);
std::string pointer_join(std::string_view parent, size_t index);
// A short rendering of a JSON value for error messages.
std::string short_dump(const Json& value);

// A name <-> enum table used to decode and encode enumerations.
template <typename E>
using EnumNames = std::span<const std::pair<std::string_view, E>>;

template <typename E>
std::string_view enum_name(EnumNames<E> names, E value) {
  for (const auto& [name, v] : names)
    if (v == value) return name;
  return "?";
}
std::string join_names(std::span<const std::string_view> names);
// " (did you mean X?)" for the name of `names` closest to `text` by edit distance, when it is
// close (at most 2 edits, or a third of the name): a typo, not another word; "" otherwise.
std::string did_you_mean(std::string_view text, std::span<const std::string_view> names);
template <typename E>
std::string enum_choices(EnumNames<E> names) {
  std::vector<std::string_view> keys;
  for (const auto& [name, v] : names) keys.push_back(name);
  return join_names(keys);
}
// Decodes `text` as one of `names`; std::nullopt when unknown.
template <typename E>
std::optional<E> enum_from_name(EnumNames<E> names, std::string_view text) {
  for (const auto& [name, v] : names)
    if (name == text) return v;
  return std::nullopt;
}

// Reads one JSON object. Every getter marks its key as known; finish() reports the keys nobody
// asked for. A value that is wrong is recorded in the Diagnostics and std::nullopt is returned.
class ObjectReader {
 public:
  ObjectReader(const Json& json, std::string pointer, Diagnostics& diagnostics);
  ObjectReader(Json&&, std::string, Diagnostics&) = delete;  // would keep a dangling pointer
  ObjectReader(const ObjectReader&) = delete;
  ObjectReader& operator=(const ObjectReader&) = delete;
  ObjectReader(ObjectReader&&) = default;
  // Reports unknown keys if finish() was not called (it must be, explicitly, to be checked).
  ~ObjectReader() = default;

  bool is_object() const { return json_ != nullptr; }
  const std::string& pointer() const { return pointer_; }
  Diagnostics& diagnostics() const { return *diagnostics_; }
  bool has(std::string_view key) const;

  std::optional<int64_t> integer(std::string_view key, Range range = Range::any(),
                                 Presence presence = Presence::kRequired);
  std::optional<double> number(std::string_view key, Range range = Range::any(),
                               Presence presence = Presence::kRequired);
  std::optional<std::string> string(std::string_view key, Presence presence = Presence::kRequired);
  std::optional<bool> boolean(std::string_view key, Presence presence = Presence::kRequired);
  // A required-or-optional sub-object; std::nullopt when absent or not an object.
  std::optional<ObjectReader> object(std::string_view key, Presence presence = Presence::kRequired);
  // A required-or-optional array; nullptr when absent or not an array.
  const Json* array(std::string_view key, Presence presence = Presence::kRequired);
  // Any JSON value (kept verbatim, e.g. provenance records).
  const Json* value(std::string_view key, Presence presence = Presence::kRequired);
  // An array of integers, each checked against `range`.
  std::optional<std::vector<int64_t>> integer_array(std::string_view key, Range range,
                                                    Presence presence = Presence::kRequired);

  template <typename E>
  std::optional<E> enumeration(std::string_view key, EnumNames<E> names,
                               Presence presence = Presence::kRequired) {
    std::optional<std::string> text = string(key, presence);
    if (!text) return std::nullopt;
    if (auto v = enum_from_name(names, *text)) return v;
    std::vector<std::string_view> keys;
    for (const auto& [name, v] : names) keys.push_back(name);
    diagnostics_->add(pointer_join(pointer_, key), short_dump(Json(*text)),
                      "must be one of " + join_names(keys) + did_you_mean(*text, keys));
    return std::nullopt;
  }

  // The `"schema"` field: must equal `expected` (e.g. "sextant.model/1").
  void expect_schema(std::string_view expected);

  // Records a problem about `key` of this object (used by the "validate" step).
  void problem(std::string_view key, const std::string& value, std::string expected) const;

  // Reports every key of the object that no getter asked for.
  void finish();

 private:
  const Json* find(std::string_view key, Presence presence);

  const Json* json_ = nullptr;
  std::string pointer_;
  Diagnostics* diagnostics_;
  std::set<std::string, std::less<>> known_;
};

// Reads an array element at `index` of `array` (which lives at `pointer`) as an object.
ObjectReader element_reader(const Json& array, std::string_view pointer, size_t index,
                            Diagnostics& diagnostics);

}  // namespace sextant::spec
