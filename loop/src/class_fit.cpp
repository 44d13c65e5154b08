// Whole-step fitting against a profiler trace, class by class.
#include "sextant/loop/class_fit.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "sextant/models/op_id.hpp"
#include "sextant/sim/compute_model.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/sim/step_setup.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::loop {

namespace {

// Rounds of re-simulation: a class's time is its parameter's inverse plus fixed launch costs, so
// the ratio update converges in a few rounds (the launch share shrinks the step each time).
constexpr int kRounds = 6;

// The parameter of class `c` on a device: its name, the values to scale together (a curve's
// points; none: nothing prices the class) and the bound none of them may pass.
struct Parameter {
  std::string name;
  std::vector<double*> values;
  double bound = 1.0;
};

Parameter parameter_of(spec::DeviceSpec& d, spec::OpClass c, const sim::StepSetup& setup) {
  Parameter p;
  if (!sim::is_matrix_op(c)) {  // the memory-bound classes of profiled_classes()
    if (!d.memory_efficiency_by_class.count(c))
      d.memory_efficiency_by_class[c] = d.memory_efficiency_for(c);
    p.name =
        fmt::format("memory_efficiency_by_class.{}", spec::enum_name(spec::op_class_names(), c));
    p.values = {&d.memory_efficiency_by_class[c]};
  } else if (c == spec::OpClass::kGemm) {
    if (d.gemm_model) {
      p.name = "gemm_model.mainloop_efficiency";
      p.values = {&d.gemm_model->mainloop_efficiency};
    } else {
      p.name = "gemm_efficiency";
      for (spec::EfficiencyPoint& e : d.gemm_efficiency) p.values.push_back(&e.efficiency);
    }
  } else if (c == spec::OpClass::kAttention &&
             setup.stack.attention != spec::AttentionKernel::kUnfused) {
    const spec::AttentionKernel k =
        spec::attention_data_kernel(d.attention_kernels, setup.stack.attention);
    auto it = d.attention_kernels.find(k);
    if (it == d.attention_kernels.end()) return p;
    p.name =
        fmt::format("attention_kernels.{}", spec::enum_name(spec::attention_kernel_names(), k));
    for (spec::AttentionCurve& curve : it->second.curves)
      for (double& t : curve.tflops) p.values.push_back(&t);
    p.bound = d.peak_flops(setup.gemm_dtype) / kFlopsPerTflop;
  }
  return p;
}

}  // namespace

const std::vector<spec::OpClass>& profiled_classes() {
  static const std::vector<spec::OpClass> classes = {
      spec::OpClass::kGemm,     spec::OpClass::kAttention, spec::OpClass::kElementwise,
      spec::OpClass::kNorm,     spec::OpClass::kLoss,      spec::OpClass::kEmbedding,
      spec::OpClass::kOptimizer};
  return classes;
}

ClassTimes predicted_class_times(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                                 const spec::Plan& plan) {
  sim::SimulationOptions options;
  options.trace = true;
  sim::SimulationResult r = sim::simulate(model, cluster, plan, options);
  ClassTimes out;
  out.step_s = r.report.step_time_s;
  for (const spec::TraceEvent& e : r.trace->events) {
    if (e.rank != 0 || e.stream != spec::Stream::kCompute) continue;
    const bool core = e.name == models::op_name(models::OpId::kAttnCore) ||
                      e.name == models::op_name(models::OpId::kAttnCorePrep);
    const spec::OpClass c = core ? spec::OpClass::kAttention : e.op_class;
    out.seconds[c] += ps_to_seconds(e.duration_ps);
    out.busy_s += ps_to_seconds(e.duration_ps);
    ++out.ops[c];
  }
  return out;
}

