// The plan search.
#include "sextant/planner/planner.hpp"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <tuple>

#include "sextant/planner/channel_algorithms.hpp"
#include "sextant/planner/collective_algorithms.hpp"
#include "sextant/planner/estimator.hpp"
#include "sextant/planner/pareto.hpp"
#include "sextant/planner/worker_pool.hpp"
#include "sextant/spec/executor_support.hpp"

namespace sextant::planner {

namespace {

struct Scored {
  size_t index;
  Estimate estimate;
};

// The CPUs this process may run on (taskset, a Slurm or container CPU set), not the machine's:
// more threads than those only time-share them.
int thread_count(int requested) {
  if (requested > 0) return requested;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) return std::max(1, CPU_COUNT(&allowed));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// Estimates every plan, in parallel; each thread keeps its own estimator (and its caches).
std::vector<Estimate> estimate_all(const SearchRequest& request, const Enumeration& all,
                                   int threads,
                                   const std::function<void(int64_t, int64_t)>& progress) {
  const std::vector<Candidate>& plans = all.candidates;
  std::vector<Estimate> out(plans.size());
  std::atomic<size_t> next{0};
  // Threads take runs of plans that share a lowering (tp, its grid, micro-batch, sequence
  // parallelism), so that each thread's caches miss on the lowerings of its own runs only; the
  // stack variants of a layout stay next to each other (they share its memory estimate).
  std::vector<uint32_t> order(plans.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return std::tie(plans[a].tp, plans[a].grid, plans[a].micro_batch, plans[a].sequence_parallel) <
           std::tie(plans[b].tp, plans[b].grid, plans[b].micro_batch, plans[b].sequence_parallel);
  });
  constexpr size_t kRun = 1024;
  const size_t runs = (plans.size() + kRun - 1) / kRun;
  int64_t done = 0;
  std::mutex progress_mutex;
  auto work = [&] {
    Estimator estimator(request.model, request.cluster);
    spec::Plan plan;  // each candidate filled in here: no allocation per plan
    for (size_t r = next++; r < runs; r = next++) {
      const size_t end = std::min(plans.size(), (r + 1) * kRun);
      for (size_t k = r * kRun; k < end; ++k) {
        all.fill(order[k], plan);
        out[order[k]] = estimator.estimate(plan, all.stack_of(order[k]));
      }
      if (progress) {
        // Counted under the lock, so that the counts reported only grow.
        std::lock_guard<std::mutex> lock(progress_mutex);
        done += static_cast<int64_t>(end - r * kRun);
        progress(done, static_cast<int64_t>(plans.size()));
      }
    }
  };
  run_workers(threads, next, runs, work);
  return out;
}

// The candidates in their order, except that the first `leaders` hold at most `per_layout`
// variants of one layout (candidate but for its stack and recomputed layers) while others remain;
// the variants passed over follow, in order, should the layouts run out.
std::vector<Scored> spread_over_layouts(const Enumeration& all, std::vector<Scored> ranked,
                                        size_t leaders, int64_t per_layout) {
  auto layout = [&](size_t i) {
    const Candidate& c = all.candidates[i];
    return std::make_tuple(c.dp, c.tp, c.pp, c.micro_batch, c.virtual_stages, c.zero, c.schedule,
                           c.recompute, c.sequence_parallel, c.balanced);
  };
  std::map<decltype(layout(0)), int64_t> taken;
  std::vector<Scored> out, passed_over;
  out.reserve(ranked.size());
  for (const Scored& s : ranked) {
    if (out.size() < leaders && ++taken[layout(s.index)] > per_layout) {
      passed_over.push_back(s);
    } else {
      out.push_back(s);
    }
  }
  // Leaders first, then what was passed over, then the rest in their order.
  const auto head = out.begin() + static_cast<std::ptrdiff_t>(std::min(leaders, out.size()));
  std::vector<Scored> result(out.begin(), head);
  result.insert(result.end(), passed_over.begin(), passed_over.end());
  result.insert(result.end(), head, out.end());
  return result;
}

// Whether `a` ranks before `b` under the objective.
bool ranks_before(const spec::Report& a, const spec::Report& b, Objective o) {
  switch (o) {
    case Objective::kCost:
      // Cost of a step: GPU-seconds; at a fixed GPU count it orders plans as time does.
      if (a.step_time_s * static_cast<double>(a.gpus) !=
          b.step_time_s * static_cast<double>(b.gpus))
        return a.step_time_s * static_cast<double>(a.gpus) <
               b.step_time_s * static_cast<double>(b.gpus);
      break;
    case Objective::kMemory:
      if (a.memory.peak_bytes != b.memory.peak_bytes)
        return a.memory.peak_bytes < b.memory.peak_bytes;
      return a.step_time_s < b.step_time_s;
    case Objective::kTime:
      if (a.step_time_s != b.step_time_s) return a.step_time_s < b.step_time_s;
      break;
  }
  // As fast (variants whose knob changes nothing on this layout): the leaner first.
  return a.memory.peak_bytes < b.memory.peak_bytes;
}

}  // namespace

