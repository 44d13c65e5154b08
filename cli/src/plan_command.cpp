// `sextant plan`: search every layout and write the best as a plan file; `sextant scale`: the best
// plan at each GPU count and what it costs to train a token budget.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "commands.hpp"
#include "fitted_output.hpp"
#include "format.hpp"
#include "progress_line.hpp"
#include "published_mfu.hpp"
#include "search_flags.hpp"
#include "sextant/loop/run_fit.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/planner/compression_crossover.hpp"
#include "sextant/planner/planner.hpp"
#include "sextant/planner/scaling.hpp"
#include "sextant/spec/build_info.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/host_cpu.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/traces/calibration.hpp"
#include "sextant/traces/compare.hpp"
#include "stack_options.hpp"
#include "validators.hpp"
#include "verify.hpp"

namespace sextant::cli {

namespace {

struct PlanFlagsAll {
  SearchFlags search;
  int64_t gpus = 0;
  int64_t top = 5;
  std::string out;
  int64_t verify = 0;
  int64_t verify_steps = 6;
  double verify_timeout = 300;
  std::string verify_dir = "sextant-verify";
  std::string calibrated_out;
  bool explain = false;
};

// The time-memory front: each plan with its step, cost and memory headroom.
spec::Json pareto_json(const std::vector<planner::RankedPlan>& front) {
  spec::Json out = spec::Json::array();
  for (const planner::RankedPlan& p : front)
    out.push_back(
        {{"name", p.plan.name()},
         {"plan", spec::to_json(p.plan)},
         {"step_time_s", p.report.step_time_s},
         {"gpu_seconds_per_step", p.report.step_time_s * static_cast<double>(p.report.gpus)},
         {"peak_memory_bytes", p.report.memory.peak_bytes},
         {"headroom_bytes", p.report.memory.headroom_bytes}});
  return out;
}

// What a rejection count counts (planner::SearchResult::rejected_units), "configurations" when
// not said.
std::string rejected_unit(const planner::SearchResult& r, const std::string& reason) {
  auto it = r.rejected_units.find(reason);
  return it == r.rejected_units.end() ? planner::kConfigurations : it->second;
}

// How the search narrowed the space, rule by rule (plan --explain).
void print_funnel(const planner::SearchResult& r) {
  fmt::print("\nsearch funnel:\n");
  fmt::print("  {:>10}  (dp, tp, pp) factorisations considered\n", r.considered);
  // The rules in the order the enumeration meets them; each counts the branch it cut once, in
  // the unit of its level (a layout refused is not split into the configurations it would have
  // held), so the counts of different levels do not add up.
  fmt::print("  pruned by the layout rules and --constraint, counted where each cut the tree:\n");
  for (const char* unit :
       {planner::kLayouts, planner::kMicroBatches, planner::kSchedules, planner::kZeroStages,
        planner::kSequenceSplits, planner::kConfigurations})
    for (const auto& [reason, count] : r.rejected)
      if (reason != planner::kDoesNotFit && rejected_unit(r, reason) == unit)
        fmt::print("  {:>10}    {}: {}\n", count, unit, reason);
  fmt::print("  {:>10}  legal plans, each estimated in closed form ({} on {} thread(s))\n",
             r.enumerated, human_seconds(r.estimate_s), r.threads);
  fmt::print(
      "  {:>10}    of them vary the stack's knobs (tunable: {})\n", r.stack_variants,
      r.stack.tunable.empty() ? "none" : fmt::format("{}", fmt::join(r.stack.tunable, ", ")));
  fmt::print("  {:>10}    of them recompute only the first layers of each chunk\n",
             r.partial_recompute);
  fmt::print("  {:>10}    do not fit in device memory\n", r.enumerated - r.fitting);
  fmt::print("  {:>10}  fit; the best estimates simulated event by event:\n", r.fitting);
  fmt::print("  {:>10}    simulated ({})\n", r.simulated, human_seconds(r.simulate_s));
}

void print_pareto(const planner::SearchResult& r) {
  if (r.pareto.size() < 2) {
    fmt::print("\n  the fastest simulated plan also needs the least memory of them\n");
    return;
  }
  fmt::print("\ntime vs memory (the simulated plans no other beats on both):\n");
  std::vector<std::string> names;
  for (const planner::RankedPlan& p : r.pareto) names.push_back(p.plan.name());
  const size_t width = name_column(names, 40);
  fmt::print("   {:<{}} {:>10} {:>10} {:>10}\n", "plan", width, "step", "memory", "headroom");
  for (const planner::RankedPlan& p : r.pareto)
    fmt::print("   {} {:>10} {:>10} {:>10}\n", name_cell(p.plan.name(), width, 3),
               human_seconds(p.report.step_time_s),
               human_bytes(static_cast<double>(p.report.memory.peak_bytes)),
               human_bytes(static_cast<double>(p.report.memory.headroom_bytes)));
}

// The ranked plans as a table of 100 columns: the time breakdown as percentages of the step in
// one compact cell, explained under the table.
void print_ranked(const planner::SearchResult& result, bool transformer) {
  std::vector<std::string> names;
  for (const planner::RankedPlan& p : result.ranked) {
    const std::string knobs = planner::tuned_knobs(result.stack, *p.plan.stack);
    names.push_back(knobs.empty() ? p.plan.name() : p.plan.name() + " " + knobs);
  }
  const size_t width = name_column(names, 36);
  fmt::print("\n{:>2} {:<{}} {:>9} {:>10} {:>6} {:>10}  {}\n", "#", "plan", width, "step",
             transformer ? "tokens/s" : "samples/s", "MFU", "memory", "time %");
  for (size_t i = 0; i < result.ranked.size(); ++i) {
    const spec::Report& r = result.ranked[i].report;
    const spec::TimeBreakdown& b = r.breakdown_s;
    auto pc = [&](double x) { return 100 * x / r.step_time_s; };
    fmt::print(
        "{:>2} {} {:>9} {:>10.0f} {:>5.1f}% {:>10}  "
        "{:.0f}/{:.0f},{:.0f},{:.0f},{:.0f}/{:.0f}/{:.0f}\n",
        i + 1, name_cell(names[i], width, 3), human_seconds(r.step_time_s), r.tokens_per_s,
        100 * r.mfu, human_bytes(static_cast<double>(r.memory.peak_bytes)),
        pc(b.compute + b.host_bound),
        pc(b.tp_comm_exposed + b.spatial_comm_exposed + b.cp_comm_exposed + b.ep_comm_exposed),
        pc(b.dp_comm_exposed), pc(b.pp_comm_exposed), pc(b.fsdp_comm_exposed), pc(b.bubble),
        pc(b.optimizer + b.offload_exposed));
  }
  fmt::print(
      "   time %: compute+host / exposed tp (+spatial, cp, ep), dp, pp, fsdp / bubble / "
      "optimizer+offload\n");
}

// Whether a CNN plan's convolutions could pay split per op (models/conv_split_bound.hpp).
void print_conv_bounds(const planner::OpSplitRefinement& r) {
  if (r.conv_bounds.empty()) return;
  const std::vector<std::string> could = models::could_pay(r.conv_bounds);
  const models::ConvSplitBound& c = models::closest_to_paying(r.conv_bounds);
  const std::string closest =
      fmt::format("closest {}: {} moved, {} saved a step", c.conv, human_bytes(c.least_moved_bytes),
                  human_bytes(c.most_saved_bytes));
  if (could.empty()) {
    fmt::print(
        "    convolutions: none of {} could pay split over the {} replicas (each would move more "
        "activation bytes than the gradient bytes it saves; {})\n",
        r.conv_bounds.size(), r.replicas, closest);
    return;
  }
  const size_t shown = std::min<size_t>(could.size(), 6);
  fmt::print(
      "    convolutions: {} of {} could pay split over the {} replicas, not searched: {}{} (at "
      "most {} less moved a step, which can shorten at most the {} of data-parallel exchange the "
      "step leaves exposed; {})\n",
      could.size(), r.conv_bounds.size(), r.replicas,
      fmt::join(could.begin(), could.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
      shown < could.size() ? ", ..." : "", human_bytes(models::most_net_saved_bytes(r.conv_bounds)),
      human_seconds(r.exposed_dp_s), closest);
}

spec::Json conv_bounds_json(const std::vector<models::ConvSplitBound>& bounds) {
  const models::ConvSplitBound& c = models::closest_to_paying(bounds);
  return {{"count", bounds.size()},
          {"could_pay", models::could_pay(bounds)},
          {"most_net_saved_bytes", models::most_net_saved_bytes(bounds)},
          {"closest",
           {{"conv", c.conv},
            {"least_moved_bytes", c.least_moved_bytes},
            {"most_saved_bytes", c.most_saved_bytes}}}};
}

// What `--per-op` changed in each plan it applies to, and why it pays.
void print_op_splits(const planner::SearchResult& result) {
  fmt::print("\nper-op splits (each op split its own way over the dp x tp mesh):\n");
  for (const planner::OpSplitRefinement& r : result.op_splits) {
    if (r.changes.empty()) {
      fmt::print("  {}: no split pays ({} estimates, {} simulations)\n", r.uniform, r.estimates,
                 r.simulations);
      print_conv_bounds(r);
      continue;
    }
    fmt::print("  {} {} -> {} {} ({:+.1f}%)\n", r.uniform, human_seconds(r.uniform_step_s),
               r.chosen, human_seconds(r.chosen_step_s),
               100 * (r.chosen_step_s / r.uniform_step_s - 1));
    for (const planner::OpSplitChange& c : r.changes)
      fmt::print("    {}: {} -> {}, step {} -> {}\n      {}\n", c.op, c.from, c.to,
                 human_seconds(c.step_before_s), human_seconds(c.step_after_s), c.why);
    print_conv_bounds(r);
  }
}

spec::Json op_splits_json(const planner::SearchResult& result) {
  spec::Json out = spec::Json::array();
  for (const planner::OpSplitRefinement& r : result.op_splits) {
    spec::Json changes = spec::Json::array();
    for (const planner::OpSplitChange& c : r.changes)
      changes.push_back({{"ops", c.op},
                         {"from", c.from},
                         {"to", c.to},
                         {"step_before_s", c.step_before_s},
                         {"step_after_s", c.step_after_s},
                         {"why", c.why}});
    out.push_back({{"uniform", r.uniform},
                   {"chosen", r.chosen},
                   {"uniform_step_s", r.uniform_step_s},
                   {"chosen_step_s", r.chosen_step_s},
                   {"estimates", r.estimates},
                   {"simulations", r.simulations},
                   {"changes", changes}});
    if (!r.conv_bounds.empty()) {
      out.back()["convolutions"] = conv_bounds_json(r.conv_bounds);
      out.back()["convolutions"]["exposed_dp_s"] = r.exposed_dp_s;
    }
  }
  return out;
}

std::string rejected_summary(const planner::SearchResult& r) {
  std::string s;
  for (const auto& [reason, count] : r.rejected) {
    if (!s.empty()) s += "; ";
    s += fmt::format("{} {}: {}", count, rejected_unit(r, reason), reason);
  }
  return s.empty() ? "none" : s;
}

// Runs the top plans for real; returns the measured best (the predicted best when none ran).
const planner::RankedPlan* run_verify(const PlanFlagsAll& f, const planner::SearchRequest& request,
                                      const std::vector<planner::RankedPlan>& ranked) {
  if (request.cluster.device.kind != spec::DeviceKind::kCpu) {
    throw InputError(
        "command line", "--verify", std::to_string(f.verify),
        fmt::format("trials run on this machine's CPU ranks; cluster {} describes GPUs "
                    "(verify on the GPU machine with a CUDA build)",
                    request.cluster.name));
  }
  // The trials' predictions are of this machine's runs: say when the file describes another CPU
  // (the trials still run; their calibration, --calibrated-out, makes a file for this one).
  if (const std::string why = spec::host_cpu_mismatch(request.cluster); !why.empty())
    fmt::print(stderr, "warning: {}\n", why);
  VerifyOptions vo;
  vo.model = f.search.model;
  vo.steps = f.verify_steps;
  vo.timeout_s = f.verify_timeout;
  vo.work_dir = f.verify_dir;
  if (!f.search.json)
    fmt::print("\nverifying the top {} plans on this machine ({} steps each)...\n", f.verify,
               f.verify_steps);
  std::vector<Trial> trials = verify(ranked, f.verify, vo);
  std::vector<double> predicted, measured;
  const planner::RankedPlan* best = &ranked.front();
  double best_measured = 0;
  std::vector<std::string> traces_for_fit;
  for (size_t i = 0; i < trials.size(); ++i) {
    const Trial& t = trials[i];
    if (!t.measured_s) continue;
    predicted.push_back(t.predicted_s);
    measured.push_back(*t.measured_s);
    traces_for_fit.push_back(t.trace_file);
    if (best_measured == 0 || *t.measured_s < best_measured) {
      best_measured = *t.measured_s;
      best = &ranked[i];
    }
  }
  if (!f.search.json) {
    fmt::print("{:>2} {:<44} {:>11} {:>11} {:>8}  {}\n", "#", "plan", "predicted", "measured",
               "error", "status");
    for (size_t i = 0; i < trials.size(); ++i) {
      const Trial& t = trials[i];
      fmt::print("{:>2} {:<44} {:>11} {:>11} {:>8}  {}\n", i + 1, t.plan.name(),
                 human_seconds(t.predicted_s), t.measured_s ? human_seconds(*t.measured_s) : "-",
                 t.measured_s ? fmt::format("{:+.1f}%",
                                            100 * (t.predicted_s - *t.measured_s) / *t.measured_s)
                              : "-",
                 t.status);
    }
    if (measured.size() > 1)
      fmt::print(
          "ranking: Kendall tau {:.2f}; the predicted best is {:.1f}% slower than the measured "
          "best ({})\n",
          traces::kendall_tau(predicted, measured), 100 * traces::regret(predicted, measured),
          best->plan.name());
  }
  if (!f.calibrated_out.empty() && !traces_for_fit.empty()) {
    std::vector<std::pair<std::string, spec::Trace>> runs;
    for (const std::string& t : traces_for_fit) runs.emplace_back(t, spec::read_trace_file(t));
    // The same fit, check and refusal as `sextant calibrate` (loop::fit_runs).
    const loop::RunFit fit = loop::fit_runs(request.cluster, runs, {});
    const traces::Calibration& c = fit.calibration;
    if (fit.refused.empty()) spec::write_json_file(f.calibrated_out, spec::to_json(c.cluster));
    if (!f.search.json) {
      if (fit.refused.empty()) {
        fmt::print(
            "calibrated {} from the trials' traces -> {} (compute error {:.0f}% -> {:.0f}%; "
            "trial steps {:.1f}% -> {:.1f}% mean |error|)\n",
            request.cluster.name, f.calibrated_out, 100 * c.report.compute_error_before,
            100 * c.report.compute_error_after, 100 * fit.check.mean_abs_error_before(),
            100 * fit.check.mean_abs_error_after());
      } else {
        fmt::print("not writing {}: {}\n", f.calibrated_out, fit.refused);
      }
      for (const std::string& w : loop::op_warnings(fit.check)) fmt::print("warning: {}\n", w);
    }
  }
  return best;
}

// Where each requested compression starts to pay (planner/compression_crossover.hpp), swept on
// the best ranked plan whose layout can compress its gradients. `plan` is null when none can.
struct CrossoverAnswer {
  const planner::RankedPlan* plan = nullptr;
  // The compression's label and its sweep, or why the layout cannot compress with it.
  std::vector<std::pair<std::string, planner::CompressionCrossover>> rows;
  std::vector<std::pair<std::string, std::string>> refused;
};

CrossoverAnswer compression_crossovers(const SearchFlags& f, const planner::SearchRequest& r,
                                       const planner::SearchResult& result,
                                       sim::Fidelity fidelity) {
  CrossoverAnswer a;
  if (r.compressions.empty()) return a;
  // Each row named as the user wrote it; a text the search tried several ways (SparCML without
  // an algorithm: spec::searched_compressions) names each in full. r.compressions is in order.
  std::vector<std::string> labels;
  for (const std::string& text : f.compressions) {
    const std::vector<spec::GradientCompression> tried =
        spec::searched_compressions(text, "--compression");
    for (const spec::GradientCompression& c : tried)
      labels.push_back(tried.size() == 1 ? text : spec::compression_text(c));
  }
  SEXTANT_CHECK(labels.size() == r.compressions.size(), "{} compressions for {} labels",
                r.compressions.size(), labels.size());
  for (const planner::RankedPlan& p : result.ranked)
    if (spec::compression_layout_problem(p.plan).empty()) {
      a.plan = &p;
      break;
    }
  if (!a.plan) return a;
  for (size_t i = 0; i < r.compressions.size(); ++i) {
    if (std::string why = spec::compression_problem(a.plan->plan, r.compressions[i]);
        !why.empty()) {
      a.refused.emplace_back(labels[i], why);
      continue;
    }
    a.rows.emplace_back(labels[i], planner::compression_crossover(r.model, r.cluster, a.plan->plan,
                                                                  r.compressions[i], fidelity));
  }
  return a;
}

spec::Json crossover_json(const CrossoverAnswer& a) {
  spec::Json rows = spec::Json::array();
  for (const auto& [text, c] : a.rows) {
    spec::Json row = {{"compression", text},
                      {"compressed_step_s", c.compressed_step_s},
                      {"uncompressed_step_s", c.uncompressed_step_s},
                      {"pays_below", c.pays_below},
                      {"pays_throughout", c.pays_throughout}};
    row["crossover_GBps"] = c.crossover_GBps ? spec::Json(*c.crossover_GBps) : spec::Json();
    rows.push_back(row);
  }
  for (const auto& [text, why] : a.refused)
    rows.push_back({{"compression", text}, {"refused", why}});
  spec::Plan layout = a.plan->plan;
  layout.compression = {};
  spec::Json j = {{"name", layout.name()}, {"plan", spec::to_json(layout)}, {"compressions", rows}};
  if (!a.rows.empty()) {
    const planner::CompressionCrossover& first = a.rows.front().second;
    j["level"] = first.level;
    j["cluster_GBps"] = first.cluster_GBps;
    j["swept_GBps"] = {first.lowest_GBps, first.highest_GBps};
  }
  return j;
}

void print_crossovers(const CrossoverAnswer& a) {
  if (!a.plan) {
    fmt::print(
        "\ncompression: none of the plans shown can compress its gradients (that needs DDP: "
        "zero 0, dp > 1, no spatial, cp or ep split); --constraint zero=0 or a larger --top "
        "shows one to sweep\n");
    return;
  }
  spec::Plan layout = a.plan->plan;
  layout.compression = {};
  if (a.rows.empty()) {
    fmt::print("\nwhen compression pays on {}:\n", layout.name());
  } else {
    const planner::CompressionCrossover& first = a.rows.front().second;
    fmt::print(
        "\nwhen compression pays on {} ({} links swept from {:.3g} to {:.3g} GB/s; this cluster: "
        "{:.3g} GB/s):\n",
        layout.name(), first.level, first.lowest_GBps, first.highest_GBps, first.cluster_GBps);
  }
  for (const auto& [text, c] : a.rows) {
    const std::string verdict =
        c.crossover_GBps
            ? fmt::format("pays {} {:.3g} GB/s", c.pays_below ? "below" : "above",
                          *c.crossover_GBps)
            : (c.pays_throughout ? "pays across the range" : "does not pay in the range");
    fmt::print("   {:<20} {:<26} here {:>9} against {:>9} uncompressed\n", text, verdict,
               human_seconds(c.compressed_step_s), human_seconds(c.uncompressed_step_s));
  }
  for (const auto& [text, why] : a.refused)
    fmt::print("   {:<20} not on this layout: {}\n", text, why);
}

int run_plan(const PlanFlagsAll& f) {
  planner::SearchRequest request = request_from(f.search, f.gpus);
  // The trials run on this machine's CPU ranks in fp32: rank only what they run.
  if (f.verify > 0) request.executor = spec::executor_run(spec::ExecutorBackend::kCpu);
  planner::SearchOptions options = options_from(f.search);
  options.top_k = f.top;
  planner::SearchResult result = planner::search(request, options);
  const CrossoverAnswer crossovers =
      compression_crossovers(f.search, request, result, options.fidelity);
  const int64_t seq = request.model.is_transformer()
                          ? request.seq_len.value_or(request.model.transformer().seq_len)
                          : 1;
  if (f.search.json) {
    spec::Json ranked = spec::Json::array();
    for (const planner::RankedPlan& p : result.ranked)
      ranked.push_back({{"plan", spec::to_json(p.plan)},
                        {"name", p.plan.name()},
                        {"tuned_knobs", planner::tuned_knobs(result.stack, *p.plan.stack)},
                        {"estimate_s", p.estimate_s},
                        {"report", spec::to_json(p.report)}});
    spec::Json j = {{"model", request.model.name},
                    {"cluster", request.cluster.name},
                    {"gpus", request.gpus},
                    {"global_batch", request.global_batch},
                    {"considered", result.considered},
                    {"enumerated", result.enumerated},
                    {"stack_variants", result.stack_variants},
                    {"partial_recompute", result.partial_recompute},
                    {"fitting", result.fitting},
                    {"simulated", result.simulated},
                    {"rejected", result.rejected},
                    {"rejected_units", result.rejected_units},
                    {"wall_s", result.wall_s},
                    {"phases_s",
                     {{"enumerate", result.enumerate_s},
                      {"estimate", result.estimate_s},
                      {"simulate", result.simulate_s}}},
                    {"threads", result.threads},
                    {"ranked", ranked},
                    {"pareto", pareto_json(result.pareto)}};
    if (crossovers.plan) j["compression_crossover"] = crossover_json(crossovers);
    if (!result.op_splits.empty()) j["op_splits"] = op_splits_json(result);
    if (result.ranked.empty()) {
      j["least_memory_bytes"] = result.least_memory_bytes;
      if (result.gpus_that_fit) j["gpus_that_fit"] = *result.gpus_that_fit;
    }
    std::cout << j.dump(2) << "\n";
  } else {
    fmt::print("{} on {} x {}, global batch {}{}\n", request.model.name, request.gpus,
               request.cluster.name, request.global_batch,
               request.model.is_transformer() ? fmt::format(", sequence {}", seq) : "");
    fmt::print("  {} legal plans, {} fit in memory; simulated the {} best estimates ({}) in {}\n",
               result.enumerated, result.fitting, result.simulated, f.search.network,
               human_seconds(result.wall_s));
    if (f.explain) {
      print_funnel(result);
    } else {
      fmt::print("  rejected: {}\n", rejected_summary(result));
    }
    if (!result.ranked.empty()) {
      print_ranked(result, request.model.is_transformer());
      const planner::RankedPlan& best = result.ranked.front();
      if (const std::string line = mfu_plausibility_line(
              best.report.mfu, best_published_mfu(request.cluster, best.plan, *best.plan.stack));
          !line.empty())
        fmt::print("\n{}", line);
      if (const spec::Plan& top = result.ranked.front().plan; !top.channel_algorithms.empty()) {
        std::map<std::string, int64_t> counts;
        for (spec::ChannelAlgorithm a : top.channel_algorithms)
          ++counts[std::string(spec::enum_name(spec::channel_algorithm_names(), a))];
        fmt::print(
            "\n  .chan: the convolutions after the stem run x/y/w {}/{}/{} (stationary-x, -y, -w), "
            "each chosen by simulated time over the byte rule's (the plan file lists them)\n",
            counts["x"], counts["y"], counts["w"]);
      }
      if (!result.op_splits.empty()) print_op_splits(result);
      print_pareto(result);
      if (!request.compressions.empty()) print_crossovers(crossovers);
    }
  }
  if (result.ranked.empty()) {
    std::string what = result.gpus_that_fit
                           ? fmt::format("with {} GPUs some layout fits", *result.gpus_that_fit)
                           : "no GPU count of this cluster fits this batch";
    fmt::print(stderr,
               "no plan fits: the least memory any layout needs is {} per device (capacity {}); "
               "{}. Try more GPUs, a smaller --global-batch, or full recompute and ZeRO.\n",
               human_bytes(static_cast<double>(result.least_memory_bytes)),
               human_bytes(static_cast<double>(request.cluster.device.memory_capacity_bytes)),
               what);
    return 1;
  }
  const planner::RankedPlan* best = &result.ranked.front();
  if (f.verify > 0) best = run_verify(f, request, result.ranked);
  if (best->plan.compression.any())
    fmt::print(stderr,
               "note: the best plan compresses its gradients ({}): its step time is predicted, "
               "what the compression costs in accuracy is not. With error feedback QSGD and "
               "1-bit usually train close to the uncompressed loss; check it on your model "
               "before a long run.\n",
               best->plan.name());
  if (!f.out.empty()) {
    spec::write_json_file(f.out, plan_file_json(*best, request));
    if (!f.search.json) fmt::print("\nbest plan written to {}\n", f.out);
  }
  return 0;
}

struct ScaleFlags {
  SearchFlags search;
  std::vector<int64_t> gpus;
  bool weak = false;
  double tokens = 0;
  double price = 0;
  std::string csv;
};

// For a CNN: from which GPU count on the best plan splits each sample (spatial grid or channel
// split) instead of adding replicas, and where data parallelism alone would stop (one sample per
// GPU): the strong-scaling limit of the mini-batch (Dryden et al., IPDPS'19).
void print_split_note(const spec::ModelSpec& model,
                      const std::vector<planner::ScalePoint>& points) {
  if (model.kind() != spec::ModelKind::kCnn) return;
  for (const planner::ScalePoint& p : points) {
    if (!p.best) continue;
    const spec::Plan& plan = p.best->plan;
    if (!plan.spatial.any() && plan.tp == 1) continue;
    fmt::print(
        "\nfrom {} GPUs the best plan splits each sample ({}{}) rather than adding replicas; "
        "data parallelism alone gives one sample per GPU at {} GPUs (global batch {}) and no "
        "more\n",
        p.gpus, plan.spatial.any() ? fmt::format("{} grid", spec::spatial_text(plan.spatial)) : "",
        plan.tp > 1 ? fmt::format("{}channels over tp {}", plan.spatial.any() ? ", " : "", plan.tp)
                    : "",
        p.global_batch, p.global_batch);
    return;
  }
}

int run_scale(const ScaleFlags& f) {
  planner::ScaleRequest request;
  request.base = request_from(f.search, f.gpus.front());
  request.gpu_counts = f.gpus;
  std::sort(request.gpu_counts.begin(), request.gpu_counts.end());
  request.weak = f.weak;
  if (f.tokens > 0) request.tokens = f.tokens;
  if (f.price > 0) request.price_per_gpu_hour = f.price;
  planner::SearchOptions options = options_from(f.search);
  options.top_k = 1;
  options.leaders = std::min<int64_t>(options.leaders, 8);
  std::vector<planner::ScalePoint> points = planner::scale(request, options);
  std::ostringstream csv;
  csv << "gpus,global_batch,plan,step_time_s,tokens_per_s,mfu,speedup,efficiency,train_time_s,"
         "gpu_hours,cost\n";
  spec::Json rows = spec::Json::array();
  for (const planner::ScalePoint& p : points) {
    spec::Json row = {{"gpus", p.gpus}, {"global_batch", p.global_batch}};
    if (p.best) {
      row["plan"] = p.best->plan.name();
      row["plan_json"] = spec::to_json(p.best->plan);
      row["step_time_s"] = p.best->report.step_time_s;
      row["tokens_per_s"] = p.tokens_per_s;
      row["mfu"] = p.best->report.mfu;
      row["speedup"] = p.speedup;
      row["efficiency"] = p.efficiency;
      if (p.train_time_s) row["train_time_s"] = *p.train_time_s;
      if (p.gpu_hours) row["gpu_hours"] = *p.gpu_hours;
      if (p.cost) row["cost"] = *p.cost;
      csv << fmt::format("{},{},{},{},{},{},{},{},{},{},{}\n", p.gpus, p.global_batch,
                         p.best->plan.name(), p.best->report.step_time_s, p.tokens_per_s,
                         p.best->report.mfu, p.speedup, p.efficiency,
                         p.train_time_s ? fmt::format("{}", *p.train_time_s) : "",
                         p.gpu_hours ? fmt::format("{}", *p.gpu_hours) : "",
                         p.cost ? fmt::format("{}", *p.cost) : "");
    } else {
      row["why_none"] = p.why_none;
      csv << fmt::format("{},{},,,,,,,,,\n", p.gpus, p.global_batch);
    }
    rows.push_back(row);
  }
  if (!f.csv.empty()) spec::write_file_atomically(f.csv, csv.str());
  if (f.search.json) {
    std::cout << spec::Json{{"model", request.base.model.name},
                            {"cluster", request.base.cluster.name},
                            {"weak_scaling", f.weak},
                            {"points", rows}}
                     .dump(2)
              << "\n";
    return 0;
  }
  fmt::print("{} on {}, global batch {}{}\n", request.base.model.name, request.base.cluster.name,
             request.base.global_batch, f.weak ? " per smallest count (weak scaling)" : "");
  // The name column takes what the other columns leave of 100.
  const size_t others = 51 + (request.tokens ? 22 : 0) + (request.price_per_gpu_hour ? 10 : 0);
  std::vector<std::string> names;
  for (const planner::ScalePoint& p : points)
    if (p.best) names.push_back(p.best->plan.name());
  const size_t width = name_column(names, std::max<size_t>(16, kOutputColumns - others));
  const bool transformer = request.base.model.is_transformer();
  fmt::print("{:>5} {:<{}} {:>9} {:>10} {:>6} {:>7} {:>4}", "gpus", "best plan", width, "step",
             transformer ? "tokens/s" : "samples/s", "MFU", "speedup", "eff");
  if (request.tokens) fmt::print(" {:>10} {:>10}", "train time", "GPU-hours");
  if (request.price_per_gpu_hour) fmt::print(" {:>9}", "cost");
  fmt::print("\n");
  for (const planner::ScalePoint& p : points) {
    if (!p.best) {
      fmt::print("{:>5} {}\n", p.gpus, p.why_none);
      continue;
    }
    fmt::print("{:>5} {} {:>9} {:>10.0f} {:>5.1f}% {:>6.2f}x {:>3.0f}%", p.gpus,
               name_cell(p.best->plan.name(), width, 6), human_seconds(p.best->report.step_time_s),
               p.tokens_per_s, 100 * p.best->report.mfu, p.speedup, 100 * p.efficiency);
    if (p.train_time_s)
      fmt::print(" {:>10} {:>10.0f}", human_seconds(*p.train_time_s), *p.gpu_hours);
    if (p.cost) fmt::print(" {:>9}", fmt::format("${:.0f}", *p.cost));
    fmt::print("\n");
  }
  print_split_note(request.base.model, points);
  return 0;
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto f = std::make_shared<PlanFlagsAll>();
  CLI::App* cmd = app.add_subcommand("plan", "Search every parallel layout and rank them");
  add_search_flags(*cmd, f->search);
  cmd->add_option("--gpus", f->gpus, "Number of GPUs")->required()->check(positive());
  cmd->add_option("--top", f->top, "How many plans to show")->check(positive());
  cmd->add_flag(
      "--explain", f->explain,
      "Say how many configurations each rule pruned, and what was estimated and simulated");
  cmd->add_option("--out", f->out, "Write the best plan (sextant.plan/1) to this file");
  cmd->add_option(
         "--verify", f->verify,
         "Run the top K plans for real on this machine's CPU ranks, keep the measured best")
      ->check(positive());
  cmd->add_option("--verify-steps", f->verify_steps, "Steps per trial")->check(positive());
  cmd->add_option("--verify-timeout", f->verify_timeout, "Seconds a trial may take")
      ->check(positive());
  cmd->add_option("--verify-dir", f->verify_dir, "Where the trials' plans, logs and traces go");
  cmd->add_option("--calibrated-out", f->calibrated_out,
                  "Calibrate the cluster from the trials' traces and write it here");
  cmd->callback([f] {
    int rc = run_plan(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });

  auto s = std::make_shared<ScaleFlags>();
  CLI::App* sc = app.add_subcommand("scale", "Best plan per GPU count: speedup, efficiency, cost");
  add_search_flags(*sc, s->search);
  sc->add_option("--gpus", s->gpus, "GPU counts, e.g. 8,16,32,64")
      ->required()
      ->delimiter(',')
      ->check(positive());
  sc->add_flag("--weak", s->weak, "Weak scaling: the global batch grows with the GPU count");
  // 1e16 tokens is 600x Llama 3's 15T: past that the time and cost mean nothing.
  sc->add_option("--tokens", s->tokens, "Token (or sample) budget to train")
      ->check(positive_at_most(1e16));
  sc->add_option("--price", s->price, "Price in USD per GPU-hour")->check(positive());
  sc->add_option("--csv", s->csv, "Also write the table as CSV");
  sc->callback([s] {
    int rc = run_scale(*s);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace sextant::cli
