// Predicted-vs-measured comparison.
#include "sextant/traces/compare.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <set>
#include <tuple>

#include "sextant/spec/error.hpp"

namespace sextant::traces {

namespace {

struct Totals {
  std::map<std::string, double> by_class, by_collective, by_op;
  double step_s = 0;
};

Totals totals(const spec::Trace& t, const std::string& what) {
  Totals out;
  std::set<int64_t> steps, ranks;
  for (const spec::TraceEvent& e : t.events) {
    steps.insert(e.step);
    ranks.insert(e.rank);
  }
  // The first of several measured steps warms up (allocations, caches): leave it out, as the
  // measured step time does.
  const bool skip_first = steps.size() > 1;
  const int64_t first = steps.empty() ? 0 : *steps.begin();
  const double n = static_cast<double>(std::max<size_t>(1, steps.size() - (skip_first ? 1 : 0))) *
                   static_cast<double>(std::max<size_t>(1, ranks.size()));
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (const spec::TraceEvent& e : t.events) {
    if (skip_first && e.step == first) continue;
    const double s = ps_to_seconds(e.duration_ps) / n;
    out.by_class[std::string(spec::enum_name(spec::op_class_names(), e.op_class))] += s;
    out.by_op[e.name] += s;
    if (spec::is_communication(e.op_class)) out.by_collective[e.name] += s;
    lo = std::min(lo, e.start_ps);
    hi = std::max(hi, e.start_ps + e.duration_ps);
  }
  if (t.metadata.is_object() && t.metadata.contains("step_time_s") &&
      t.metadata.at("step_time_s").is_number()) {
    out.step_s = t.metadata.at("step_time_s").get<double>();
  } else if (hi > lo) {
    out.step_s = ps_to_seconds(hi - lo) /
                 static_cast<double>(std::max<size_t>(1, steps.size() - (skip_first ? 1 : 0)));
  }
  if (out.step_s <= 0) {
    throw InputError(what + " trace", "/otherData/step_time_s", "",
                     "missing, and the trace has no events to measure a step from");
  }
  return out;
}

std::vector<Row> rows(const std::map<std::string, double>& m,
                      const std::map<std::string, double>& p) {
  std::set<std::string> keys;
  for (const auto& [k, v] : m) keys.insert(k);
  for (const auto& [k, v] : p) keys.insert(k);
  std::vector<Row> out;
  for (const std::string& k : keys) {
    auto a = m.find(k);
    auto b = p.find(k);
    out.push_back({k, a == m.end() ? 0 : a->second, b == p.end() ? 0 : b->second});
  }
  std::sort(out.begin(), out.end(),
            [](const Row& x, const Row& y) { return x.measured_s > y.measured_s; });
  return out;
}

// Occurrences of each (rank, name, phase, bytes) in the trace's first step, on `ranks` only.
using OpKey = std::tuple<int64_t, std::string, spec::Phase, int64_t>;
std::map<OpKey, int64_t> first_step_ops(const spec::Trace& t, const std::set<int64_t>& ranks) {
  std::map<OpKey, int64_t> out;
  if (t.events.empty()) return out;
  int64_t first = INT64_MAX;
  for (const spec::TraceEvent& e : t.events) first = std::min(first, e.step);
  // Host time outside any op (a calibrated step overhead) is the model's account of what no op
  // shows, never an op of the run: it is not compared.
  for (const spec::TraceEvent& e : t.events)
    if (e.step == first && ranks.count(e.rank) != 0 && e.op_class != spec::OpClass::kHost)
      ++out[{e.rank, e.name, e.phase, e.bytes}];
  return out;
}

std::set<int64_t> ranks_of(const spec::Trace& t) {
  std::set<int64_t> r;
  for (const spec::TraceEvent& e : t.events) r.insert(e.rank);
  return r;
}

}  // namespace

namespace {

// Each (rank, name, phase, bytes) of the first step with its count in measured and predicted, on
// the ranks both traces hold.
std::map<OpKey, std::pair<int64_t, int64_t>> paired_ops(const spec::Trace& measured,
                                                        const spec::Trace& predicted) {
  std::set<int64_t> ranks;
  const std::set<int64_t> m_ranks = ranks_of(measured), p_ranks = ranks_of(predicted);
  std::set_intersection(m_ranks.begin(), m_ranks.end(), p_ranks.begin(), p_ranks.end(),
                        std::inserter(ranks, ranks.end()));
  std::map<OpKey, std::pair<int64_t, int64_t>> both;
  for (const auto& [k, n] : first_step_ops(measured, ranks)) both[k].first = n;
  for (const auto& [k, n] : first_step_ops(predicted, ranks)) both[k].second = n;
  return both;
}

}  // namespace

std::vector<OpDisagreement> op_disagreements(const spec::Trace& measured,
                                             const spec::Trace& predicted) {
  std::vector<OpDisagreement> out;
  for (const auto& [k, n] : paired_ops(measured, predicted)) {
    if (n.first == n.second) continue;
    const auto& [rank, name, phase, bytes] = k;
    out.push_back({rank, name, phase, bytes, n.first, n.second});
  }
  return out;
}

std::vector<OpMismatch> op_mismatches(const spec::Trace& measured, const spec::Trace& predicted) {
  std::map<std::string, OpMismatch> by_name;
  std::set<std::string> differing;
  for (const auto& [k, n] : paired_ops(measured, predicted)) {
    const auto& [rank, name, phase, bytes] = k;
    OpMismatch& m = by_name[name];
    m.name = name;
    m.measured_count += n.first;
    m.predicted_count += n.second;
    m.measured_bytes += n.first * bytes;
    m.predicted_bytes += n.second * bytes;
    if (n.first != n.second) differing.insert(name);
  }
  std::vector<OpMismatch> out;
  for (const std::string& name : differing) out.push_back(by_name[name]);
  return out;
}

Comparison compare(const spec::Trace& measured, const spec::Trace& predicted) {
  Totals m = totals(measured, "measured");
  Totals p = totals(predicted, "predicted");
  Comparison c;
  c.measured_step_s = m.step_s;
  c.predicted_step_s = p.step_s;
  c.by_class = rows(m.by_class, p.by_class);
  c.by_collective = rows(m.by_collective, p.by_collective);
  c.worst_ops = rows(m.by_op, p.by_op);
  std::sort(c.worst_ops.begin(), c.worst_ops.end(), [](const Row& x, const Row& y) {
    return std::fabs(x.predicted_s - x.measured_s) > std::fabs(y.predicted_s - y.measured_s);
  });
  if (c.worst_ops.size() > 10) c.worst_ops.resize(10);
  c.mismatched_ops = op_mismatches(measured, predicted);
  return c;
}

double kendall_tau(const std::vector<double>& a, const std::vector<double>& b) {
  return kendall_tau(a, b, nullptr);
}

double kendall_tau(const std::vector<double>& a, const std::vector<double>& b,
                   const std::function<bool(size_t, size_t)>& b_tied) {
  SEXTANT_CHECK(a.size() == b.size(), "rankings of different lengths");
  double concordant = 0, discordant = 0, ties_a = 0, ties_b = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = i + 1; j < a.size(); ++j) {
      const double da = a[i] - a[j];
      const double db = b_tied && b_tied(i, j) ? 0.0 : b[i] - b[j];
      if (da == 0 && db == 0) continue;
      if (da == 0) {
        ties_a += 1;
      } else if (db == 0) {
        ties_b += 1;
      } else if ((da > 0) == (db > 0)) {
        concordant += 1;
      } else {
        discordant += 1;
      }
    }
  }
  const double denom =
      std::sqrt((concordant + discordant + ties_a) * (concordant + discordant + ties_b));
  return denom > 0 ? (concordant - discordant) / denom : 1.0;
}

double regret(const std::vector<double>& predicted, const std::vector<double>& measured) {
  SEXTANT_CHECK(!predicted.empty() && predicted.size() == measured.size(), "bad regret input");
  size_t pick =
      static_cast<size_t>(std::min_element(predicted.begin(), predicted.end()) - predicted.begin());
  double best = *std::min_element(measured.begin(), measured.end());
  return measured[pick] / best - 1;
}

}  // namespace sextant::traces