namespace {

// The ranked CNN plans with a channel split, their convolutions' algorithms chosen by simulated
// time (channel_algorithms.hpp: never slower than the byte rule's), in parallel; ranked again.
// Replaces each ranked plan `applies` to by `refine`'s choice (a plan and its simulation) where
// that fits, then ranks again; the time-memory front holds the plans refined and is a front again.
template <class Applies, class Refine>
void refine_ranked(const SearchOptions& options, int threads, SearchResult& result, Applies applies,
                   Refine refine) {
  std::vector<size_t> picked;
  for (size_t i = 0; i < result.ranked.size(); ++i)
    if (applies(result.ranked[i].plan)) picked.push_back(i);
  if (picked.empty()) return;
  std::vector<std::string> originals(picked.size());  // each refined plan as it was
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k = next++; k < picked.size(); k = next++) {
      RankedPlan& r = result.ranked[picked[k]];
      auto [plan, simulated] = refine(r.plan);
      if (simulated.report.memory.fits) {
        originals[k] = spec::to_json(r.plan).dump();
        r.plan = std::move(plan);
        r.report = std::move(simulated.report);
      }
    }
  };
  run_workers(std::min<int>(threads, static_cast<int>(picked.size())), next, picked.size(), work);
  for (RankedPlan& p : result.pareto) {
    const std::string before = spec::to_json(p.plan).dump();
    for (size_t k = 0; k < picked.size(); ++k)
      if (!originals[k].empty() && originals[k] == before) p = result.ranked[picked[k]];
  }
  result.pareto = pareto_front(result.pareto);
  std::stable_sort(result.ranked.begin(), result.ranked.end(),
                   [&](const RankedPlan& a, const RankedPlan& b) {
                     return ranks_before(a.report, b.report, options.objective);
                   });
}

void choose_channel_algorithms(const SearchRequest& request, const SearchOptions& options,
                               int threads, SearchResult& result) {
  if (request.model.kind() != spec::ModelKind::kCnn) return;
  sim::SimulationOptions so;
  so.fidelity = options.fidelity;
  refine_ranked(
      options, threads, result, [](const spec::Plan& p) { return p.tp > 1; },
      [&](const spec::Plan& p) {
        ChannelChoice c = planner::choose_channel_algorithms(request.model, request.cluster, p, so);
        return std::pair{std::move(c.plan), std::move(c.result)};
      });
}

void choose_collective_algorithms(const SearchRequest& request, const SearchOptions& options,
                                  int threads, SearchResult& result) {
  if (!names_collective_algorithms(request.cluster)) return;
  sim::SimulationOptions so;
  so.fidelity = options.fidelity;
  refine_ranked(
      options, threads, result, [](const spec::Plan&) { return true; },
      [&](const spec::Plan& p) {
        CollectiveChoice c =
            planner::choose_collective_algorithms(request.model, request.cluster, p, so);
        return std::pair{std::move(c.plan), std::move(c.result)};
      });
}

