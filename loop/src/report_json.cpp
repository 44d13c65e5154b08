// The loop's results as JSON.
#include "sextant/loop/report_json.hpp"

#include "sextant/spec/trace.hpp"

namespace sextant::loop {

spec::Json rows_json(const std::vector<traces::Row>& rows) {
  spec::Json j = spec::Json::array();
  for (const traces::Row& r : rows)
    j.push_back({{"key", r.key},
                 {"measured_s", r.measured_s},
                 {"predicted_s", r.predicted_s},
                 {"error", r.error()}});
  return j;
}

spec::Json mismatches_json(const std::vector<traces::OpMismatch>& ops) {
  spec::Json j = spec::Json::array();
  for (const traces::OpMismatch& o : ops)
    j.push_back({{"name", o.name},
                 {"measured_count", o.measured_count},
                 {"predicted_count", o.predicted_count},
                 {"measured_bytes", o.measured_bytes},
                 {"predicted_bytes", o.predicted_bytes},
                 {"one_sided", o.one_sided()}});
  return j;
}

spec::Json step_check_json(const loop::StepCheck& check) {
  spec::Json rows = spec::Json::array();
  for (const loop::StepCheckRow& r : check.rows)
    rows.push_back({{"source", r.source},
                    {"plan", r.plan},
                    {"runs", r.runs},
                    {"logged", r.logged},
                    {"measured_s", r.measured_s},
                    {"predicted_before_s", r.before_s},
                    {"predicted_after_s", r.after_s},
                    {"mismatched_ops", mismatches_json(r.mismatched_ops)}});
  return {{"rows", rows},
          {"mean_abs_error_before", check.mean_abs_error_before()},
          {"mean_abs_error_after", check.mean_abs_error_after()},
          {"max_abs_error_after", check.max_abs_error_after()},
          {"skipped", check.skipped}};
}

spec::Json class_fit_json(const loop::ClassFit& fit) {
  spec::Json rows = spec::Json::array();
  for (const loop::ClassFitRow& r : fit.rows)
    rows.push_back({{"class", spec::enum_name(spec::op_class_names(), r.op_class)},
                    {"measured_s", r.measured_s},
                    {"predicted_before_s", r.before_s},
                    {"predicted_after_s", r.after_s},
                    {"measured_kernels_per_step", r.measured_kernels},
                    {"modelled_ops_per_step", r.predicted_ops},
                    {"parameter", r.parameter},
                    {"value_before", r.value_before},
                    {"value_after", r.value_after},
                    {"capped", r.capped}});
  return {{"measured_step_s", fit.measured_step_s},
          {"predicted_before_s", fit.before_step_s},
          {"predicted_after_s", fit.after_step_s},
          {"classes", rows},
          {"notes", fit.notes}};
}

spec::ClusterSpec fitted_cluster(const RunFit& fit) {
  spec::ClusterSpec cluster = fit.calibration.cluster;
  if (!cluster.calibrated_from) cluster.calibrated_from = spec::Json::object();
  if (fit.class_fit) (*cluster.calibrated_from)["profiled_step"] = class_fit_json(*fit.class_fit);
  if (!fit.check.rows.empty())
    (*cluster.calibrated_from)["fitted_steps"] = step_check_json(fit.check);
  return cluster;
}

}  // namespace sextant::loop
