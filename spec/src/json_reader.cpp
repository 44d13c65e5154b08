// Implementation of the recording JSON getters.
#include "sextant/spec/json_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace sextant::spec {

bool Range::contains(double v) const {
  if (std::isnan(v)) return false;
  if (min && (min_inclusive ? v < *min : v <= *min)) return false;
  if (max && (max_inclusive ? v > *max : v >= *max)) return false;
  return true;
}

std::string Range::describe() const {
  if (min && max) {
    return fmt::format("must be in {}{}, {}{}", min_inclusive ? "[" : "(", *min, *max,
                       max_inclusive ? "]" : ")");
  }
  if (min) return fmt::format("must be {} {}", min_inclusive ? ">=" : ">", *min);
  if (max) return fmt::format("must be {} {}", max_inclusive ? "<=" : "<", *max);
  return "must be a finite number";
}

std::string pointer_join(std::string_view parent, std::string_view key) {
  std::string out(parent);
  out += '/';
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string pointer_join(std::string_view parent, size_t index) {
  return fmt::format("{}/{}", parent, index);
}

std::string short_dump(const Json& value) {
  std::string text = value.dump();
  constexpr size_t kMax = 60;
  if (text.size() > kMax) text = text.substr(0, kMax - 3) + "...";
  return text;
}

std::string join_names(std::span<const std::string_view> names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

namespace {

// Levenshtein distance (insertions, deletions, substitutions), one row at a time.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string did_you_mean(std::string_view text, std::span<const std::string_view> names) {
  std::string_view best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (std::string_view n : names) {
    const size_t d = edit_distance(text, n);
    if (d < best_distance) {
      best_distance = d;
      best = n;
    }
  }
  if (best.empty() || best_distance == 0 || best_distance > std::max<size_t>(2, best.size() / 3))
    return "";
  return fmt::format(" (did you mean {}?)", best);
}

namespace {

std::string type_name(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// Integral JSON numbers, also when written as 8.5e10; std::nullopt otherwise.
std::optional<int64_t> as_integer(const Json& v) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return std::nullopt;
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.2e18) {
      return static_cast<int64_t>(d);
    }
  }
  return std::nullopt;
}

}  // namespace

ObjectReader::ObjectReader(const Json& json, std::string pointer, Diagnostics& diagnostics)
    : pointer_(std::move(pointer)), diagnostics_(&diagnostics) {
  if (json.is_object()) {
    json_ = &json;
  } else {
    diagnostics_->add(pointer_.empty() ? "/" : pointer_, short_dump(json),
                      "expected a JSON object, found " + type_name(json));
  }
}

bool ObjectReader::has(std::string_view key) const {
  return json_ != nullptr && json_->find(key) != json_->end();
}

const Json* ObjectReader::find(std::string_view key, Presence presence) {
  known_.emplace(key);
  if (json_ == nullptr) return nullptr;
  auto it = json_->find(key);
  if (it == json_->end()) {
    if (presence == Presence::kRequired)
      diagnostics_->add(pointer_join(pointer_, key), "", "missing required field");
    return nullptr;
  }
  return &*it;
}

void ObjectReader::problem(std::string_view key, const std::string& value,
                           std::string expected) const {
  diagnostics_->add(key.empty() ? pointer_ : pointer_join(pointer_, key), value,
                    std::move(expected));
}

std::optional<int64_t> ObjectReader::integer(std::string_view key, Range range, Presence presence) {
  const Json* v = find(key, presence);
  if (v == nullptr) return std::nullopt;
  std::optional<int64_t> i = as_integer(*v);
  if (!i) {
    problem(key, short_dump(*v), "expected an integer, found " + type_name(*v));
    return std::nullopt;
  }
  if (!range.contains(static_cast<double>(*i))) {
    problem(key, short_dump(*v), range.describe());
    return std::nullopt;
  }
  return i;
}

std::optional<double> ObjectReader::number(std::string_view key, Range range, Presence presence) {
  const Json* v = find(key, presence);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) {
    problem(key, short_dump(*v), "expected a number, found " + type_name(*v));
    return std::nullopt;
  }
  double d = v->get<double>();
  if (!std::isfinite(d) || !range.contains(d)) {
    problem(key, short_dump(*v), range.describe());
    return std::nullopt;
  }
  return d;
}

std::optional<std::string> ObjectReader::string(std::string_view key, Presence presence) {
  const Json* v = find(key, presence);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) {
    problem(key, short_dump(*v), "expected a string, found " + type_name(*v));
    return std::nullopt;
  }
  return v->get<std::string>();
}

std::optional<bool> ObjectReader::boolean(std::string_view key, Presence presence) {
  const Json* v = find(key, presence);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) {
    problem(key, short_dump(*v), "expected true or false, found " + type_name(*v));
    return std::nullopt;
  }
  return v->get<bool>();
}

std::optional<ObjectReader> ObjectReader::object(std::string_view key, Presence presence) {
  const Json* v = find(key, presence);
  if (v == nullptr) return std::nullopt;
  if (!v->is_object()) {
    problem(key, short_dump(*v), "expected an object, found " + type_name(*v));
    return std::nullopt;
  }
  return std::optional<ObjectReader>(std::in_place, *v, pointer_join(pointer_, key), *diagnostics_);
}

const Json* ObjectReader::array(std::string_view key, Presence presence) {
  const Json* v = find(key, presence);
  if (v == nullptr) return nullptr;
  if (!v->is_array()) {
    problem(key, short_dump(*v), "expected an array, found " + type_name(*v));
    return nullptr;
  }
  return v;
}

const Json* ObjectReader::value(std::string_view key, Presence presence) {
  return find(key, presence);
}

std::optional<std::vector<int64_t>> ObjectReader::integer_array(std::string_view key, Range range,
                                                                Presence presence) {
  const Json* a = array(key, presence);
  if (a == nullptr) return std::nullopt;
  std::vector<int64_t> out;
  bool good = true;
  std::string base = pointer_join(pointer_, key);
  for (size_t i = 0; i < a->size(); ++i) {
    const Json& e = (*a)[i];
    std::optional<int64_t> v = as_integer(e);
    if (!v) {
      diagnostics_->add(pointer_join(base, i), short_dump(e),
                        "expected an integer, found " + type_name(e));
      good = false;
    } else if (!range.contains(static_cast<double>(*v))) {
      diagnostics_->add(pointer_join(base, i), short_dump(e), range.describe());
      good = false;
    } else {
      out.push_back(*v);
    }
  }
  if (!good) return std::nullopt;
  return out;
}

void ObjectReader::expect_schema(std::string_view expected) {
  std::optional<std::string> s = string("schema");
  if (s && *s != expected) {
    problem("schema", short_dump(Json(*s)), fmt::format("expected \"{}\"", expected));
  }
}

void ObjectReader::finish() {
  if (json_ == nullptr) return;
  for (const auto& [key, v] : json_->items()) {
    if (known_.find(key) == known_.end()) {
      diagnostics_->add(pointer_join(pointer_, key), "",
                        fmt::format("unknown field (known fields: {})", fmt::join(known_, ", ")));
    }
  }
}

ObjectReader element_reader(const Json& array, std::string_view pointer, size_t index,
                            Diagnostics& diagnostics) {
  return ObjectReader(array[index], pointer_join(pointer, index), diagnostics);
}

}  // namespace sextant::spec