void choose_op_splits(const SearchRequest& request, const SearchOptions& options, int threads,
                      SearchResult& result) {
  sim::SimulationOptions so;
  so.fidelity = options.fidelity;
  std::mutex mutex;
  std::atomic<int64_t> reporting{-1};  // the one refinement whose moves the progress line follows
  std::atomic<int64_t> started{0};
  refine_ranked(
      options, threads, result,
      [&](const spec::Plan& p) {
        if (!splits_ops(request.model, p)) return false;
        // A search for plans the executor runs (tune, loop) splits ops where it runs them (on
        // CPU ranks in fp32), each move checked below.
        if (!request.executor) return true;
        spec::Plan probe = p;
        probe.per_op = {{"qkv", {}}};
        return spec::executor_problems(request.model, probe, *request.executor).empty();
      },
      [&](const spec::Plan& p) {
        const int64_t me = started++;
        int64_t none = -1;
        reporting.compare_exchange_strong(none, me);
        auto progress = [&](int64_t done, int64_t total) {
          if (options.op_split_progress && reporting.load() == me)
            options.op_split_progress(done, total);
        };
        std::function<bool(const spec::Plan&)> runs;
        // Each move keeps to the --constraint bounds on per-op splits and, for the executor,
        // to what it runs.
        runs = [&](const spec::Plan& trial) {
          for (const Constraint& k : request.constraints)
            if (!k.allows_splits(trial)) return false;
          return !request.executor ||
                 spec::executor_problems(request.model, trial, *request.executor).empty();
        };
        OpSplitChoice c =
            planner::choose_op_splits(request.model, request.cluster, p, so, 2, progress, runs);
        std::lock_guard<std::mutex> lock(mutex);
        const std::string knobs = tuned_knobs(result.stack, *p.stack);
        const std::string suffix = knobs.empty() ? "" : " " + knobs;
        result.op_splits.push_back({p.name() + suffix, c.plan.name() + suffix, c.uniform_step_s,
                                    c.result.report.step_time_s, std::move(c.changes), c.estimates,
                                    c.simulations, std::move(c.conv_bounds), p.dp,
                                    c.result.report.breakdown_s.dp_comm_exposed});
        return std::pair{std::move(c.plan), std::move(c.result)};
      });
  std::sort(result.op_splits.begin(), result.op_splits.end(),
            [](const OpSplitRefinement& a, const OpSplitRefinement& b) {
              // Ties (plans the search took to one step) in name order, whatever thread ran first.
              return std::tie(a.chosen_step_s, a.uniform) < std::tie(b.chosen_step_s, b.uniform);
            });
}

}  // namespace

