// import_plan: each stack's syntax parsed into settings, then read as a plan.
#include "sextant/interop/import.hpp"

#include <fmt/format.h>

#include <regex>
#include <sstream>

// toml++'s internal asserts off, as in the library Debian builds (NDEBUG): 3.3.0 asserts on some
// malformed table headers ("[= 1") that it goes on to report as parse errors (the stack_config
// fuzz target's seed table-header-assert; ASan checks the path past the assert).
#define TOML_ASSERT(expr) static_cast<void>(0)
#include <toml++/toml.h>

#include "import_settings.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::interop {

namespace {

// "8" -> 8, "0.5" -> 0.5, anything else the text itself.
spec::Json scalar(const std::string& word) {
  static const std::regex integer(R"(^-?[0-9]+$)"), real(R"(^-?[0-9]*\.[0-9]+([eE]-?[0-9]+)?$)");
  try {
    if (std::regex_match(word, integer)) return std::stoll(word);
    if (std::regex_match(word, real)) return std::stod(word);
  } catch (const std::out_of_range&) {  // beyond int64 or double: the text, refused where read
  }
  return word;
}

// Shell words, as bash splits a command line: continued lines joined, quotes removed.
std::vector<std::string> shell_words(const std::string& text, const std::string& source) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\\' && i + 1 < text.size() && text[i + 1] == '\n') {
      ++i;
    } else if (c == '\'' || c == '"') {
      const size_t end = text.find(c, i + 1);
      if (end == std::string::npos)
        throw InputError(source, "", text.substr(i, 20), "an unterminated quote");
      word += text.substr(i + 1, end - i - 1);
      in_word = true;
      i = end;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

// Megatron: each --flag with the words up to the next flag (none: a store_true flag).
std::vector<Setting> argument_settings(const std::string& text, const std::string& source) {
  std::vector<Setting> out;
  for (const std::string& w : shell_words(text, source)) {
    if (w.starts_with("--")) {
      const size_t eq = w.find('=');  // argparse also takes --flag=value
      out.push_back({w.substr(0, eq), true});
      if (eq != std::string::npos) out.back().value = scalar(w.substr(eq + 1));
      continue;
    }
    if (out.empty()) continue;  // the launcher and script before the first flag
    spec::Json& v = out.back().value;
    if (v.is_boolean())
      v = scalar(w);
    else if (v.is_array())
      v.push_back(scalar(w));
    else
      v = spec::Json::array({v, scalar(w)});
  }
  return out;
}

// NeMo-Run overrides: path=value per line, Python's True / False, '#' comments.
std::vector<Setting> override_settings(const std::string& text, const std::string& source) {
  std::vector<Setting> out;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    line = line.substr(0, line.find('#'));
    for (const std::string& word : shell_words(line, source)) {
      const size_t eq = word.find('=');
      if (eq == std::string::npos || eq == 0)
        throw InputError(source, fmt::format("line {}", n), word, "path=value");
      const std::string value = word.substr(eq + 1);
      out.push_back({word.substr(0, eq), value == "True"    ? spec::Json(true)
                                         : value == "False" ? spec::Json(false)
                                                            : scalar(value)});
    }
  }
  return out;
}

spec::Json toml_json(const toml::node& node) {
  if (auto v = node.as_integer()) return v->get();
  if (auto v = node.as_floating_point()) return v->get();
  if (auto v = node.as_boolean()) return v->get();
  if (auto v = node.as_string()) return v->get();
  if (auto a = node.as_array()) {
    spec::Json list = spec::Json::array();
    for (const toml::node& item : *a) list.push_back(toml_json(item));
    return list;
  }
  return nullptr;  // dates and times shape no plan
}

