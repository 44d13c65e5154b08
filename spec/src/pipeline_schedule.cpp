// Pipeline schedules as unit sequences.
#include "sextant/spec/pipeline_schedule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "sextant/spec/error.hpp"
#include "sextant/spec/parameter_server.hpp"

namespace sextant::spec {

std::vector<ScheduleUnit> pipeline_schedule(Schedule schedule, int64_t pp, int64_t vpp, int64_t m,
                                            int64_t stage) {
  SEXTANT_CHECK(pp >= 1 && vpp >= 1 && m >= 1 && stage >= 0 && stage < pp, "bad schedule request");
  std::vector<ScheduleUnit> units;
  if (pp == 1 && vpp == 1) {
    // No pipeline: gradient accumulation, each micro-batch forward then backward.
    for (int64_t i = 0; i < m; ++i) {
      units.push_back({true, i, 0});
      units.push_back({false, i, 0});
    }
    return units;
  }
  if (schedule == Schedule::kGpipe && vpp == 1) {
    for (int64_t i = 0; i < m; ++i) units.push_back({true, i, 0});
    for (int64_t i = 0; i < m; ++i) units.push_back({false, i, 0});
    return units;
  }
  if (vpp == 1) {
    // 1F1B (and one batch of PipeDream-2BW): warm up with pp - stage - 1 forwards, alternate, then
    // drain the backwards.
    int64_t warmup = std::min(pp - stage - 1, m);
    for (int64_t i = 0; i < warmup; ++i) units.push_back({true, i, 0});
    for (int64_t i = 0; i < m - warmup; ++i) {
      units.push_back({true, warmup + i, 0});
      units.push_back({false, i, 0});
    }
    for (int64_t i = m - warmup; i < m; ++i) units.push_back({false, i, 0});
    return units;
  }
  // Interleaved 1F1B (Megatron-LM forward_backward_pipelining_with_interleaving): micro-batches
  // go through the chunks in groups of pp.
  SEXTANT_CHECK(m % pp == 0, "interleaving needs micro-batches ({}) divisible by pp ({})", m, pp);
  const int64_t total = m * vpp;
  int64_t warmup = m == pp ? total : std::min((pp - stage - 1) * 2 + (vpp - 1) * pp, total);
  auto unit = [&](int64_t k, bool forward) {
    int64_t in_group = k % (pp * vpp);
    int64_t chunk = in_group / pp;
    if (!forward) chunk = vpp - 1 - chunk;
    return ScheduleUnit{forward, (k / (pp * vpp)) * pp + k % pp, chunk};
  };
  for (int64_t k = 0; k < warmup; ++k) units.push_back(unit(k, true));
  for (int64_t i = 0; i < total - warmup; ++i) {
    units.push_back(unit(warmup + i, true));
    units.push_back(unit(i, false));
  }
  for (int64_t k = total - warmup; k < total; ++k) units.push_back(unit(k, false));
  return units;
}

std::vector<ScheduleUnit> pipedream_2bw_units(int64_t pp, int64_t m, int64_t batches,
                                              int64_t stage) {
  SEXTANT_CHECK(batches >= 1, "bad PipeDream-2BW window of {} batches", batches);
  // No flush: the batches' micro-batches are one 1F1B stream.
  return pipeline_schedule(Schedule::k1F1B, pp, 1, m * batches, stage);
}

int64_t pipedream_2bw_version(int64_t batch) {
  return batch >= 1 ? batch - 1 : 0;
}

std::string pipedream_2bw_problem(const Plan& plan) {
  if (plan.schedule != Schedule::kPipeDream2BW) return "";
  if (plan.micro_batches() < plan.pp)
    return fmt::format(
        "needs at least pp ({}) micro-batches per replica, has {}: with fewer a stage would need "
        "more than two weight versions (PipeDream-2BW's m >= d)",
        plan.pp, plan.micro_batches());
  if (plan.zero == 3)
    return "stashes a whole second weight version, which ZeRO-3 shards: use zero <= 1";
  if (plan.offload.any()) return "is not modelled with offload";
  return "";
}

int64_t pipedream_version(int64_t batch, int64_t pp, int64_t stage) {
  return std::max<int64_t>(0, batch - (pp - 1 - stage));
}

std::string pipedream_problem(const Plan& plan) {
  if (plan.schedule != Schedule::kPipeDream) return "";
  if (plan.micro_batches() != 1)
    return fmt::format(
        "updates after every batch of one micro-batch per replica (PipeDream's minibatch), has "
        "{}: use global_batch = dp x micro_batch",
        plan.micro_batches());
  if (plan.zero != 0) return "stashes whole weight versions and updates every batch: use zero 0";
  if (plan.offload.any()) return "is not modelled with offload";
  return "";
}

int64_t asynchronous_window(const Plan& plan) {
  if (plan.parameter_server.enabled) return parameter_server_window(plan);
  if (plan.schedule == Schedule::kPipeDream2BW) return kPipeDream2BWWindow;
  if (plan.schedule == Schedule::kPipeDream) return plan.pp + 1;
  return 1;
}

int64_t peak_in_flight(const std::vector<ScheduleUnit>& units) {
  int64_t live = 0;
  int64_t peak = 0;
  for (const ScheduleUnit& u : units) {
    live += u.forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

namespace {

// The moments (flat, `chunks` counts each) that no other moment covers in every chunk: their dot
// product with non-negative bytes can never be the largest. Scanned by decreasing total, a moment
// can only be covered by one already kept, so the work is moments x kept.
std::vector<std::vector<int64_t>> undominated(const std::vector<int64_t>& flat, size_t chunks) {
  const size_t n = flat.size() / chunks;
  std::vector<int64_t> total(n, 0);
  for (size_t i = 0; i < n; ++i)
    for (size_t c = 0; c < chunks; ++c) total[i] += flat[i * chunks + c];
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return total[a] > total[b]; });
  std::vector<std::vector<int64_t>> kept;
  for (size_t i : order) {
    const int64_t* a = &flat[i * chunks];
    bool covered = false;
    for (const std::vector<int64_t>& k : kept) {
      bool ge = true;
      for (size_t c = 0; c < chunks && ge; ++c) ge = k[c] >= a[c];
      if (ge) {
        covered = true;
        break;
      }
    }
    if (!covered) kept.emplace_back(a, a + chunks);
  }
  return kept;
}

}  // namespace

LiveProfile live_profile(Schedule schedule, int64_t pp, int64_t vpp, int64_t m, int64_t stage) {
  // PipeDream's batches stream through without a flush: in steady state a stage holds what
  // pp batches of 1F1B hold (pp - stage in flight), however few micro-batches one batch has.
  if (schedule == Schedule::kPipeDream) m = std::max(m, pp);
  const auto chunks = static_cast<size_t>(vpp);
  if (chunks == 1) {
    // One chunk: every moment is covered by the one with the most live micro-batches, so the
    // profile is the two maxima (what undominated() keeps, without the lists a planner paid for
    // once per stage of every schedule it scored).
    int64_t live = 0, after_forward = 0, during_backward = -1;
    for (const ScheduleUnit& u : pipeline_schedule(schedule, pp, vpp, m, stage)) {
      if (u.forward) {
        after_forward = std::max(after_forward, ++live);
      } else {
        during_backward = std::max(during_backward, live--);
      }
    }
    LiveProfile out{{{after_forward}}, {}};
    if (during_backward >= 0) out.during_backward.push_back({during_backward});
    return out;
  }
  std::vector<int64_t> live(chunks, 0);
  std::vector<int64_t> forward, backward;  // moments, flat
  for (const ScheduleUnit& u : pipeline_schedule(schedule, pp, vpp, m, stage)) {
    int64_t& chunk = live[static_cast<size_t>(u.chunk)];
    if (u.forward) {
      ++chunk;
      forward.insert(forward.end(), live.begin(), live.end());
    } else {
      backward.insert(backward.end(), live.begin(), live.end());
      --chunk;
    }
  }
  return {undominated(forward, chunks), undominated(backward, chunks)};
}

std::shared_ptr<const PipelineSweep::StageUnits> PipelineSweep::units(Schedule schedule, int64_t pp,
                                                                      int64_t v, int64_t m) {
  auto out = std::make_shared<StageUnits>(static_cast<size_t>(pp));
  for (int64_t s = 0; s < pp; ++s)
    (*out)[static_cast<size_t>(s)] = pipeline_schedule(schedule, pp, v, m, s);
  return out;
}

PipelineSweep::PipelineSweep(Schedule schedule, int64_t pp, int64_t v, int64_t m,
                             std::vector<std::vector<double>> forward,
                             std::vector<std::vector<double>> backward, double p2p, bool blocking)
    : PipelineSweep(units(schedule, pp, v, m), pp, v, m, std::move(forward), std::move(backward),
                    p2p, blocking) {}

PipelineSweep::PipelineSweep(std::shared_ptr<const StageUnits> units, int64_t pp, int64_t v,
                             int64_t m, std::vector<std::vector<double>> forward,
                             std::vector<std::vector<double>> backward, double p2p, bool blocking)
    : pp_(pp),
      chunks_(pp * v),
      m_(m),
      p2p_(p2p),
      blocking_(blocking),
      forward_(std::move(forward)),
      backward_(std::move(backward)),
      units_(std::move(units)),
      drain_start_(static_cast<size_t>(pp)) {
  for (int64_t s = 0; s < pp; ++s) {
    const auto& mine = (*units_)[static_cast<size_t>(s)];
    size_t& start = drain_start_[static_cast<size_t>(s)];
    start = mine.size();
    for (size_t i = 0; i < mine.size(); ++i) {
      if (!mine[i].forward && mine[i].micro_batch == m - 1) {
        start = i;
        break;
      }
    }
  }
  prefix_.fdone.assign(static_cast<size_t>(chunks_ * m), kUnknown);
  prefix_.bdone.assign(static_cast<size_t>(chunks_ * m), kUnknown);
  prefix_.next.assign(static_cast<size_t>(pp), 0);
  prefix_.free.assign(static_cast<size_t>(pp), 0);
  prefix_.compute_end.assign(static_cast<size_t>(pp), 0);
  sweep(prefix_, nullptr, /*prefix_only=*/true);
}

// Units are taken stage by stage as their inputs become known: O(units) passes at most.
void PipelineSweep::sweep(State& st, std::vector<DrainStream>* drains, bool prefix_only) const {
  // The stages are visited up and down by turns: a chain of forwards (down the stages) or of
  // backwards (up them) then resolves in one round, not one round per stage. The times do not
  // depend on the order (each unit waits for what it waits for).
  for (bool progressed = true, up = true; progressed; up = !up) {
    progressed = false;
    for (int64_t k = 0; k < pp_; ++k) {
      const int64_t s = up ? k : pp_ - 1 - k;
      const auto si = static_cast<size_t>(s);
      auto& i = st.next[si];
      const auto& mine = (*units_)[si];
      const size_t stop = prefix_only ? drain_start_[si] : mine.size();
      while (i < stop) {
        const ScheduleUnit& u = mine[i];
        const int64_t g = u.chunk * pp_ + s;
        const auto at = [&](int64_t chunk) {
          return static_cast<size_t>(chunk * m_ + u.micro_batch);
        };
        double ready = 0;
        if (u.forward && g > 0) {
          if (st.fdone[at(g - 1)] == kUnknown) break;
          ready = st.fdone[at(g - 1)] + p2p_;
        } else if (!u.forward && g + 1 < chunks_) {
          if (st.bdone[at(g + 1)] == kUnknown) break;
          ready = st.bdone[at(g + 1)] + p2p_;
        } else if (!u.forward) {
          ready = st.fdone[at(g)];
        }
        const double start = std::max(st.free[si], ready);
        const double end = drains && !u.forward && i >= drain_start_[si]
                               ? (*drains)[si].pass(start)
                               : start + (u.forward ? forward_[si][static_cast<size_t>(u.chunk)]
                                                    : backward_[si][static_cast<size_t>(u.chunk)]);
        (u.forward ? st.fdone : st.bdone)[at(g)] = end;
        st.compute_end[si] = end;
        const bool sends = u.forward ? g + 1 < chunks_ : g > 0;
        st.free[si] = end + (blocking_ && sends ? p2p_ : 0);
        ++i;
        progressed = true;
      }
    }
  }
}

double PipelineSweep::makespan(const PipelineDrain* drain, std::span<double> stage_ends) const {
  // The state and the streams in buffers this thread reuses (a search calls this millions of
  // times: copying into fresh vectors was a third of its cost).
  thread_local State st;
  thread_local std::vector<DrainStream> drains;
  st = prefix_;  // (copy-assigned vectors keep their storage)
  drains.clear();
  if (drain)
    for (const StageDrain& d : drain->stages) drains.emplace_back(d);
  sweep(st, drain ? &drains : nullptr, /*prefix_only=*/false);
  double makespan = 0;
  for (int64_t s = 0; s < pp_; ++s) {
    const auto si = static_cast<size_t>(s);
    // The reduction runs on from where the stage's last pass (its last unit) ended.
    const double end = std::max(st.free[si], drain ? drains[si].finish(st.compute_end[si]) : 0.0);
    if (!stage_ends.empty()) stage_ends[si] = end;
    makespan = std::max(makespan, end);
  }
  return makespan;
}

double pipeline_makespan(Schedule schedule, int64_t pp, int64_t v, int64_t m,
                         const std::vector<std::vector<double>>& forward,
                         const std::vector<std::vector<double>>& backward, double p2p,
                         bool blocking, const PipelineDrain* drain) {
  return PipelineSweep(schedule, pp, v, m, forward, backward, p2p, blocking).makespan(drain);
}

}  // namespace sextant::spec