SearchResult search(const SearchRequest& request, const SearchOptions& options) {
  auto start = std::chrono::steady_clock::now();
  SearchResult result;
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  Enumeration all = enumerate_plans(request);
  result.enumerate_s = since(start);
  if (all.candidates.empty()) {
    std::string reasons;
    for (const auto& [reason, count] : all.rejected)
      reasons += fmt::format("{}{} {}: {}", reasons.empty() ? "" : "; ", count,
                             all.rejected_units.at(reason), reason);
    throw InputError("request", "--global-batch", std::to_string(request.global_batch),
                     fmt::format("no legal layout of {} on {} GPUs ({})", request.model.name,
                                 request.gpus, reasons));
  }
  result.rejected = all.rejected;
  result.rejected_units = all.rejected_units;
  result.rejected_units.try_emplace(kDoesNotFit, kConfigurations);
  result.stack = all.stacks.front();
  result.considered = all.considered;
  result.enumerated = static_cast<int64_t>(all.size());
  for (const Candidate& c : all.candidates) {
    result.stack_variants += c.stack != 0 ? 1 : 0;
    result.partial_recompute += c.recompute_layers > 0 ? 1 : 0;
  }
  const int threads = thread_count(options.threads);
  result.threads = threads;
  const auto estimating = std::chrono::steady_clock::now();
  std::vector<Estimate> estimates = estimate_all(request, all, threads, options.estimate_progress);
  size_reload_windows(request, all, estimates);
  result.estimate_s = since(estimating);

  std::vector<Scored> fitting;
  result.least_memory_bytes = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < all.size(); ++i) {
    // The device memory a plan needs, of the plans whose offloaded state fits the host's.
    if (estimates[i].host_fits)
      result.least_memory_bytes =
          std::min(result.least_memory_bytes, estimates[i].peak_memory_bytes);
    if (estimates[i].fits) {
      fitting.push_back({i, estimates[i]});
    } else {
      result.rejected[kDoesNotFit] += 1;
    }
  }
  result.fitting = static_cast<int64_t>(fitting.size());
  if (fitting.empty()) {
    // Say what would fit: the smallest larger GPU count (doubling) at which some plan fits.
    for (int64_t g = request.gpus * 2; g <= request.cluster.total_devices(); g *= 2) {
      SearchRequest bigger = request;
      bigger.gpus = g;
      Enumeration e = enumerate_plans(bigger);
      Estimator estimator(request.model, request.cluster);
      bool any = false;
      spec::Plan p;
      for (size_t i = 0; i < e.size(); ++i) {
        e.fill(i, p);
        if (estimator.estimate(p, e.stack_of(i)).fits) {
          any = true;
          break;
        }
      }
      if (any) {
        result.gpus_that_fit = g;
        break;
      }
    }
    result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return result;
  }
  // Leaders by the objective's estimate: time (and cost, the same order), or memory.
  std::stable_sort(fitting.begin(), fitting.end(), [&](const Scored& a, const Scored& b) {
    if (options.objective == Objective::kMemory &&
        a.estimate.peak_memory_bytes != b.estimate.peak_memory_bytes)
      return a.estimate.peak_memory_bytes < b.estimate.peak_memory_bytes;
    return a.estimate.step_time_s < b.estimate.step_time_s;
  });
  size_t leaders = options.leaders > 0
                       ? std::min<size_t>(fitting.size(), static_cast<size_t>(options.leaders))
                       : fitting.size();
  leaders = std::max(leaders, std::min<size_t>(fitting.size(), static_cast<size_t>(options.top_k)));
  if (options.variants_per_layout > 0 && leaders < fitting.size())
    fitting = spread_over_layouts(all, std::move(fitting), leaders, options.variants_per_layout);

  // Simulate the leaders in parallel.
  const auto simulating = std::chrono::steady_clock::now();
  std::vector<RankedPlan> simulated(leaders);
  // One byte per leader: threads write their own (a std::vector<bool> packs neighbours' bits
  // into one byte, and two threads writing them race).
  std::vector<char> fits(leaders, 0);
  std::atomic<size_t> next{0};
  int64_t done = 0;
  std::mutex progress_mutex;
  auto work = [&] {
    for (size_t i = next++; i < leaders; i = next++) {
      const spec::Plan plan = all.plan(fitting[i].index);
      sim::SimulationOptions so;
      so.fidelity = options.fidelity;
      sim::SimulationResult r = sim::simulate(request.model, request.cluster, plan, so);
      simulated[i] = {plan, r.report, fitting[i].estimate.step_time_s};
      fits[i] = r.report.memory.fits ? 1 : 0;
      if (options.progress) {
        std::lock_guard<std::mutex> lock(progress_mutex);  // counted here: the counts only grow
        options.progress(++done, static_cast<int64_t>(leaders));
      }
    }
  };
  run_workers(std::min<int>(threads, static_cast<int>(leaders)), next, leaders, work);
  result.simulated = static_cast<int64_t>(leaders);
  result.simulate_s = since(simulating);

  for (size_t i = 0; i < leaders; ++i)
    if (fits[i]) result.ranked.push_back(std::move(simulated[i]));
  result.pareto = pareto_front(result.ranked);
  std::stable_sort(result.ranked.begin(), result.ranked.end(),
                   [&](const RankedPlan& a, const RankedPlan& b) {
                     return ranks_before(a.report, b.report, options.objective);
                   });
  if (static_cast<int64_t>(result.ranked.size()) > options.top_k)
    result.ranked.resize(static_cast<size_t>(options.top_k));
  if (options.choose_channel_algorithms)
    choose_channel_algorithms(request, options, threads, result);
  if (options.choose_collective_algorithms)
    choose_collective_algorithms(request, options, threads, result);
  if (options.choose_op_splits) choose_op_splits(request, options, threads, result);
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

// Each block ahead holds one more reloaded block: the memory grows with the window, so a bisection
// finds the widest that fits.
void size_reload_windows(const SearchRequest& request, Enumeration& all,
                         std::vector<Estimate>& estimates) {
  Estimator estimator(request.model, request.cluster);
  spec::Plan plan;
  for (size_t i = 0; i < all.size(); ++i) {
    Candidate& c = all.candidates[i];
    if (!c.reload_ahead || estimates[i].fits || !estimates[i].host_fits) continue;
    int64_t lo = 2, hi = std::min<int64_t>(c.recompute_layers - 1, 255), best = 0;
    Estimate fitted;
    while (lo <= hi) {
      const int64_t mid = (lo + hi) / 2;
      c.reload_window = static_cast<uint8_t>(mid);
      all.fill(i, plan);
      const Estimate e = estimator.estimate(plan, all.stack_of(i));
      if (e.fits) {
        best = mid;
        fitted = e;
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    c.reload_window = static_cast<uint8_t>(best);
    if (best > 0) estimates[i] = fitted;
  }
}

}  // namespace sextant::planner
