// Line wrapping of human output, and stdout through it (glibc's fopencookie).
#include "fitted_output.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace sextant::cli {

namespace {

// Where a line's continuation goes: under its value column (the first text after a run of two or
// more spaces, within the first 40 columns), else 4 past its own indent.
size_t hanging_indent(std::string_view line) {
  const size_t lead = line.find_first_not_of(' ');
  if (lead == std::string_view::npos) return 0;
  const size_t gap = line.find("  ", lead);
  if (gap != std::string_view::npos && gap < 40) {
    const size_t value = line.find_first_not_of(' ', gap);
    if (value != std::string_view::npos && value < 40) return value;
  }
  return lead + 4;
}

}  // namespace

namespace {
size_t g_columns = kOutputColumns;
}  // namespace

size_t output_columns() {
  return g_columns;
}

std::string wrap_from(std::string_view text, size_t column, size_t width) {
  if (width == 0) return std::string(text);
  std::string out;
  size_t room = width > column ? width - column : 20;
  size_t pos = 0;
  bool first = true;
  while (pos < text.size()) {
    while (!first && pos < text.size() && text[pos] == ' ') ++pos;
    if (pos >= text.size()) break;
    size_t end = text.size();
    if (end - pos > room) {
      const size_t space = text.rfind(' ', pos + room);
      end = space != std::string_view::npos && space > pos ? space : text.find(' ', pos + room);
      if (end == std::string_view::npos) end = text.size();
    }
    if (!first) out += "\n" + std::string(column, ' ');
    out += text.substr(pos, end - pos);
    // Trailing spaces of a piece are dropped, not carried.
    while (!out.empty() && out.back() == ' ' && end < text.size()) out.pop_back();
    pos = end;
    first = false;
  }
  return out;
}

std::string wrap_line(std::string_view line, size_t width) {
  if (line.size() <= width) return std::string(line);
  size_t indent = hanging_indent(line);
  if (indent >= width / 2) indent = 4;
  // The first line keeps the text up to the indent as it is; the rest wraps after it.
  const size_t head = std::min(indent, line.size());
  return std::string(line.substr(0, head)) + wrap_from(line.substr(head), indent, width);
}

size_t name_column(const std::vector<std::string>& names, size_t max_width) {
  size_t width = 4;
  for (const std::string& n : names) width = std::max(width, n.size());
  return output_columns() == 0 ? width : std::min(width, max_width);
}

std::string name_cell(const std::string& name, size_t width, size_t indent) {
  if (name.size() <= width) return name + std::string(width - name.size(), ' ');
  return name + "\n" + std::string(indent + width, ' ');
}

namespace {

struct Cookie {
  FILE* target = nullptr;
  size_t width = kOutputColumns;
  std::string pending;  // the line being written, until its newline
};

ssize_t cookie_write(void* c, const char* data, size_t size) {
  Cookie& cookie = *static_cast<Cookie*>(c);
  cookie.pending.append(data, size);
  size_t start = 0;
  for (size_t nl = cookie.pending.find('\n'); nl != std::string::npos;
       nl = cookie.pending.find('\n', start)) {
    const std::string line =
        wrap_line(std::string_view(cookie.pending).substr(start, nl - start), cookie.width) + "\n";
    std::fwrite(line.data(), 1, line.size(), cookie.target);
    start = nl + 1;
  }
  // A partial line waits for its end (a line printed in pieces is wrapped whole); the close at
  // exit writes what is left. Progress lines go to stderr, which is not wrapped.
  cookie.pending.erase(0, start);
  std::fflush(cookie.target);
  return static_cast<ssize_t>(size);
}

int cookie_close(void* c) {
  Cookie* cookie = static_cast<Cookie*>(c);
  if (!cookie->pending.empty())
    std::fwrite(cookie->pending.data(), 1, cookie->pending.size(), cookie->target);
  const int rc = std::fflush(cookie->target);
  delete cookie;
  return rc;
}

}  // namespace

std::string WrappingFormatter::make_option_desc(const CLI::Option* option) const {
  // CLI11 puts each continuation line under the description column.
  return wrap_from(CLI::Formatter::make_option_desc(option), 0,
                   output_columns() == 0 ? 0 : output_columns() - get_column_width());
}

std::string WrappingFormatter::make_subcommand(const CLI::App* sub) const {
  std::stringstream out;
  CLI::detail::format_help(
      out, sub->get_display_name(true),
      wrap_from(sub->get_description(), 0,
                output_columns() == 0 ? 0 : output_columns() - get_column_width()),
      get_column_width());
  return out.str();
}

std::string WrappingFormatter::make_description(const CLI::App* app) const {
  return wrap_from(CLI::Formatter::make_description(app), 0);
}

std::string WrappingFormatter::make_footer(const CLI::App* app) const {
  return wrap_from(CLI::Formatter::make_footer(app), 0);
}

void wrap_stdout(size_t width) {
  g_columns = width;
  if (width == 0) return;
  std::fflush(stdout);
  auto* cookie = new Cookie{stdout, width, {}};
  cookie_io_functions_t io{};
  io.write = cookie_write;
  io.close = cookie_close;
  FILE* wrapped = fopencookie(cookie, "w", io);
  if (wrapped == nullptr) {
    delete cookie;
    return;
  }
  std::setvbuf(wrapped, nullptr, _IOLBF, 1 << 16);
  stdout = wrapped;  // glibc: stdout is a plain variable; std::cout keeps the original FILE
}

}  // namespace sextant::cli