ClassFit fit_classes(const traces::KernelTimes& measured, const std::string& source,
                     const spec::ModelSpec& model, const spec::Plan& plan,
                     const spec::ClusterSpec& base) {
  if (measured.steps <= 0)
    throw InputError(source, "/traceEvents", "",
                     "no Optimizer.step annotations: the step the kernels belong to is unknown "
                     "(profile whole training steps)");
  const double steps = static_cast<double>(measured.steps);
  ClassFit fit{base, {}, 0, 0, 0, {}};
  const sim::StepSetup setup = sim::step_setup(model, base, plan);
  std::map<spec::OpClass, double> target;
  for (spec::OpClass c : profiled_classes()) {
    auto it = measured.seconds.find(c);
    target[c] = it == measured.seconds.end() ? 0 : it->second / steps;
    fit.measured_step_s += target[c];
  }
  const ClassTimes before = predicted_class_times(model, base, plan);
  fit.before_step_s = before.busy_s;
  std::map<spec::OpClass, bool> capped;
  ClassTimes now = before;
  for (int round = 0; round < kRounds; ++round) {
    for (spec::OpClass c : profiled_classes()) {
      const double predicted = now.seconds.count(c) ? now.seconds.at(c) : 0;
      if (target[c] <= 0 || predicted <= 0) continue;
      Parameter p = parameter_of(fit.cluster.device, c, setup);
      if (p.values.empty()) continue;
      // Time ~ 1 / parameter: scale by predicted / measured, stopping at the bound.
      double scale = predicted / target[c];
      double largest = 0;
      for (const double* v : p.values) largest = std::max(largest, *v);
      if (largest * scale > p.bound) {
        scale = p.bound / largest;
        capped[c] = true;
      } else {
        capped[c] = false;
      }
      for (double* v : p.values) *v = std::max(1e-4, *v * scale);
    }
    now = predicted_class_times(model, fit.cluster, plan);
  }
  fit.after_step_s = now.busy_s;
  spec::ClusterSpec reference = base;
  for (spec::OpClass c : profiled_classes()) {
    ClassFitRow row;
    row.op_class = c;
    row.measured_s = target[c];
    row.before_s = before.seconds.count(c) ? before.seconds.at(c) : 0;
    row.after_s = now.seconds.count(c) ? now.seconds.at(c) : 0;
    row.measured_kernels =
        static_cast<double>(measured.counts.count(c) ? measured.counts.at(c) : 0) / steps;
    row.predicted_ops = now.ops.count(c) ? now.ops.at(c) : 0;
    Parameter after = parameter_of(fit.cluster.device, c, setup);
    Parameter was = parameter_of(reference.device, c, setup);
    if (!after.values.empty()) {
      row.parameter = after.name;
      row.value_before = *was.values[0];
      row.value_after = *after.values[0];
    }
    row.capped = capped.count(c) && capped.at(c);
    const std::string name(spec::enum_name(spec::op_class_names(), c));
    if (row.measured_s > 0 && row.before_s <= 0) {
      fit.notes.push_back(fmt::format(
          "{}: {:.2f} ms per step in {:.0f} kernels the model has no op for: not matched", name,
          1e3 * row.measured_s, row.measured_kernels));
    } else if (row.measured_s > 0 && row.parameter.empty()) {
      fit.notes.push_back(
          fmt::format("{}: no parameter prices it (unfused attention is priced "
                      "as GEMMs): not fitted",
                      name));
    } else if (row.capped) {
      fit.notes.push_back(fmt::format(
          "{}: {:.2f} ms measured, {:.2f} ms at the physical bound of {}: the trace's kernels do "
          "work the model does not have ({:.0f} kernels per step against {} modelled ops)",
          name, 1e3 * row.measured_s, 1e3 * row.after_s, row.parameter, row.measured_kernels,
          row.predicted_ops));
    } else if (row.measured_s > 0 && row.before_s > 1.5 * row.measured_s) {
      fit.notes.push_back(fmt::format(
          "{}: the model's time fell from {:.2f} to {:.2f} ms: its ops move more than the "
          "trace's {:.0f} kernels did",
          name, 1e3 * row.before_s, 1e3 * row.after_s, row.measured_kernels));
    } else if (row.measured_s > 0 && row.measured_s > 1.5 * row.before_s) {
      fit.notes.push_back(fmt::format(
          "{}: {:.0f} kernels per step against {} modelled ops took {:.1f}x the model's time: "
          "the stack runs it unfused or in more passes than the lowering has",
          name, row.measured_kernels, row.predicted_ops, row.measured_s / row.before_s));
    }
    fit.rows.push_back(row);
  }
  for (const auto& [c, seconds] : measured.seconds) {
    if (std::find(profiled_classes().begin(), profiled_classes().end(), c) ==
        profiled_classes().end())
      fit.notes.push_back(fmt::format("{} kernels ({:.2f} ms per step) are not part of the fit",
                                      spec::enum_name(spec::op_class_names(), c),
                                      1e3 * seconds / steps));
  }
  return fit;
}

std::string refusal(const ClassFit& fit) {
  if (std::abs(fit.after_step_s - fit.measured_step_s) <=
      std::abs(fit.before_step_s - fit.measured_step_s))
    return "";
  return fmt::format(
      "the profiled step is predicted worse after the fit ({:.2f} ms) than before "
      "({:.2f} ms; measured {:.2f} ms)",
      1e3 * fit.after_step_s, 1e3 * fit.before_step_s, 1e3 * fit.measured_step_s);
}

}  // namespace sextant::loop
