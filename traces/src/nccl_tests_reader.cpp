// nccl-tests output.
#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "sextant/spec/json_io.hpp"
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
  int time_column = -1;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.rfind("#  Rank", 0) == 0) {
      ++ranks;
      continue;
    }
    if (!line.empty() && line[0] == '#') {
      // The column header: "#       size         count      type   redop    root     time ..."
      std::istringstream h(line.substr(1));
      std::vector<std::string> cols;
      for (std::string c; h >> c;) cols.push_back(c);
      if (cols.size() > 2 && cols[0] == "size" && cols[1] == "count") {
        auto it = std::find(cols.begin(), cols.end(), "time");
        if (it != cols.end()) time_column = static_cast<int>(it - cols.begin());
      }
      continue;
    }
    std::istringstream row(line);
    std::vector<std::string> fields;
    for (std::string f; row >> f;) fields.push_back(f);
    if (fields.empty()) continue;
    if (time_column < 0) {
      throw InputError(source, fmt::format("line {}", line_no), "",
                       "a data row before the '#  size  count ... time' header");
    }
    if (static_cast<int>(fields.size()) <= time_column) {
      throw InputError(source, fmt::format("line {}", line_no), line,
                       fmt::format("expected at least {} columns", time_column + 1));
    }
    try {
      size_t used = 0;
      int64_t bytes = std::stoll(fields[0], &used);
      double us = std::stod(fields[static_cast<size_t>(time_column)]);
      if (bytes <= 0 || us <= 0) continue;
      s.comm.push_back({*kind, 0, bytes, us * 1e-6});
    } catch (const std::exception&) {
      throw InputError(source, fmt::format("line {}", line_no), line,
                       "expected numbers in the size and time columns");
    }
  }
  if (s.comm.empty()) throw InputError(source, "", "", "no measurement rows found");
  if (ranks == 0) {
    throw InputError(source, "", "",
                     "no '#  Rank' lines: cannot tell how many ranks the collective ran on");
  }
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
