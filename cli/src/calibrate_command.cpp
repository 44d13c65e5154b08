// `sextant calibrate`: fit a cluster file to measured traces; `sextant compare`: predicted
// against measured, per op class and collective.
#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "commands.hpp"
#include "format.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/traces/calibration.hpp"
#include "sextant/traces/compare.hpp"
#include "sextant/traces/readers.hpp"

namespace sextant::cli {

namespace {

struct CalibrateFlags {
  std::string cluster;
  std::vector<std::string> traces, nccl_tests, kineto;
  std::string out;
  std::string dtype;
  bool json = false;
};

void run_calibrate(const CalibrateFlags& f) {
  spec::ClusterSpec base = spec::resolve_cluster(f.cluster);
  traces::Samples samples;
  for (const std::string& t : f.traces)
    samples.append(traces::samples_from_trace(spec::read_trace_file(t), t));
  for (const std::string& t : f.nccl_tests) samples.append(traces::read_nccl_tests(t));
  for (const std::string& t : f.kineto) samples.append(traces::read_kineto(t));
  spec::Dtype dtype =
      base.device.kind == spec::DeviceKind::kGpu ? spec::Dtype::kBf16 : spec::Dtype::kFp32;
  if (!f.dtype.empty()) {
    auto d = spec::enum_from_name(spec::dtype_names(), f.dtype);
    if (!d)
      throw InputError("command line", "--dtype", f.dtype,
                       "must be one of " + spec::enum_choices(spec::dtype_names()));
    dtype = *d;
  }
  traces::Calibration c = traces::calibrate(base, samples, dtype);
  spec::write_json_file(f.out, spec::to_json(c.cluster));
  const traces::CalibrationReport& r = c.report;
  if (f.json) {
    std::cout << spec::Json{{"out", f.out}, {"calibrated_from", *c.cluster.calibrated_from}}.dump(2)
              << "\n";
    return;
  }
  fmt::print("calibrated {} from {} compute ops and {} collectives -> {}\n", base.name,
             r.compute_samples, r.comm_samples, f.out);
  fmt::print("  launch overhead {:.2f} us, memory efficiency {:.3f}\n", r.launch_overhead_us,
             r.memory_efficiency);
  fmt::print("  GEMM efficiency:");
  for (const spec::EfficiencyPoint& p : r.gemm_efficiency)
    fmt::print(" {:.1e}->{:.2f}", p.flops, p.efficiency);
  fmt::print("\n  compute op times: RMS relative error {:.1f}% before, {:.1f}% after\n",
             100 * r.compute_error_before, 100 * r.compute_error_after);
  for (const spec::CollectiveFit& fit : r.collective_fits)
    fmt::print(
        "  {:<15} on {:<14} alpha {:8.2f} us  beta {:.3e} us/B ({:.2f} GB/s)  R^2 {:.3f}  ({} "
        "samples)\n",
        fit.collective, fit.level, fit.alpha_us, fit.beta_us_per_byte, 1e-3 / fit.beta_us_per_byte,
        fit.r2, fit.samples);
  for (const std::string& n : r.notes) fmt::print("  note: {}\n", n);
}

struct CompareFlags {
  std::string measured, predicted;
  bool json = false;
};

spec::Json rows_json(const std::vector<traces::Row>& rows) {
  spec::Json j = spec::Json::array();
  for (const traces::Row& r : rows)
    j.push_back({{"key", r.key},
                 {"measured_s", r.measured_s},
                 {"predicted_s", r.predicted_s},
                 {"error", r.error()}});
  return j;
}

void print_rows(const char* title, const std::vector<traces::Row>& rows) {
  if (rows.empty()) return;
  fmt::print("  {:<24} {:>12} {:>12} {:>8}\n", title, "measured", "predicted", "error");
  for (const traces::Row& r : rows)
    fmt::print("  {:<24} {:>12} {:>12} {:>7.1f}%\n", r.key, human_seconds(r.measured_s),
               human_seconds(r.predicted_s), 100 * r.error());
}

void run_compare(const CompareFlags& f) {
  spec::Trace m = spec::read_trace_file(f.measured);
  spec::Trace p = spec::read_trace_file(f.predicted);
  traces::Comparison c = traces::compare(m, p);
  if (f.json) {
    std::cout << spec::Json{{"measured_step_s", c.measured_step_s},
                            {"predicted_step_s", c.predicted_step_s},
                            {"step_error", c.step_error()},
                            {"by_class", rows_json(c.by_class)},
                            {"by_collective", rows_json(c.by_collective)},
                            {"worst_ops", rows_json(c.worst_ops)}}
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
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto f = std::make_shared<CalibrateFlags>();
  CLI::App* cmd = app.add_subcommand("calibrate", "Fit a cluster file to measured traces");
  cmd->add_option("--cluster", f->cluster, "Cluster to calibrate (name or file)")->required();
  cmd->add_option("--trace", f->traces, "Sextant traces (sextant run / bench --trace)");
  cmd->add_option("--nccl-tests", f->nccl_tests, "nccl-tests output ([kind:]file)");
  cmd->add_option("--kineto", f->kineto, "PyTorch profiler traces (record_shapes=True)");
  cmd->add_option("--out", f->out, "Calibrated cluster file to write")->required();
  cmd->add_option("--dtype", f->dtype,
                  "Precision the measured ops ran in (default: bf16 GPU, fp32 CPU)");
  cmd->add_flag("--json", f->json, "Print JSON");
  cmd->callback([f] { run_calibrate(*f); });

  auto c = std::make_shared<CompareFlags>();
  CLI::App* cmp =
      app.add_subcommand("compare", "Predicted against measured, per op class and collective");
  cmp->add_option("--measured", c->measured, "Measured trace (sextant run --trace)")->required();
  cmp->add_option("--predicted", c->predicted, "Predicted trace (sextant simulate --trace)")
      ->required();
  cmp->add_flag("--json", c->json, "Print JSON");
  cmp->callback([c] { run_compare(*c); });
}

}  // namespace sextant::cli
