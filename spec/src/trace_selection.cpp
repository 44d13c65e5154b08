// Parsing of --trace-ranks / --trace-steps and filtering of trace events.
#include "sextant/spec/trace_selection.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "sextant/spec/error.hpp"
#include "sextant/spec/rank_layout.hpp"

namespace sextant::spec {

namespace {

std::vector<std::string_view> split_commas(std::string_view text) {
  std::vector<std::string_view> items;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    items.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return items;
}

std::optional<int64_t> non_negative_integer(std::string_view text) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 0) return std::nullopt;
  return v;
}

// "A" or "A-B" with A <= B; std::nullopt otherwise.
std::optional<std::pair<int64_t, int64_t>> range_of(std::string_view item) {
  const size_t dash = item.find('-');
  if (dash == std::string_view::npos) {
    if (auto v = non_negative_integer(item)) return std::pair{*v, *v};
    return std::nullopt;
  }
  auto lo = non_negative_integer(item.substr(0, dash));
  auto hi = non_negative_integer(item.substr(dash + 1));
  if (!lo || !hi || *lo > *hi) return std::nullopt;
  return std::pair{*lo, *hi};
}

}  // namespace

bool TraceSelection::keeps_rank(int64_t rank) const {
  return ranks.empty() || std::binary_search(ranks.begin(), ranks.end(), rank);
}

bool TraceSelection::keeps_step(int64_t step) const {
  if (steps.empty()) return true;
  return std::any_of(steps.begin(), steps.end(),
                     [&](const auto& r) { return step >= r.first && step <= r.second; });
}

TraceSelection parse_trace_selection(std::string_view ranks, std::string_view steps,
                                     const Plan& plan) {
  TraceSelection s;
  const RankLayout layout(plan);
  const int64_t world = layout.world_size();
  if (!ranks.empty()) {
    for (std::string_view item : split_commas(ranks)) {
      if (item == "last") {
        s.ranks.push_back(world - 1);
      } else if (item == "stages") {
        for (int64_t p = 0; p < plan.pp; ++p) s.ranks.push_back(layout.rank({0, 0, p}));
      } else if (item == "replicas") {
        for (int64_t d = 0; d < plan.dp; ++d) s.ranks.push_back(layout.rank({d, 0, 0}));
      } else if (auto r = range_of(item)) {
        if (r->second >= world) {
          throw InputError("--trace-ranks", "", std::string(item),
                           fmt::format("ranks of this plan are 0-{} ({})", world - 1, plan.name()));
        }
        for (int64_t k = r->first; k <= r->second; ++k) s.ranks.push_back(k);
      } else {
        throw InputError("--trace-ranks", "", std::string(item),
                         "a rank, a range A-B, last, stages or replicas (comma-separated)");
      }
    }
    std::sort(s.ranks.begin(), s.ranks.end());
    s.ranks.erase(std::unique(s.ranks.begin(), s.ranks.end()), s.ranks.end());
  }
  if (!steps.empty()) {
    for (std::string_view item : split_commas(steps)) {
      auto r = range_of(item);
      if (!r) {
        throw InputError("--trace-steps", "", std::string(item),
                         "a step or a range A-B from 0 (comma-separated)");
      }
      s.steps.push_back(*r);
    }
  }
  return s;
}

void apply(const TraceSelection& selection, Trace& trace) {
  if (selection.keeps_everything()) return;
  std::erase_if(trace.events, [&](const TraceEvent& e) { return !selection.keeps(e); });
}

}  // namespace sextant::spec
