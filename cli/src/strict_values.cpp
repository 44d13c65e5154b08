#include "strict_values.hpp"

#include "sextant/spec/strict_number.hpp"

namespace sextant::cli {

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
          [is_unsigned](std::string& text) {
            return spec::strict_integer_problem(text, is_unsigned);
          },
          ""));
    } else if (type == "FLOAT") {
      option->check(CLI::Validator(spec::strict_decimal_problem, ""));
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
