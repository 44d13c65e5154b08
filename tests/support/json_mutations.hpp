// Broken variants of a valid JSON document, for tests that every reader rejects bad files with a
// clear error instead of crashing or silently accepting them.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sextant::test {

struct Mutation {
  std::string pointer;      // the field that was changed
  std::string description;  // what was done to it
  nlohmann::json document;  // the whole document with the change
};

// For every leaf of `doc`: a copy with the leaf replaced by a value of the wrong type (a string
// for numbers and booleans, a number for strings), and for numbers a copy with -5 (every number
// in Sextant's formats is non-negative).
inline std::vector<Mutation> leaf_mutations(const nlohmann::json& doc) {
  std::vector<Mutation> out;
  nlohmann::json flat = doc.flatten();
  for (const auto& [pointer, value] : flat.items()) {
    if (pointer == "/schema") continue;
    nlohmann::json::json_pointer ptr(pointer);
    if (value.is_number()) {
      nlohmann::json d = doc;
      d[ptr] = "12";
      out.push_back({pointer, "number replaced by a string", d});
      d[ptr] = -5;
      out.push_back({pointer, "number replaced by -5", d});
    } else if (value.is_boolean()) {
      nlohmann::json d = doc;
      d[ptr] = "yes";
      out.push_back({pointer, "boolean replaced by a string", d});
    } else if (value.is_string()) {
      nlohmann::json d = doc;
      d[ptr] = 7;
      out.push_back({pointer, "string replaced by a number", d});
    }
  }
  return out;
}

// Prefixes of `text` cut at `cuts` evenly spaced places (never the whole text).
inline std::vector<std::string> truncations(const std::string& text, int cuts = 12) {
  std::vector<std::string> out;
  for (int i = 0; i < cuts; ++i) {
    size_t at = text.size() * static_cast<size_t>(i) / static_cast<size_t>(cuts);
    out.push_back(text.substr(0, at));
  }
  return out;
}

}  // namespace sextant::test
