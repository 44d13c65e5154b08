// The routing skew of a measured mixture of experts.
#include "sextant/traces/moe_load.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "sextant/models/op_id.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/rank_layout.hpp"

namespace sextant::traces {

std::optional<MoeLoadMeasure> moe_load_imbalance(const spec::Trace& trace,
                                                 const std::string& source) {
  const std::string dispatch = models::op_name(models::OpId::kMoeDispatch);
  auto measured = [&](const spec::TraceEvent& e) {
    return e.name == dispatch && e.phase == spec::Phase::kFwd && e.shape.size() == 2;
  };
  if (std::none_of(trace.events.begin(), trace.events.end(), measured)) return std::nullopt;
  if (!trace.metadata.contains("plan_json"))
    throw InputError(source, "/otherData/plan_json", "",
                     "the run's plan, to group the ranks' dispatches by ep group (traces of "
                     "`sextant run --trace` carry it)");
  const spec::Plan plan =
      spec::plan_from_json(trace.metadata.at("plan_json"), source + " /otherData/plan_json");
  const spec::RankLayout layout(plan);
  // Per dispatch: the ep group's first rank stands for the group; each member's rows.
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t>;  // step, layer, micro-batch, group
  std::map<Key, std::map<int64_t, int64_t>> rows;
  std::map<int64_t, int64_t> group_of;
  for (const spec::TraceEvent& e : trace.events) {
    if (!measured(e)) continue;
    auto [it, added] = group_of.try_emplace(e.rank, 0);
    if (added) {
      const std::vector<int64_t> group = layout.ep_group(e.rank);
      it->second = *std::min_element(group.begin(), group.end());
    }
    rows[{e.step, e.layer.value_or(-1), e.micro_batch.value_or(-1), it->second}][e.rank] =
        e.shape[0];
  }
  MoeLoadMeasure out;
  double sum = 0;
  for (const auto& [key, by_rank] : rows) {
    // A dispatch with a rank missing (a trace kept for some ranks only) says nothing of the max.
    if (static_cast<int64_t>(by_rank.size()) != plan.ep) continue;
    int64_t most = 0, total = 0;
    for (const auto& [rank, n] : by_rank) {
      most = std::max(most, n);
      total += n;
    }
    if (total == 0) continue;
    const double ratio =
        static_cast<double>(most) * static_cast<double>(plan.ep) / static_cast<double>(total);
    sum += ratio;
    out.worst = std::max(out.worst, ratio);
    ++out.dispatches;
  }
  if (out.dispatches == 0) return std::nullopt;
  out.imbalance = sum / static_cast<double>(out.dispatches);
  return out;
}

}  // namespace sextant::traces
