// Lenient field access for PyTorch-profiler (Kineto) traces. Their schema varies across PyTorch
// versions and events, so a field of an unexpected type counts as absent (found by fuzz/:
// nlohmann's value("name", "") throws on a numeric "name", which stopped the whole read with its
// own error).
#pragma once

#include <optional>
#include <string>

#include "sextant/spec/json_reader.hpp"

namespace sextant::traces::kineto {

inline std::string text(const spec::Json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

inline std::optional<double> number(const spec::Json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

inline std::optional<int64_t> integer(const spec::Json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

// The "args" object of an event; an empty object when absent or not an object.
inline const spec::Json& args(const spec::Json& event) {
  static const spec::Json empty = spec::Json::object();
  auto it = event.find("args");
  return it != event.end() && it->is_object() ? *it : empty;
}

}  // namespace sextant::traces::kineto
