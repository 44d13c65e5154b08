// Predicted against measured: the step time, and the time per op class, per collective and per op
// name (per rank and step), side by side; which ops the model gets most wrong. Also the ranking
// figures of a set of plans: Kendall's tau and the regret of picking the predicted best.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "sextant/spec/trace.hpp"

namespace sextant::traces {

struct Row {
  std::string key;
  double measured_s = 0;  // per rank and step
  double predicted_s = 0;
  double error() const { return measured_s > 0 ? (predicted_s - measured_s) / measured_s : 0; }
};

// One op name's occurrences in one step, summed over the ranks both traces hold.
struct OpMismatch {
  std::string name;
  int64_t measured_count = 0, predicted_count = 0;
  int64_t measured_bytes = 0, predicted_bytes = 0;
  bool one_sided() const { return measured_count == 0 || predicted_count == 0; }
};

// One (rank, op, phase, bytes) whose number of occurrences in one step differs.
struct OpDisagreement {
  int64_t rank = 0;
  std::string name;
  spec::Phase phase = spec::Phase::kNone;
  int64_t bytes = 0;
  int64_t measured = 0, predicted = 0;
};

// The first step of each trace, op by op on every rank both hold: each (name, phase, bytes) must
// occur as often on both sides (host time outside any op, OpClass::kHost, is not an op). Returns
// the differences, sorted by rank, name, phase, bytes.
std::vector<OpDisagreement> op_disagreements(const spec::Trace& measured,
                                             const spec::Trace& predicted);
// The same, summed per op name over ranks (what `compare` reports).
std::vector<OpMismatch> op_mismatches(const spec::Trace& measured, const spec::Trace& predicted);

struct Comparison {
  double measured_step_s = 0;
  double predicted_step_s = 0;
  double step_error() const { return (predicted_step_s - measured_step_s) / measured_step_s; }
  std::vector<Row> by_class;       // op classes
  std::vector<Row> by_collective;  // collective op names (tp all-reduce, dp reduce-scatter, ...)
  std::vector<Row> worst_ops;      // op names, largest |predicted - measured| first
  // Ops whose count or bytes per step differ between the two traces (on the ranks both hold);
  // an op on one side only has a count of 0 on the other. Empty when the prediction and the run
  // describe the same program.
  std::vector<OpMismatch> mismatched_ops;
};

// Throws InputError when a trace has no step time and no events.
Comparison compare(const spec::Trace& measured, const spec::Trace& predicted);

// Kendall's tau-b between two rankings of the same items (1: same order, -1: reversed).
double kendall_tau(const std::vector<double>& a, const std::vector<double>& b);
// The same where items i and j of b also count as tied when `b_tied(i, j)`: a ranking measured at
// a finite resolution, whose pairs within it are not ordered by the measurement.
double kendall_tau(const std::vector<double>& a, const std::vector<double>& b,
                   const std::function<bool(size_t, size_t)>& b_tied);
// measured[argmin(predicted)] / min(measured) - 1: what trusting the prediction costs.
double regret(const std::vector<double>& predicted, const std::vector<double>& measured);

}  // namespace sextant::traces
