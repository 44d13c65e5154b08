// How fast the cores of a run computed: its ranks against each other and against earlier runs.
#include "sextant/traces/rank_speeds.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace sextant::traces {

namespace {

struct RankSum {
  double seconds = 0;
  int64_t count = 0;
  double mean_s() const { return seconds / static_cast<double>(count); }
};

// Per compute op (name, pass, class, shape, dtype), per rank: its time and count.
struct OpTimes {
  int64_t ranks = 0;
  std::map<std::string, std::map<int64_t, RankSum>> by_op;
};

// A compute op of the steps the comparisons count (from `first_step`, the warm-up rule's): not a
// collective (its time holds the waits for the slowest rank), a host span or a copy.
bool counted_compute(const spec::TraceEvent& e, int64_t first_step) {
  return e.step >= first_step && !spec::is_communication(e.op_class) &&
         e.op_class != spec::OpClass::kHost && e.op_class != spec::OpClass::kMemcpy;
}

std::string op_key(const spec::TraceEvent& e) {
  return fmt::format("{}|{}|{}|{}|{}", e.name, static_cast<int>(e.phase),
                     static_cast<int>(e.op_class), fmt::join(e.shape, "x"),
                     e.dtype ? static_cast<int>(*e.dtype) : -1);
}

OpTimes op_times(const spec::Trace& trace, int64_t first_step) {
  OpTimes t;
  for (const spec::TraceEvent& e : trace.events) {
    t.ranks = std::max(t.ranks, e.rank + 1);
    if (!counted_compute(e, first_step)) continue;
    RankSum& s = t.by_op[op_key(e)][e.rank];
    s.seconds += ps_to_seconds(e.duration_ps);
    ++s.count;
  }
  return t;
}

// An op of a run of this many ranks: a core computes slower while the others compute too (the
// co-run slowdown, DeviceSpec::co_run), so runs of other rank counts are no reference.
std::string record_key(const OpTimes& times, const std::string& op) {
  return fmt::format("{} ranks|{}", times.ranks, op);
}

RankSpeeds rank_speeds(const OpTimes& times) {
  RankSpeeds r;
  r.compute_s.assign(static_cast<size_t>(times.ranks), 0.0);
  for (const auto& [key, by_rank] : times.by_op) {
    if (static_cast<int64_t>(by_rank.size()) != times.ranks) continue;
    // Each rank's mean time of the op, times the count every rank ran: a stage that runs an op
    // more often (pipeline stages of unequal depth) is not slower for it.
    int64_t common = by_rank.begin()->second.count;
    for (const auto& [rank, s] : by_rank) common = std::min(common, s.count);
    for (const auto& [rank, s] : by_rank)
      r.compute_s[static_cast<size_t>(rank)] += s.mean_s() * static_cast<double>(common);
    ++r.shared_ops;
  }
  return r;
}

// Whether each compute event (of steps `first_step` on, indexed as in trace.events) ran for at
// least half its time beside another rank's compute: the ranks' compute events, sorted by start,
// each rank's one after the other on its compute stream.
std::vector<bool> beside_other_compute(const spec::Trace& trace, int64_t first_step) {
  std::map<int64_t, std::vector<std::pair<Picoseconds, Picoseconds>>> spans;  // rank: start, end
  for (const spec::TraceEvent& e : trace.events)
    if (counted_compute(e, first_step))
      spans[e.rank].push_back({e.start_ps, e.start_ps + e.duration_ps});
  for (auto& [rank, s] : spans) std::sort(s.begin(), s.end());
  std::vector<bool> beside(trace.events.size(), false);
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const spec::TraceEvent& e = trace.events[i];
    if (!counted_compute(e, first_step) || e.duration_ps <= 0) continue;
    const Picoseconds begin = e.start_ps, end = e.start_ps + e.duration_ps;
    Picoseconds overlap = 0;  // with the rank that computed beside it the longest
    for (const auto& [rank, s] : spans) {
      if (rank == e.rank) continue;
      // The first span ending after `begin`, then every span starting before `end`.
      auto it = std::lower_bound(s.begin(), s.end(), begin,
                                 [](const auto& span, Picoseconds t) { return span.second <= t; });
      Picoseconds with_rank = 0;
      for (; it != s.end() && it->first < end; ++it)
        with_rank += std::min(end, it->second) - std::max(begin, it->first);
      overlap = std::max(overlap, with_rank);
    }
    beside[i] = 2 * overlap >= e.duration_ps;
  }
  return beside;
}

// Per rank: (op key with its rank count and co-run state, time, count) of a run's compute ops.
using RunOps = std::map<int64_t, std::map<std::string, RankSum>>;

