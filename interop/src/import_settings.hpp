// The settings of an imported config, read by name with the type the plan needs; every name not
// read is reported as ignored, a value of the wrong type is an error naming it.
#pragma once

#include <fmt/format.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "sextant/interop/import.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/limits.hpp"

namespace sextant::interop::detail {

class SettingsReader {
 public:
  SettingsReader(const std::vector<Setting>& settings, std::string source)
      : source_(std::move(source)), diag_(source_) {
    for (const Setting& s : settings) values_[s.name] = s.value;
  }
  bool has(const std::string& name) {
    used_.insert(name);
    return values_.contains(name);
  }
  // A flag present (Megatron's store_true) or a boolean field that is true.
  bool on(const std::string& name) {
    if (!has(name)) return false;
    const spec::Json& v = values_[name];
    if (v.is_boolean()) return v.get<bool>();
    diag_.add(name, v.dump(), "a flag without a value, or true / false");
    return false;
  }
  // At most kMaxRanks: every count a config gives (degrees, batches, layers) is below it, and
  // products of three stay far from overflow.
  std::optional<int64_t> integer(const std::string& name, int64_t at_least = 1,
                                 int64_t at_most = spec::kMaxRanks) {
    if (!has(name)) return std::nullopt;
    const spec::Json& v = values_[name];
    if (v.is_number_integer() && v.get<int64_t>() >= at_least && v.get<int64_t>() <= at_most)
      return v.get<int64_t>();
    diag_.add(name, v.dump(), fmt::format("an integer in [{}, {}]", at_least, at_most));
    return std::nullopt;
  }
  std::optional<double> number(const std::string& name) {
    if (!has(name)) return std::nullopt;
    const spec::Json& v = values_[name];
    if (v.is_number()) return v.get<double>();
    diag_.add(name, v.dump(), "a number");
    return std::nullopt;
  }
  // A string, or the first of a list of strings (Megatron's nargs='+' flags).
  std::optional<std::string> text(const std::string& name) {
    if (!has(name)) return std::nullopt;
    const spec::Json& v = values_[name];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_array() && !v.empty() && v[0].is_string()) return v[0].get<std::string>();
    diag_.add(name, v.dump(), "a name");
    return std::nullopt;
  }
  void problem(const std::string& name, const std::string& value, std::string expected) {
    diag_.add(name, value, std::move(expected));
  }
  std::vector<std::string> ignored() const {
    std::vector<std::string> out;
    for (const auto& [name, v] : values_)
      if (!used_.contains(name)) out.push_back(name);
    return out;
  }
  void throw_if_any() const { diag_.throw_if_any(); }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  Diagnostics diag_;
  std::map<std::string, spec::Json> values_;
  std::set<std::string> used_;
};

// The most gradient elements a bucket setting may name (2^40: beyond any model's gradients).
inline constexpr int64_t kMaxBucket = int64_t{1} << 40;

// a x b x c, or 0 past kMaxRanks (no job launches more ranks; the product cannot overflow).
inline int64_t rank_product(int64_t a, int64_t b, int64_t c) {
  const double p = static_cast<double>(a) * static_cast<double>(b) * static_cast<double>(c);
  return p > static_cast<double>(spec::kMaxRanks) ? 0 : a * b * c;
}

// dp from the devices the launcher gives and the degrees the config sets; 0 when unknown.
int64_t data_parallel_from(std::optional<int64_t> gpus, int64_t others, SettingsReader& r);

spec::Plan megatron_plan(SettingsReader& r, const spec::ModelSpec& model,
                         std::optional<int64_t> gpus, bool nemo, Target target);
spec::Plan torchtitan_plan(SettingsReader& r, const spec::ModelSpec& model,
                           std::optional<int64_t> gpus);
// (DeepSpeed's config names no layer counts: the model only shapes the plan's checks.)
spec::Plan deepspeed_plan(SettingsReader& r, std::optional<int64_t> gpus);

}  // namespace sextant::interop::detail
