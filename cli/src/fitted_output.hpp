// Human output that fits a 100-column terminal. Tables are laid out to fit; what is still longer
// (prose: notes, warnings, explanations) is wrapped at word boundaries with a hanging indent under
// the line's value column ("   memory per GPU   1.45 GiB of ...": continued under "1.45"). JSON and
// other machine output go to std::cout and are never wrapped.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace sextant::cli {

inline constexpr size_t kOutputColumns = 100;

// `line` (no newline) broken into lines of at most `width` columns where it has spaces; a word
// longer than the room (a path) stays whole on its own line.
std::string wrap_line(std::string_view line, size_t width = kOutputColumns);

// The columns human output fits: kOutputColumns, or 0 (no limit) after wrap_stdout(0) (`--wide`).
size_t output_columns();

// `text` wrapped to the columns from `column` to `width`, continuation lines indented by `column`
// spaces; the first line is not indented (it follows what the caller printed up to `column`).
// Width 0: `text` as it is.
std::string wrap_from(std::string_view text, size_t column, size_t width = output_columns());

// A table's name column: as wide as its longest name, at most `max_width` (longer names get a line
// of their own, name_cell) unless output is not limited (`--wide`).
size_t name_column(const std::vector<std::string>& names, size_t max_width);
// `name` padded to `width`; a longer name ends its line and the row continues on the next, indented
// `indent` + `width` columns, so the other columns stay aligned.
std::string name_cell(const std::string& name, size_t width, size_t indent);

// From here on, every line printed to stdout through C stdio (fmt::print) is wrapped with
// wrap_line at `width` columns; 0 leaves stdout as it is (`--wide`).
void wrap_stdout(size_t width);

// CLI11's help with every description wrapped to fit kOutputColumns (CLI11 2.1 does not wrap).
class WrappingFormatter : public CLI::Formatter {
 public:
  std::string make_option_desc(const CLI::Option* option) const override;
  std::string make_subcommand(const CLI::App* sub) const override;
  std::string make_description(const CLI::App* app) const override;
  std::string make_footer(const CLI::App* app) const override;
};

}  // namespace sextant::cli
