// Pipeline schedules as unit sequences.
#include "sextant/spec/pipeline_schedule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <mutex>
#include <utility>

#include "sextant/spec/error.hpp"
#include "sextant/spec/parameter_server.hpp"

namespace sextant::spec {

namespace {

// GEMS' units of every rank, from a run of the two replicas' 1F1B pipelines over the pp ranks
// with forwards of 1 and backwards of 2 time units: each rank starts, among its replicas' next
// forward and next backward, the one ready first (a backward on a tie, then replica A). A stage
// of either replica keeps at most pp - s micro-batches in flight, as 1F1B's stage s. A rank's
// sends leave in the order it makes them, each once the one before it was received (a send
// stream, rendezvous): so the orders run without a cycle of waits both with blocking receives
// and with in-order send and receive streams (the simulator's).
std::vector<std::vector<ScheduleUnit>> gems_orders(int64_t pp, int64_t m) {
  SEXTANT_CHECK(pp >= 2 && pp % 2 == 0 && m >= 2 && m % 2 == 0,
                "GEMS needs an even pp ({}) and micro-batch count ({})", pp, m);
  const int64_t half = m / 2;
  // Replica p's (0: A, 1: B) model stage on rank r, and the rank holding its stage s.
  auto stage_of = [&](int p, int64_t r) { return p == 0 ? r : pp - 1 - r; };
  auto rank_of = [&](int p, int64_t s) { return p == 0 ? s : pp - 1 - s; };
  constexpr double kNever = -1;
  // Per replica, stage and micro-batch: when its forward and backward ended.
  std::vector<double> fdone(static_cast<size_t>(2 * pp * half), kNever), bdone(fdone);
  auto at = [&](int p, int64_t s, int64_t i) {
    return static_cast<size_t>((p * pp + s) * half + i);
  };
  struct Send {  // what a rank sent, for whom: replica, receiving stage, micro-batch, pass
    int p;
    int64_t s, i;
    bool forward;
    bool operator==(const Send&) const = default;
  };
  std::vector<std::deque<Send>> sent(static_cast<size_t>(2 * pp));  // per replica and rank
  std::vector<std::vector<ScheduleUnit>> orders(static_cast<size_t>(pp));
  std::vector<double> free(static_cast<size_t>(pp), 0);
  // Per rank and replica: the next forward and backward micro-batch.
  std::vector<std::array<int64_t, 2>> next_f(static_cast<size_t>(pp), {0, 0}), next_b(next_f);
  for (int64_t left = 2 * 2 * pp * half; left > 0; --left) {
    double best_start = 0;
    int64_t best_rank = -1;
    int best_p = 0;
    bool best_forward = false;
    for (int64_t r = 0; r < pp; ++r) {
      const auto ru = static_cast<size_t>(r);
      for (bool forward : {false, true}) {
        for (int p : {0, 1}) {
          const int64_t s = stage_of(p, r);
          const int64_t i = forward ? next_f[ru][p] : next_b[ru][p];
          if (i >= half) continue;
          if (forward && next_f[ru][p] - next_b[ru][p] >= pp - s) continue;  // in flight
          // Its own forward first (a backward), and what its neighbour stage sent it.
          double ready = forward ? 0 : fdone[at(p, s, i)];
          const int64_t from = forward ? s - 1 : s + 1;
          if (from >= 0 && from < pp) {
            const double arrived = (forward ? fdone : bdone)[at(p, from, i)];
            const std::deque<Send>& queue = sent[static_cast<size_t>(p * pp + rank_of(p, from))];
            if (arrived == kNever || queue.empty() || !(queue.front() == Send{p, s, i, forward}))
              continue;
            ready = std::max(ready, arrived);
          }
          if (ready == kNever) continue;
          const double start = std::max(ready, free[ru]);
          if (best_rank < 0 || start < best_start) {
            best_start = start;
            best_rank = r;
            best_p = p;
            best_forward = forward;
          }
        }
      }
    }
    SEXTANT_CHECK(best_rank >= 0, "GEMS' schedule of pp {}, {} micro-batches stalled", pp, m);
    const auto ru = static_cast<size_t>(best_rank);
    const int64_t s = stage_of(best_p, best_rank);
    int64_t& i = best_forward ? next_f[ru][best_p] : next_b[ru][best_p];
    const double end = best_start + (best_forward ? 1.0 : 2.0);
    (best_forward ? fdone : bdone)[at(best_p, s, i)] = end;
    free[ru] = end;
    const int64_t from = best_forward ? s - 1 : s + 1;
    if (from >= 0 && from < pp)
      sent[static_cast<size_t>(best_p * pp + rank_of(best_p, from))].pop_front();
    const int64_t to = best_forward ? s + 1 : s - 1;
    if (to >= 0 && to < pp)
      sent[static_cast<size_t>(best_p * pp + best_rank)].push_back({best_p, to, i, best_forward});
    // Local chunk 0 holds the lower of the rank's two stages.
    const int64_t local = s == std::min(best_rank, pp - 1 - best_rank) ? 0 : 1;
    orders[ru].push_back({best_forward, best_p * half + i, local});
    ++i;
  }
  return orders;
}

}  // namespace

int64_t local_chunks(const Plan& plan) {
  return plan.schedule == Schedule::kGems ? 2 : plan.virtual_stages;
}

int64_t chunk_stage(const Plan& plan, int64_t rank, int64_t local) {
  if (plan.schedule != Schedule::kGems) return local * plan.pp + rank;
  const int64_t mirror = plan.pp - 1 - rank;
  return local == 0 ? std::min(rank, mirror) : std::max(rank, mirror);
}

int64_t model_chunks(const Plan& plan) {
  return plan.schedule == Schedule::kGems ? plan.pp : plan.chunks();
}

bool chunk_runs_up(const Plan& plan, int64_t rank, int64_t local) {
  return plan.schedule == Schedule::kGems && chunk_stage(plan, rank, local) != rank;
}

std::string gems_problem(const Plan& plan) {
  if (plan.schedule != Schedule::kGems) return "";
  if (plan.pp < 2 || plan.pp % 2 != 0)
    return fmt::format("runs a replica each way over an even number of stages: pp is {}", plan.pp);
  if (plan.micro_batches() % 2 != 0)
    return fmt::format(
        "splits each replica's micro-batches between its two pipelines: needs an "
        "even count, has {}",
        plan.micro_batches());
  if (plan.virtual_stages != 1) return "holds two stages a rank itself: virtual_stages 1";
  if (plan.zero != 0) return "sums each stage's gradients over a rank and its mirror: use zero 0";
  if (plan.offload.any()) return "is not modelled with offload";
  if (plan.sample_split() > 1 || plan.ep > 1 || plan.tp_grid.any() || !plan.per_op.empty())
    return "runs without context, spatial, expert or per-op parallelism and tensor grids";
  if (plan.compression.any() || plan.parameter_server.enabled)
    return "reduces its gradients uncompressed, without parameter servers";
  return "";
}

std::vector<ScheduleUnit> pipeline_schedule(Schedule schedule, int64_t pp, int64_t vpp, int64_t m,
                                            int64_t stage) {
  SEXTANT_CHECK(pp >= 1 && vpp >= 1 && m >= 1 && stage >= 0 && stage < pp, "bad schedule request");
  if (schedule == Schedule::kGems) {
    // Memoized: every rank asks for its part of one run, every step.
    static std::mutex mutex;
    static std::map<std::pair<int64_t, int64_t>, std::vector<std::vector<ScheduleUnit>>> cache;
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find({pp, m});
    if (it == cache.end()) it = cache.emplace(std::make_pair(pp, m), gems_orders(pp, m)).first;
    return it->second[static_cast<size_t>(stage)];
  }
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