// TOML allows characters beyond ASCII only inside strings and comments (bare keys, numbers,
// booleans and dates are ASCII). Elsewhere toml++ 3.3.0 asks whether one is whitespace, and its
// is_non_ascii_horizontal_whitespace reaches TOML_UNREACHABLE for U+00A1..U+0499 (undefined
// behaviour; found by the stack_config fuzz target). Such a config is refused here instead, by
// line, before toml++ reads it.
void refuse_non_ascii_outside_strings(const std::string& text, const std::string& source) {
  enum class In { kCode, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral } in = In::kCode;
  int64_t line = 1;
  auto opens = [&](size_t i, char q) { return text.compare(i, 3, std::string(3, q)) == 0; };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      if (in == In::kComment || in == In::kBasic || in == In::kLiteral) in = In::kCode;
      continue;
    }
    switch (in) {
      case In::kCode:
        if (static_cast<unsigned char>(c) >= 0x80)
          throw InputError(source, fmt::format("line {}", line), "",
                           "a character beyond ASCII outside a string or comment (TOML allows "
                           "them only there)");
        if (c == '#') {
          in = In::kComment;
        } else if (c == '"' || c == '\'') {
          const bool multi = opens(i, c);
          if (multi) i += 2;
          in = c == '"' ? (multi ? In::kMultiBasic : In::kBasic)
                        : (multi ? In::kMultiLiteral : In::kLiteral);
        }
        break;
      case In::kBasic:
      case In::kMultiBasic:
        if (c == '\\') {
          // An escaped quote or backslash ends nothing (a line-ending backslash is counted below).
          if (i + 1 < text.size() && text[i + 1] != '\n') ++i;
        } else if (c == '"' && (in == In::kBasic || opens(i, '"'))) {
          if (in == In::kMultiBasic) i += 2;
          in = In::kCode;
        }
        break;
      case In::kLiteral:
      case In::kMultiLiteral:
        if (c == '\'' && (in == In::kLiteral || opens(i, '\''))) {
          if (in == In::kMultiLiteral) i += 2;
          in = In::kCode;
        }
        break;
      case In::kComment:
        break;
    }
  }
}

void flatten_toml(const toml::table& t, const std::string& prefix, std::vector<Setting>& out) {
  for (const auto& [key, node] : t) {
    const std::string name = prefix + std::string(key.str());
    if (const toml::table* sub = node.as_table())
      flatten_toml(*sub, name + ".", out);
    else
      out.push_back({name, toml_json(node)});
  }
}

void flatten_json(const spec::Json& j, const std::string& prefix, std::vector<Setting>& out) {
  for (const auto& [key, value] : j.items()) {
    if (value.is_object())
      flatten_json(value, prefix + key + ".", out);
    else
      out.push_back({prefix + key, value});
  }
}

}  // namespace

std::vector<Setting> parse_settings(Target target, const std::string& text,
                                    const std::string& source) {
  std::vector<Setting> out;
  switch (target) {
    case Target::kMegatronCore:
    case Target::kMegatronLm:
      return argument_settings(text, source);
    case Target::kNemo:
      return override_settings(text, source);
    case Target::kTorchtitan:
      refuse_non_ascii_outside_strings(text, source);
      try {
        flatten_toml(toml::parse(text, source), "", out);
      } catch (const toml::parse_error& e) {
        throw InputError(source, fmt::format("line {}", e.source().begin.line), "",
                         std::string(e.description()));
      }
      return out;
    case Target::kDeepspeed:
      flatten_json(spec::parse_json_text(text, source), "", out);
      return out;
  }
  return out;
}

namespace detail {

int64_t data_parallel_from(std::optional<int64_t> gpus, int64_t others, SettingsReader& r) {
  if (!gpus) return 0;
  if (others <= 0 || *gpus % others != 0) {
    r.problem("--gpus", std::to_string(*gpus),
              fmt::format("a multiple of the {} ranks the config's degrees multiply to", others));
    return 0;
  }
  return *gpus / others;
}

}  // namespace detail

Imported import_plan(Target target, const std::string& text, const std::string& source,
                     const spec::ModelSpec& model, std::optional<int64_t> gpus) {
  // A config is UTF-8 text (its names and values end up in JSON plans and messages): nlohmann's
  // own check says where it is not.
  try {
    (void)spec::Json(text).dump();
  } catch (const spec::Json::type_error& e) {
    throw InputError(source, "", "", std::string("not UTF-8 text: ") + e.what());
  }
  if (!model.is_transformer() && target != Target::kDeepspeed)
    throw InputError(source, "", model.name,
                     "a transformer: Megatron, NeMo and TorchTitan train no CNNs or MLPs");
  detail::SettingsReader r(parse_settings(target, text, source), source);
  Imported out;
  switch (target) {
    case Target::kMegatronCore:
    case Target::kMegatronLm:
      out.plan = detail::megatron_plan(r, model, gpus, false, target);
      break;
    case Target::kNemo:
      out.plan = detail::megatron_plan(r, model, gpus, true, target);
      break;
    case Target::kTorchtitan:
      out.plan = detail::torchtitan_plan(r, model, gpus);
      break;
    case Target::kDeepspeed:
      out.plan = detail::deepspeed_plan(r, gpus);
      break;
  }
  r.throw_if_any();
  out.ignored = r.ignored();
  out.plan.model = model.name;
  // The plan's own rules, as a plan file's.
  spec::validate_plan(out.plan, model, out.plan.world_size(), source);
  return out;
}

}  // namespace sextant::interop
