// Samples from Sextant's own traces.
#include "sextant/traces/samples.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "sextant/spec/cluster_spec.hpp"

namespace sextant::traces {

void Samples::append(const Samples& o) {
  compute.insert(compute.end(), o.compute.begin(), o.compute.end());
  steps.insert(steps.end(), o.steps.begin(), o.steps.end());
  sync.insert(sync.end(), o.sync.begin(), o.sync.end());
  comm.insert(comm.end(), o.comm.begin(), o.comm.end());
  sources.insert(sources.end(), o.sources.begin(), o.sources.end());
  warnings.insert(warnings.end(), o.warnings.begin(), o.warnings.end());
  ran_on.insert(o.ran_on.begin(), o.ran_on.end());
}

namespace {

// Per rank, the mean over `counted` steps of the time covered by the union of its events' spans.
std::map<int64_t, double> busy_per_rank(const spec::Trace& trace, bool skip_first, int64_t first,
                                        double counted) {
  std::map<int64_t, std::vector<std::pair<Picoseconds, Picoseconds>>> spans;
  for (const spec::TraceEvent& e : trace.events)
    if (!(skip_first && e.step == first) && e.duration_ps > 0)
      spans[e.rank].push_back({e.start_ps, e.start_ps + e.duration_ps});
  std::map<int64_t, double> busy;
  for (auto& [rank, list] : spans) {
    std::sort(list.begin(), list.end());
    Picoseconds total = 0, begin = list.front().first, end = list.front().second;
    for (const auto& [b, e] : list) {
      if (b > end) {
        total += end - begin;
        begin = b;
      }
      end = std::max(end, e);
    }
    total += end - begin;
    busy[rank] = ps_to_seconds(total) / counted;
  }
  return busy;
}

// The collectives of a training run, matched across ranks by name, step, micro-batch, layer,
// phase and occurrence (the k-th such event on each rank is the same collective).
std::vector<SyncSample> sync_samples(const spec::Trace& trace, const std::string& source,
                                     bool skip_first, int64_t first,
                                     std::vector<CommSample>& in_training) {
  std::vector<const spec::TraceEvent*> comm;
  for (const spec::TraceEvent& e : trace.events)
    if (spec::collective_of(e.op_class) && e.op_class != spec::OpClass::kSend && e.group_size > 1 &&
        !(skip_first && e.step == first))
      comm.push_back(&e);
  std::sort(comm.begin(), comm.end(), [](const spec::TraceEvent* a, const spec::TraceEvent* b) {
    return a->start_ps < b->start_ps;
  });
  using Key = std::tuple<std::string, int64_t, int64_t, int64_t, int, int64_t>;
  std::map<std::tuple<int64_t, std::string, int64_t, int64_t, int64_t, int>, int64_t> seen;
  // rank -> end of its previous collective or receive (a receive ties it to its sender's
  // timeline; the simulator's wait builds from there too: sim/engine.hpp)
  std::map<int64_t, Picoseconds> last_end;
  struct Arrivals {
    int64_t ranks = 0;
    std::vector<std::pair<Picoseconds, Picoseconds>> arrival_and_segment;
    const spec::TraceEvent* last = nullptr;  // the member that arrived last
  };
  std::map<Key, Arrivals> by_key;
  for (const spec::TraceEvent* e : comm) {
    const int64_t layer = e->layer.value_or(-1), mb = e->micro_batch.value_or(-1);
    const int phase = static_cast<int>(e->phase);
    const int64_t k = seen[{e->rank, e->name, e->step, mb, layer, phase}]++;
    Arrivals& a = by_key[{e->name, e->step, mb, layer, phase, k}];
    a.ranks = e->group_size;
    if (a.last == nullptr || e->start_ps >= a.last->start_ps) a.last = e;
    auto prev = last_end.find(e->rank);
    // A rank's first collective has no previous one in the trace: no segment to measure.
    a.arrival_and_segment.push_back(
        {e->start_ps, prev == last_end.end() ? -1 : e->start_ps - prev->second});
    last_end[e->rank] = e->start_ps + e->duration_ps;
  }
  std::vector<SyncSample> out;
  for (const auto& [key, a] : by_key) {
    if (static_cast<int64_t>(a.arrival_and_segment.size()) != a.ranks) continue;
    if (a.last->bytes > 0 && a.last->duration_ps > 0)
      in_training.push_back({*spec::collective_of(a.last->op_class), a.ranks, a.last->bytes,
                             ps_to_seconds(a.last->duration_ps), true});
    double mean = 0, segment = 0, last = 0;
    bool whole = true;
    for (const auto& [arrival, seg] : a.arrival_and_segment) {
      mean += ps_to_seconds(arrival);
      last = std::max(last, ps_to_seconds(arrival));
      segment += ps_to_seconds(seg);
      whole = whole && seg >= 0;
    }
    if (!whole) continue;
    const double n = static_cast<double>(a.ranks);
    if (segment / n <= 0) continue;
    out.push_back({source, a.ranks, last - mean / n, segment / n});
  }
  return out;
}

}  // namespace

Samples samples_from_trace(const spec::Trace& trace, const std::string& source) {
  Samples s;
  s.sources.push_back(source);
  const bool comm_bench = trace.metadata.is_object() && trace.metadata.value("bench", "") == "comm";
  std::set<int64_t> steps;
  for (const spec::TraceEvent& e : trace.events) steps.insert(e.step);
  const bool skip_first = steps.size() > 1;
  const int64_t first = steps.empty() ? 0 : *steps.begin();
  const double step_s = trace.kind == "measured" && trace.metadata.is_object()
                            ? trace.metadata.value("step_time_s", 0.0)
                            : 0.0;
  if (step_s > 0 && !comm_bench && !trace.events.empty()) {
    const double counted = static_cast<double>(skip_first ? steps.size() - 1 : steps.size());
    double busiest = 0;
    for (const auto& [rank, busy] : busy_per_rank(trace, skip_first, first, counted))
      busiest = std::max(busiest, busy);
    s.steps.push_back({source, step_s, std::min(busiest, step_s)});
    s.sync = sync_samples(trace, source, skip_first, first, s.comm);
  }
  const int64_t run_ranks =
      trace.metadata.is_object() && trace.metadata.value("ranks", spec::Json()).is_number_integer()
          ? std::max<int64_t>(1, trace.metadata.value("ranks", int64_t{1}))
          : 1;
  std::map<int64_t, Picoseconds> compute_by_rank;
  for (const spec::TraceEvent& e : trace.events)
    if (!spec::is_communication(e.op_class) && !(skip_first && e.step == first))
      compute_by_rank[e.rank] += e.duration_ps;
  int64_t critical = 0;
  Picoseconds most = -1;
  for (const auto& [rank, total] : compute_by_rank) {
    if (total > most) {
      most = total;
      critical = rank;
    }
  }
  for (const spec::TraceEvent& e : trace.events) {
    const double seconds = ps_to_seconds(e.duration_ps);
    if (seconds <= 0 || (skip_first && e.step == first)) continue;
    if (!spec::is_communication(e.op_class)) {
      if ((e.flops <= 0 && e.bytes <= 0) || e.rank != critical) continue;
      s.compute.push_back(
          {e.op_class, efficiency_key(e.name, e.phase), e.flops, e.bytes, seconds, run_ranks});
      continue;
    }
    std::optional<spec::CollectiveKind> kind = spec::collective_of(e.op_class);
    if (!kind || e.bytes <= 0 || e.group_size < 1) continue;
    // Benchmark traces here: in a training trace a member's time also holds its wait for the
    // others (sync_samples takes the last member's instead).
    if (!comm_bench) continue;
    s.comm.push_back({*kind, e.group_size, e.bytes, seconds});
  }
  return s;
}

}  // namespace sextant::traces
