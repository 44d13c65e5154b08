// The loop's results as JSON, one writer each: `sextant calibrate`, `compare`, `loop` and the
// calibrated cluster file's calibrated_from all use them.
#pragma once

#include <vector>

#include "sextant/loop/class_fit.hpp"
#include "sextant/loop/run_fit.hpp"
#include "sextant/loop/step_check.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/traces/compare.hpp"

namespace sextant::loop {

spec::Json rows_json(const std::vector<traces::Row>& rows);
spec::Json mismatches_json(const std::vector<traces::OpMismatch>& ops);
spec::Json step_check_json(const StepCheck& check);
spec::Json class_fit_json(const ClassFit& fit);

// The fitted cluster as its file holds it: calibrated_from also records the profiled step's class
// fit and the fitted runs' step check.
spec::ClusterSpec fitted_cluster(const RunFit& fit);

}  // namespace sextant::loop