RunOps run_ops(const spec::Trace& trace, int64_t first_step) {
  const std::vector<bool> beside = beside_other_compute(trace, first_step);
  int64_t ranks = 0;
  for (const spec::TraceEvent& e : trace.events) ranks = std::max(ranks, e.rank + 1);
  RunOps ops;
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const spec::TraceEvent& e = trace.events[i];
    if (!counted_compute(e, first_step)) continue;
    RankSum& s = ops[e.rank][fmt::format("{} ranks|{}|{}", ranks, beside[i] ? "beside" : "alone",
                                         op_key(e))];
    s.seconds += ps_to_seconds(e.duration_ps);
    ++s.count;
  }
  return ops;
}

}  // namespace

std::vector<double> slowdowns_against_fastest(const std::vector<const spec::Trace*>& runs,
                                              const std::vector<int64_t>& first_steps) {
  std::vector<RunOps> ops;
  std::map<std::string, double> fastest_s;  // each op's least mean time over the runs and ranks
  for (size_t i = 0; i < runs.size(); ++i) {
    ops.push_back(run_ops(*runs[i], first_steps.at(i)));
    for (const auto& [rank, by_op] : ops.back())
      for (const auto& [key, s] : by_op) {
        const auto [it, inserted] = fastest_s.emplace(key, s.mean_s());
        if (!inserted) it->second = std::min(it->second, s.mean_s());
      }
  }
  std::vector<double> slowdowns;
  for (const RunOps& run : ops) {
    double slowdown = 0;
    for (const auto& [rank, by_op] : run) {
      double took_s = 0, fastest_total_s = 0;
      for (const auto& [key, s] : by_op) {
        took_s += s.seconds;
        fastest_total_s += fastest_s.at(key) * static_cast<double>(s.count);
      }
      if (fastest_total_s > 0) slowdown = std::max(slowdown, took_s / fastest_total_s - 1);
    }
    slowdowns.push_back(slowdown);
  }
  return slowdowns;
}

std::map<int64_t, double> step_slowdowns(const spec::Trace& trace, int64_t first_step) {
  std::map<int64_t, std::map<int64_t, double>> compute_s;  // rank: step: its compute time
  for (const spec::TraceEvent& e : trace.events)
    if (counted_compute(e, first_step)) compute_s[e.rank][e.step] += ps_to_seconds(e.duration_ps);
  std::map<int64_t, double> slowdowns;
  for (const auto& [rank, by_step] : compute_s) {
    double fastest_s = by_step.begin()->second;
    for (const auto& [step, s] : by_step) fastest_s = std::min(fastest_s, s);
    for (const auto& [step, s] : by_step) {
      const double slowdown = fastest_s > 0 ? s / fastest_s - 1 : 0;
      const auto [it, inserted] = slowdowns.emplace(step, slowdown);
      if (!inserted) it->second = std::max(it->second, slowdown);
    }
  }
  return slowdowns;
}

double RankSpeeds::spread() const {
  if (compute_s.size() < 2 || shared_ops == 0) return 0;
  const auto [fastest, slowest] = std::minmax_element(compute_s.begin(), compute_s.end());
  return *fastest > 0 ? *slowest / *fastest - 1 : 0;
}

int64_t RankSpeeds::slowest_rank() const {
  return std::max_element(compute_s.begin(), compute_s.end()) - compute_s.begin();
}

int64_t RankSpeeds::fastest_rank() const {
  return std::min_element(compute_s.begin(), compute_s.end()) - compute_s.begin();
}

RankSpeeds rank_speeds(const spec::Trace& trace, int64_t first_step) {
  return rank_speeds(op_times(trace, first_step));
}

OpSpeedRecord::Verdict OpSpeedRecord::judge_then_record(const spec::Trace& trace,
                                                        int64_t first_step) {
  const OpTimes times = op_times(trace, first_step);
  Verdict v;
  if (times.ranks == 0) return v;
  const int64_t fastest = rank_speeds(times).fastest_rank();
  double known_s = 0, record_s = 0, all_s = 0;
  for (const auto& [key, by_rank] : times.by_op) {
    const auto rank = by_rank.find(fastest);
    if (rank == by_rank.end()) continue;
    all_s += rank->second.seconds;
    if (const auto best = fastest_s_.find(record_key(times, key)); best != fastest_s_.end()) {
      known_s += rank->second.seconds;
      record_s += best->second * static_cast<double>(rank->second.count);
    }
  }
  if (record_s > 0 && all_s > 0) {
    v.slowdown = known_s / record_s - 1;
    v.covered = known_s / all_s;
  }
  for (const auto& [key, by_rank] : times.by_op)
    for (const auto& [rank, s] : by_rank) {
      const auto [it, inserted] = fastest_s_.emplace(record_key(times, key), s.mean_s());
      if (!inserted) it->second = std::min(it->second, s.mean_s());
    }
  return v;
}

}  // namespace sextant::traces
