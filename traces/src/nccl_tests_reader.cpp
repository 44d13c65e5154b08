// nccl-tests output.
#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "sextant/spec/json_io.hpp"
#include "sextant/spec/limits.hpp"
#include "sextant/spec/strict_number.hpp"
#include "sextant/traces/readers.hpp"

namespace sextant::traces {

namespace {

struct Named {
  std::string_view text;
  spec::CollectiveKind kind;
};
// Longest names first: "reduce_scatter" before "reduce".
constexpr Named kNames[] = {{"all_reduce", spec::CollectiveKind::kAllReduce},
                            {"reduce_scatter", spec::CollectiveKind::kReduceScatter},
                            {"all_gather", spec::CollectiveKind::kAllGather},
                            {"alltoall", spec::CollectiveKind::kAllToAll},
                            {"broadcast", spec::CollectiveKind::kBroadcast},
                            {"sendrecv", spec::CollectiveKind::kSendRecv},
                            {"reduce", spec::CollectiveKind::kReduce}};

std::optional<spec::CollectiveKind> kind_in(std::string_view text) {
  for (const Named& n : kNames)
    if (text.find(n.text) != std::string_view::npos) return n.kind;
  return std::nullopt;
}

}  // namespace

namespace {

// Where the columns of a table are, from its header line ("#  size  count  type ... time  algbw
// busbw #wrong  time ..."): the first "time" (out of place) and every "#wrong".
struct Columns {
  int time = -1;
  std::vector<int> wrong;
};

std::optional<Columns> header_columns(const std::string& line) {
  std::istringstream h(line.substr(1));
  std::vector<std::string> cols;
  for (std::string c; h >> c;) cols.push_back(c);
  if (cols.size() <= 2 || cols[0] != "size" || cols[1] != "count") return std::nullopt;
  Columns c;
  for (size_t i = 0; i < cols.size(); ++i) {
    // The header's "#wrong" loses its '#' only when it is the first column (it never is).
    if (cols[i] == "time" && c.time < 0) c.time = static_cast<int>(i);
    if (cols[i] == "#wrong") c.wrong.push_back(static_cast<int>(i));
  }
  return c;
}

}  // namespace

Samples parse_nccl_tests(const std::string& text, const std::string& source,
                         std::optional<spec::CollectiveKind> kind) {
  if (!kind) {
    for (const Named& n : kNames) {
      if (text.find(std::string(n.text) + "_perf") != std::string::npos) {
        kind = n.kind;
        break;
      }
    }
  }
  if (!kind) kind = kind_in(source);
  if (!kind) {
    throw InputError(source, "", "",
                     "cannot tell which collective this nccl-tests output measures: name it, "
                     "e.g. --nccl-tests all_reduce:" +
                         source);
  }
  Samples s;
  s.sources.push_back(source);
  int64_t ranks = 0;
  std::optional<Columns> columns;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  int64_t previous_size = -1;
  int previous_line = 0;
  int64_t empty_rows = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const std::string where = fmt::format("line {}", line_no);
    if (line.rfind("#  Rank", 0) == 0) {
      ++ranks;
      continue;
    }
    if (!line.empty() && line[0] == '#') {
      if (std::optional<Columns> c = header_columns(line)) {
        if (c->time < 0) throw InputError(source, where, line, "a header without a 'time' column");
        columns = c;
      }
      continue;
    }
    std::istringstream row(line);
    std::vector<std::string> fields;
    for (std::string f; row >> f;) fields.push_back(f);
    if (fields.empty()) continue;
    if (!columns) {
      throw InputError(source, where, "", "a data row before the '#  size  count ... time' header");
    }
    int last = columns->time;
    for (int w : columns->wrong) last = std::max(last, w);
    if (static_cast<int>(fields.size()) <= last) {
      throw InputError(source, where, line, fmt::format("expected at least {} columns", last + 1));
    }
    const std::optional<int64_t> bytes = spec::strict_integer(fields[0]);
    if (!bytes || *bytes < 0)
      throw InputError(source, where, fields[0], "expected the size in bytes, an integer >= 0");
    const std::string& time_text = fields[static_cast<size_t>(columns->time)];
    const std::optional<double> us = spec::strict_decimal(time_text);
    if (!us || !(*us > 0) || *us * 1e-6 > spec::kMaxSeconds)
      throw InputError(source, where, time_text,
                       "expected the time in microseconds, a finite number > 0");
    for (int w : columns->wrong) {
      const std::string& wrong = fields[static_cast<size_t>(w)];
      if (wrong != "0" && wrong != "N/A")
        throw InputError(source, where, wrong,
                         "#wrong must be 0: the collective returned wrong results, so its times "
                         "are not those of a working collective");
    }
    // nccl-tests prints each size once, growing: a repeat is another run pasted in (or a row
    // edited), and its times would be averaged with the first's without a word.
    if (*bytes <= previous_size)
      throw InputError(source, where, fields[0],
                       fmt::format("sizes must grow down the table (line {} has {}): one "
                                   "nccl-tests run per file",
                                   previous_line, previous_size));
    previous_size = *bytes;
    previous_line = line_no;
    if (*bytes == 0) {
      ++empty_rows;
      continue;
    }
    s.comm.push_back({*kind, 0, *bytes, *us * 1e-6});
  }
  if (s.comm.empty()) throw InputError(source, "", "", "no measurement rows found");
  if (ranks == 0) {
    throw InputError(source, "", "",
                     "no '#  Rank' lines: cannot tell how many ranks the collective ran on");
  }
  if (empty_rows > 0)
    s.warnings.push_back(
        fmt::format("{}: {} row(s) of size 0 left out (they time the call, not a transfer)", source,
                    empty_rows));
  for (CommSample& c : s.comm) c.ranks = ranks;
  return s;
}

Samples read_nccl_tests(const std::string& path_spec) {
  std::optional<spec::CollectiveKind> kind;
  std::string path = path_spec;
  if (auto colon = path_spec.find(':'); colon != std::string::npos) {
    std::string prefix = path_spec.substr(0, colon);
    for (const Named& n : kNames) {
      if (prefix == n.text) {
        kind = n.kind;
        path = path_spec.substr(colon + 1);
      }
    }
  }
  return parse_nccl_tests(spec::read_text_file(path), path, kind);
}

}  // namespace sextant::traces
