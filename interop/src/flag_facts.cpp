// stacks/flags/*.json, and exported settings checked against them.
#include "sextant/interop/flag_facts.hpp"

#include <fmt/format.h>

#include <map>
#include <span>

#include "sextant/spec/embedded_file.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::interop {

std::span<const spec::EmbeddedFile> embedded_flag_facts();  // generated from stacks/flags/*.json

namespace {

// The values a fact lists: its argparse/Literal "choices", or the "accepted_values" its source
// accepts further down (Transformer Engine's cp_comm_type names, a registry's keys); a pattern
// among them ("<positive int as string>") leaves the value free.
bool in_choices(const spec::Json& fact, const spec::Json& value) {
  for (const char* key : {"choices", "accepted_values"}) {
    if (!fact.contains(key)) continue;
    for (const spec::Json& c : fact[key])
      if (c == value || (c.is_string() && c.get<std::string>().starts_with("<"))) return true;
    return false;
  }
  return true;
}

// Whether `value` is one the recorded type and choices allow.
bool allowed(const spec::Json& fact, const spec::Json& value) {
  const std::string type = fact.value("type", "");
  if (type == "flag") return value.is_boolean() && value.get<bool>();
  if (type == "bool") return value.is_boolean();
  if (type == "int") return value.is_number_integer() && in_choices(fact, value);
  if (type == "float") return value.is_number() && in_choices(fact, value);
  if (type == "str") {
    if (value.is_array() && fact.value("nargs", "") == "+")
      return !value.empty() && std::all_of(value.begin(), value.end(), [&](const spec::Json& v) {
        return v.is_string() && in_choices(fact, v);
      });
    return value.is_string() && in_choices(fact, value);
  }
  if (type == "list[str]")
    return value.is_array() && std::all_of(value.begin(), value.end(), [&](const spec::Json& v) {
             return v.is_string() && in_choices(fact, v);
           });
  return false;
}

}  // namespace

const spec::Json& flag_facts(Target target) {
  static const std::map<std::string, spec::Json, std::less<>> all = [] {
    std::map<std::string, spec::Json, std::less<>> m;
    for (const spec::EmbeddedFile& f : embedded_flag_facts())
      m.emplace(std::string(f.name),
                spec::parse_json_text(f.text, "stacks/flags/" + std::string(f.name) + ".json"));
    return m;
  }();
  auto it = all.find(target_facts(target));
  SEXTANT_CHECK(it != all.end(), "no facts file for an export target");
  return it->second;
}

std::vector<std::string> facts_problems(const Exported& e) {
  const spec::Json& facts = flag_facts(e.target);
  const spec::Json& names = facts.at("names");
  const std::string where = fmt::format("{} at {}", facts.value("repository", "?"),
                                        facts.value("commit", "?").substr(0, 7));
  std::vector<std::string> problems;
  for (const Setting& s : e.settings) {
    if (!names.contains(s.name)) {
      problems.push_back(fmt::format("{}: not a name of {}", s.name, where));
    } else if (!allowed(names[s.name], s.value)) {
      problems.push_back(fmt::format("{} = {}: not in its domain ({}) at {}", s.name,
                                     s.value.dump(), names[s.name].dump(), where));
    }
  }
  return problems;
}

}  // namespace sextant::interop
