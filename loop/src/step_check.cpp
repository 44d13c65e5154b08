// Re-simulating the measured runs a calibration was fitted on.
#include "sextant/loop/step_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/stack.hpp"

namespace sextant::loop {

namespace {

double mean_abs(const std::vector<StepCheckRow>& rows, double (StepCheckRow::*error)() const) {
  double sum = 0;
  for (const StepCheckRow& r : rows) sum += std::abs((r.*error)());
  return rows.empty() ? 0 : sum / static_cast<double>(rows.size());
}

// What the run was: the model (its full description when the trace carries one, else a zoo
// name), the plan with the executor's stack and dtype.
std::pair<spec::ModelSpec, spec::Plan> what_ran(const spec::Trace& trace,
                                                const std::string& source) {
  const spec::Json& meta = trace.metadata;
  if (!meta.contains("plan_json"))
    throw InputError(source, "/otherData/plan_json", "",
                     "missing: the trace does not say its plan");
  spec::ModelSpec model =
      meta.contains("model_json")
          ? spec::model_from_json(meta.at("model_json"), source + " /otherData/model_json")
          : models::resolve_model(meta.value("model", std::string()));
  spec::Plan plan = spec::plan_from_json(meta.at("plan_json"), source + " /otherData/plan_json");
  if (!plan.stack)
    plan.stack = spec::builtin_stack(meta.value("stack", std::string(spec::kExecutorStack)));
  if (!plan.dtype) {
    const std::string dtype = meta.value("dtype", std::string());
    if (auto d = spec::enum_from_name(spec::dtype_names(), dtype)) plan.dtype = *d;
  }
  return {std::move(model), std::move(plan)};
}

}  // namespace

double StepCheck::mean_abs_error_before() const {
  return mean_abs(rows, &StepCheckRow::error_before);
}
double StepCheck::mean_abs_error_after() const {
  return mean_abs(rows, &StepCheckRow::error_after);
}
double StepCheck::max_abs_error_after() const {
  double worst = 0;
  for (const StepCheckRow& r : rows) worst = std::max(worst, std::abs(r.error_after()));
  return worst;
}

StepCheck check_steps(const std::vector<std::pair<std::string, spec::Trace>>& traces,
                      const spec::ClusterSpec& before, const spec::ClusterSpec& after) {
  StepCheck check;
  // model + plan -> (first source, the trace, measured steps of its runs)
  struct Group {
    std::string source;
    const spec::Trace* trace = nullptr;
    std::vector<double> steps;
  };
  std::map<std::string, Group> groups;
  std::vector<std::string> order;
  for (const auto& [source, trace] : traces) {
    const double measured = trace.kind == "measured" && trace.metadata.is_object()
                                ? trace.metadata.value("step_time_s", 0.0)
                                : 0.0;
    if (measured <= 0 || trace.metadata.value("bench", "") != "") continue;
    const std::string key =
        trace.metadata.value("model", std::string()) + "|" +
        (trace.metadata.contains("plan_json") ? trace.metadata.at("plan_json").dump() : source);
    Group& g = groups[key];
    if (g.trace == nullptr) {
      g.source = source;
      g.trace = &trace;
      order.push_back(key);
    }
    g.steps.push_back(measured);
  }
  for (const std::string& key : order) {
    Group& g = groups[key];
    try {
      auto [model, plan] = what_ran(*g.trace, g.source);
      sim::SimulationOptions options;
      options.plan_source = g.source;
      StepCheckRow row;
      row.source = g.source;
      row.plan = g.trace->metadata.value("plan", plan.name());
      row.runs = static_cast<int64_t>(g.steps.size());
      std::sort(g.steps.begin(), g.steps.end());
      const size_t n = g.steps.size();
      row.measured_s = n % 2 == 1 ? g.steps[n / 2] : (g.steps[n / 2 - 1] + g.steps[n / 2]) / 2;
      row.before_s = sim::simulate(model, before, plan, options).report.step_time_s;
      options.trace = true;
      const sim::SimulationResult predicted = sim::simulate(model, after, plan, options);
      row.after_s = predicted.report.step_time_s;
      row.mismatched_ops = traces::op_mismatches(*g.trace, *predicted.trace);
      check.rows.push_back(row);
    } catch (const InputError& e) {
      check.skipped.push_back(fmt::format("{}: {}", g.source, e.what()));
    }
  }
  return check;
}

StepCheckRow check_logged_run(const LoggedRun& run, const spec::ClusterSpec& before,
                              const spec::ClusterSpec& after) {
  sim::SimulationOptions options;
  options.plan_source = run.source;
  StepCheckRow row;
  row.source = run.source;
  row.plan = run.plan.name();
  row.runs = 1;
  row.logged = true;
  row.measured_s = run.measured_s;
  row.before_s = sim::simulate(run.model, before, run.plan, options).report.step_time_s;
  row.after_s = sim::simulate(run.model, after, run.plan, options).report.step_time_s;
  return row;
}

std::vector<std::string> op_warnings(const StepCheck& check) {
  std::vector<std::string> out;
  for (const StepCheckRow& r : check.rows) {
    if (r.mismatched_ops.empty()) continue;
    std::string ops;
    for (const traces::OpMismatch& m : r.mismatched_ops)
      ops += fmt::format("{}{} ({}x measured, {}x predicted)", ops.empty() ? "" : ", ", m.name,
                         m.measured_count, m.predicted_count);
    out.push_back(fmt::format("{} ({}): the simulated step differs from the run in {}", r.plan,
                              r.source, ops));
  }
  return out;
}

std::string refusal(const StepCheck& check) {
  if (check.rows.empty() || check.mean_abs_error_after() <= check.mean_abs_error_before())
    return "";
  return fmt::format(
      "the fitted plans' steps are predicted worse after the fit ({:.1f}% mean |error|) than "
      "before ({:.1f}%)",
      100 * check.mean_abs_error_after(), 100 * check.mean_abs_error_before());
}

}  // namespace sextant::loop
