// `sextant calibrate`: fit a cluster file to measured traces; `sextant compare`: predicted
// against measured, per op class and collective.
#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "commands.hpp"
#include "compare_log.hpp"
#include "format.hpp"
#include "sextant/interop/training_log.hpp"
#include "sextant/loop/report_json.hpp"
#include "sextant/loop/run_fit.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/stack_support.hpp"
#include "sextant/traces/calibration.hpp"
#include "sextant/traces/compare.hpp"
#include "sextant/traces/moe_load.hpp"
#include "sextant/traces/readers.hpp"

namespace sextant::cli {

namespace {

using loop::class_fit_json;
using loop::mismatches_json;
using loop::rows_json;
using loop::step_check_json;

struct CalibrateFlags {
  std::string cluster;
  std::vector<std::string> traces, nccl_tests, kineto;
  std::string out;
  std::string dtype;
  std::string model, plan;  // what the --kineto traces and --log ran: the class fit, the check
  std::vector<std::string> logs;  // stack training logs: measured steps the fit is checked on
  std::string log_format;
  std::string model_out;  // the traced mixture of experts with its measured load imbalance
  bool force = false;
  bool json = false;
};

void print_step_check(const loop::StepCheck& check) {
  if (check.rows.empty()) return;
  fmt::print("  measured plans, step time (fitted on, or logged: the fit must hold on them):\n");
  fmt::print("    {:<30} {:>4} {:>10} {:>17} {:>17}\n", "plan", "runs", "measured", "before",
             "after");
  for (const loop::StepCheckRow& r : check.rows)
    fmt::print("    {:<30} {:>4} {:>10} {:>9} {:+6.1f}% {:>9} {:+6.1f}%\n",
               r.logged ? r.plan + " (log)" : r.plan, r.runs, human_seconds(r.measured_s),
               human_seconds(r.before_s), 100 * r.error_before(), human_seconds(r.after_s),
               100 * r.error_after());
  fmt::print("    mean |error| {:.1f}% before, {:.1f}% after (worst {:.1f}%)\n",
             100 * check.mean_abs_error_before(), 100 * check.mean_abs_error_after(),
             100 * check.max_abs_error_after());
  for (const std::string& s : check.skipped) fmt::print("    not checked: {}\n", s);
  for (const std::string& w : loop::op_warnings(check)) fmt::print("    warning: {}\n", w);
}

void print_class_fit(const loop::ClassFit& fit) {
  fmt::print(
      "  profiled step, per op class (kernel time per step; before: with the op-level fit "
      "alone):\n");
  fmt::print("    {:<12} {:>10} {:>10} {:>10} {:>8} {:>6}  {}\n", "class", "measured", "before",
             "after", "kernels", "ops", "parameter");
  for (const loop::ClassFitRow& r : fit.rows)
    fmt::print("    {:<12} {:>10} {:>10} {:>10} {:>8.0f} {:>6}  {} {:.4g} -> {:.4g}{}\n",
               spec::enum_name(spec::op_class_names(), r.op_class), human_seconds(r.measured_s),
               human_seconds(r.before_s), human_seconds(r.after_s), r.measured_kernels,
               r.predicted_ops, r.parameter.empty() ? "-" : r.parameter, r.value_before,
               r.value_after, r.capped ? " (capped)" : "");
  const double before = (fit.before_step_s - fit.measured_step_s) / fit.measured_step_s;
  const double after = (fit.after_step_s - fit.measured_step_s) / fit.measured_step_s;
  fmt::print(
      "    step: measured {} (GPU busy), predicted {} ({:+.1f}%) before, {} ({:+.1f}%) after\n",
      human_seconds(fit.measured_step_s), human_seconds(fit.before_step_s), 100 * before,
      human_seconds(fit.after_step_s), 100 * after);
  for (const std::string& n : fit.notes) fmt::print("    note: {}\n", n);
}

// The routing skew of the traced mixtures of experts (traces::moe_load_imbalance), over every
// trace that has one, and the model they ran (one model for all of them).
struct MoeMeasure {
  traces::MoeLoadMeasure load;
  spec::ModelSpec model;
  std::string source;  // the first trace measured
};
std::optional<MoeMeasure> measure_moe_load(
    const std::vector<std::pair<std::string, spec::Trace>>& runs) {
  std::optional<MoeMeasure> out;
  double sum = 0;
  for (const auto& [source, trace] : runs) {
    const std::optional<traces::MoeLoadMeasure> m = traces::moe_load_imbalance(trace, source);
    if (!m) continue;
    if (!trace.metadata.contains("model_json"))
      throw InputError(source, "/otherData/model_json", "",
                       "the model the run trained (traces of `sextant run --trace` carry it)");
    spec::ModelSpec model =
        spec::model_from_json(trace.metadata.at("model_json"), source + " /otherData/model_json");
    if (!out) {
      out = MoeMeasure{{}, std::move(model), source};
    } else if (spec::to_json(model) != spec::to_json(out->model)) {
      throw InputError(source, "/otherData/model_json", model.name,
                       fmt::format("the model of {} ({}): one model's load imbalance at a time",
                                   out->source, out->model.name));
    }
    sum += m->imbalance * static_cast<double>(m->dispatches);
    out->load.dispatches += m->dispatches;
    out->load.worst = std::max(out->load.worst, m->worst);
  }
  if (out) out->load.imbalance = sum / static_cast<double>(out->load.dispatches);
  return out;
}

// A stack's log as a measured step of `plan` (its stack: the plan's, else the cluster's
// default), read as `sextant compare --log` reads it.
loop::LoggedRun logged_run(const std::string& path, const std::string& format_name,
                           const spec::ModelSpec& model, spec::Plan plan,
                           const spec::ClusterSpec& cluster) {
  std::optional<interop::LogFormat> format;
  if (!format_name.empty()) {
    format = spec::enum_from_name(interop::log_format_names(), format_name);
    if (!format)
      throw InputError("command line", "--log-format", format_name,
                       "must be one of " + spec::enum_choices(interop::log_format_names()));
  }
  const interop::TrainingLog log =
      interop::read_training_log(spec::read_text_file(path), path, format);
  const bool gpu = cluster.device.kind == spec::DeviceKind::kGpu;
  if (!plan.stack) plan.stack = spec::plan_stack(plan, gpu, model.kind());
  const interop::StepSize size = interop::step_size(plan, model);
  const double measured =
      interop::measured_step_seconds(log, size.samples, size.tokens, size.devices, path);
  return loop::LoggedRun{path, model, std::move(plan), measured};
}

void run_calibrate(const CalibrateFlags& f) {
  spec::ClusterSpec base = spec::resolve_cluster(f.cluster);
  loop::RunFitOptions options;
  std::vector<std::pair<std::string, spec::Trace>> runs;
  for (const std::string& t : f.traces) runs.emplace_back(t, spec::read_trace_file(t));
  const std::optional<MoeMeasure> moe = measure_moe_load(runs);
  if (!f.model_out.empty() && !moe)
    throw InputError("command line", "--model-out", f.model_out,
                     "a --trace of a mixture of experts run with ep > 1 and without a capacity "
                     "(its dispatches' received rows)");
  if (!f.model.empty() != !f.plan.empty())
    throw InputError("command line", f.model.empty() ? "--model" : "--plan", "",
                     "--model and --plan go together: what the --kineto traces and --log ran");
  if (!f.model.empty() && f.kineto.empty() && f.logs.empty())
    throw InputError("command line", "--model", f.model,
                     "given with what it ran: --kineto traces (one per rank) or --log files");
  if (!f.logs.empty() && f.model.empty())
    throw InputError("command line", "--log", f.logs.front(),
                     "given with --model and --plan: what the logged run trained");
  for (const std::string& t : f.nccl_tests) options.extra.append(traces::read_nccl_tests(t));
  for (const std::string& t : f.kineto) options.extra.append(traces::read_kineto(t));
  spec::Dtype dtype =
      base.device.kind == spec::DeviceKind::kGpu ? spec::Dtype::kBf16 : spec::Dtype::kFp32;
  if (!f.dtype.empty()) {
    auto d = spec::enum_from_name(spec::dtype_names(), f.dtype);
    if (!d)
      throw InputError("command line", "--dtype", f.dtype,
                       "must be one of " + spec::enum_choices(spec::dtype_names()));
    dtype = *d;
  }
  options.dtype = dtype;
  if (!f.model.empty()) {
    const spec::ModelSpec model = models::resolve_model(f.model);
    const spec::Plan plan = spec::read_plan_file(f.plan);
    // Refused as `simulate` and `run` refuse it, naming the file.
    spec::validate_plan(plan, model, plan.world_size(), f.plan);
    if (!f.kineto.empty()) {
      std::vector<traces::KernelTimes> ranks;
      for (const std::string& k : f.kineto)
        ranks.push_back(traces::kernel_times(spec::read_json_file(k), k));
      options.profiled = loop::ProfiledStep{traces::merge_ranks(ranks), f.kineto[0], model, plan};
    }
    for (const std::string& log : f.logs)
      options.logged.push_back(logged_run(log, f.log_format, model, plan, base));
  }
  loop::RunFit result = loop::fit_runs(base, runs, options);
  traces::Calibration& c = result.calibration;
  const std::optional<loop::ClassFit>& class_fit = result.class_fit;
  const loop::StepCheck& check = result.check;
  const std::string& refused = result.refused;
  c.cluster = loop::fitted_cluster(result);
  if (refused.empty() || f.force) spec::write_json_file(f.out, spec::to_json(c.cluster));
  const traces::CalibrationReport& r = c.report;
  if (moe && !f.model_out.empty()) {
    spec::ModelSpec model = moe->model;
    model.transformer().moe->load_imbalance = moe->load.imbalance;
    spec::write_json_file(f.model_out, spec::to_json(model));
  }
  if (f.json) {
    spec::Json out{{"out", refused.empty() || f.force ? f.out : ""},
                   {"refused", refused},
                   {"calibrated_from", *c.cluster.calibrated_from},
                   {"step_check", step_check_json(check)}};
    if (class_fit) out["class_fit"] = class_fit_json(*class_fit);
    if (moe)
      out["moe_load"] = {{"imbalance", moe->load.imbalance},
                         {"worst", moe->load.worst},
                         {"dispatches", moe->load.dispatches},
                         {"model_out", f.model_out}};
    std::cout << out.dump(2) << "\n";
    if (!refused.empty() && !f.force) throw CLI::RuntimeError(1);
    return;
  }
  fmt::print("calibrated {} from {} compute ops and {} collectives -> {}\n", base.name,
             r.compute_samples, r.comm_samples, f.out);
  fmt::print(
      "  launch overhead {:.2f} us, memory efficiency {:.3f}, host time per step {:.2f} ms, "
      "compute jitter {:.3f}\n",
      r.launch_overhead_us, r.memory_efficiency, r.step_overhead_us * 1e-3, r.compute_jitter);
  fmt::print("  GEMM efficiency:");
  for (const spec::EfficiencyPoint& p : r.gemm_efficiency)
    fmt::print(" {:.1e}->{:.2f}", p.flops, p.efficiency);
  fmt::print("\n");
  if (r.compute_samples > 0)
    fmt::print(
        "  compute op times: error {:.1f}% before, {:.1f}% after (time-weighted mean |error|; "
        "RMS over ops {:.1f}% -> {:.1f}%)\n",
        100 * r.compute_time_error_before, 100 * r.compute_time_error_after,
        100 * r.compute_error_before, 100 * r.compute_error_after);
  for (const spec::CollectiveFit& fit : r.collective_fits)
    fmt::print(
        "  {:<15} on {:<14} alpha {:8.2f} us  beta {:.3e} us/B ({:.2f} GB/s)  R^2 {:.3f}  ({} "
        "samples)\n",
        fit.collective, fit.level, fit.alpha_us, fit.beta_us_per_byte, 1e-3 / fit.beta_us_per_byte,
        fit.r2, fit.samples);
  for (const std::string& n : r.notes) fmt::print("  note: {}\n", n);
  for (const std::string& w : r.warnings) fmt::print("  warning: {}\n", w);
  if (moe) {
    fmt::print(
        "  {}: load imbalance {:.3f} (the most loaded ep rank's routed rows over the mean, "
        "over {} dispatches; worst {:.3f}){}\n",
        moe->model.name, moe->load.imbalance, moe->load.dispatches, moe->load.worst,
        f.model_out.empty() ? "; --model-out writes the model with it"
                            : fmt::format(" -> {} (moe.load_imbalance)", f.model_out));
  }
  if (class_fit) print_class_fit(*class_fit);
  print_step_check(check);
  if (!refused.empty()) {
    if (f.force) {
      fmt::print("  warning: {}; written anyway (--force)\n", refused);
    } else {
      fmt::print(stderr, "sextant calibrate: {}: {} not written (--force writes it anyway)\n",
                 refused, f.out);
      throw CLI::RuntimeError(1);
    }
  }
}

struct CompareFlags {
  std::string measured, predicted;
  bool json = false;
  bool strict = false;
  CompareLogFlags log;  // --log: a stack's training log against the simulated step
};

void print_rows(const char* title, const std::vector<traces::Row>& rows) {
  if (rows.empty()) return;
  fmt::print("  {:<24} {:>12} {:>12} {:>8}\n", title, "measured", "predicted", "error");
  for (const traces::Row& r : rows)
    fmt::print("  {:<24} {:>12} {:>12} {:>7.1f}%\n", r.key, human_seconds(r.measured_s),
               human_seconds(r.predicted_s), 100 * r.error());
}

// Ops the two traces do not share (or share with other counts or sizes): the prediction and the
// run describe different programs there, and the time rows above hide it.
void print_mismatches(const std::vector<traces::OpMismatch>& ops) {
  if (ops.empty()) {
    fmt::print("ops: the same in both traces (count and bytes per rank, first step)\n");
    return;
  }
  size_t one_sided = 0;
  for (const traces::OpMismatch& o : ops) one_sided += o.one_sided() ? 1 : 0;
  fmt::print("ops that differ ({} on one side only, {} with other counts or sizes; first step):\n",
             one_sided, ops.size() - one_sided);
  fmt::print("  {:<24} {:>16} {:>16}\n", "op", "measured", "predicted");
  for (const traces::OpMismatch& o : ops)
    fmt::print("  {:<24} {:>16} {:>16}\n", o.name,
               fmt::format("{} x, {}", o.measured_count, human_bytes(o.measured_bytes)),
               fmt::format("{} x, {}", o.predicted_count, human_bytes(o.predicted_bytes)));
}

void run_compare(const CompareFlags& f) {
  if (!f.log.log.empty()) {
    if (!f.measured.empty() || !f.predicted.empty())
      throw InputError("command line", "--log", f.log.log,
                       "compares a log with a plan's simulated step: not with --measured and "
                       "--predicted traces");
    run_compare_log(f.log, f.json);
    return;
  }
  for (const auto& [flag, value] :
       {std::pair{"--measured", f.measured}, std::pair{"--predicted", f.predicted}})
    if (value.empty())
      throw InputError("command line", flag, "",
                       "missing: give --measured and --predicted "
                       "traces, or --log with the run's plan");
  spec::Trace m = spec::read_trace_file(f.measured);
  spec::Trace p = spec::read_trace_file(f.predicted);
  traces::Comparison c = traces::compare(m, p);
  if (f.strict && !c.mismatched_ops.empty()) {
    std::string names;
    for (const traces::OpMismatch& o : c.mismatched_ops)
      names += (names.empty() ? "" : ", ") + o.name;
    throw InputError(f.predicted, "", "",
                     fmt::format("--strict: {} op(s) differ from the measured trace {}: {}",
                                 c.mismatched_ops.size(), f.measured, names));
  }
  if (f.json) {
    std::cout << spec::Json{{"measured_step_s", c.measured_step_s},
                            {"predicted_step_s", c.predicted_step_s},
                            {"step_error", c.step_error()},
                            {"by_class", rows_json(c.by_class)},
                            {"by_collective", rows_json(c.by_collective)},
                            {"worst_ops", rows_json(c.worst_ops)},
                            {"mismatched_ops", mismatches_json(c.mismatched_ops)}}
                     .dump(2)
              << "\n";
    return;
  }
  fmt::print("step time: measured {}, predicted {} ({:+.1f}%)\n", human_seconds(c.measured_step_s),
             human_seconds(c.predicted_step_s), 100 * c.step_error());
  fmt::print("time per rank and step:\n");
  print_rows("op class", c.by_class);
  print_rows("collective", c.by_collective);
  print_rows("ops most off", c.worst_ops);
  print_mismatches(c.mismatched_ops);
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto f = std::make_shared<CalibrateFlags>();
  CLI::App* cmd = app.add_subcommand("calibrate", "Fit a cluster file to measured traces");
  cmd->add_option("--cluster", f->cluster, "Cluster to calibrate (name or file)")->required();
  cmd->add_option("--trace", f->traces, "Sextant traces (sextant run / bench --trace)");
  cmd->add_option("--nccl-tests", f->nccl_tests, "nccl-tests output ([kind:]file)");
  cmd->add_option("--kineto", f->kineto,
                  "PyTorch profiler traces (record_shapes=True); with --model and --plan one per "
                  "rank of the profiled run");
  cmd->add_option("--log", f->logs,
                  "Training logs of Megatron-LM, NeMo, TorchTitan or DeepSpeed of the run --model "
                  "and --plan describe: checked, not fitted on");
  cmd->add_option("--log-format", f->log_format,
                  "megatron, nemo, torchtitan or deepspeed (default: detected)");
  cmd->add_option("--out", f->out, "Calibrated cluster file to write")->required();
  cmd->add_option("--dtype", f->dtype,
                  "Precision the measured ops ran in (default: bf16 GPU, fp32 CPU)");
  cmd->add_option("--model", f->model,
                  "Model the --kineto traces and --log run trained (name or file): fits each op "
                  "class's time per step against the traces' kernels (needs --plan)");
  cmd->add_option("--plan", f->plan, "Plan file of that run (batch, stack with its knobs, dtype)");
  cmd->add_option("--model-out", f->model_out,
                  "Write the traced mixture of experts with moe.load_imbalance set to the "
                  "routing skew its --trace measured (ep > 1, no capacity)");
  cmd->add_flag("--force", f->force,
                "Write the calibrated file even when it predicts the fitted runs worse");
  cmd->add_flag("--json", f->json, "Print JSON");
  cmd->callback([f] { run_calibrate(*f); });

  auto c = std::make_shared<CompareFlags>();
  CLI::App* cmp =
      app.add_subcommand("compare",
                         "Predicted against measured: traces per op class and collective, or a "
                         "stack's training log (--log) against the plan's simulated step");
  cmp->add_option("--measured", c->measured, "Measured trace (sextant run --trace)");
  cmp->add_option("--predicted", c->predicted, "Predicted trace (sextant simulate --trace)");
  add_compare_log_flags(*cmp, c->log);
  cmp->add_flag("--strict", c->strict,
                "Fail (exit 2) when an op is on one side only or differs in count or bytes");
  cmp->add_flag("--json", c->json, "Print JSON");
  cmp->callback([c] { run_compare(*c); });
}

}  // namespace sextant::cli
