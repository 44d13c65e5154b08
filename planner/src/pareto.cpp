// Time-memory Pareto front of simulated plans.
#include "sextant/planner/pareto.hpp"

#include <algorithm>
#include <numeric>

namespace sextant::planner {

std::vector<RankedPlan> pareto_front(const std::vector<RankedPlan>& plans) {
  // Sorted by time (then memory, then input order), a plan is on the front exactly when it needs
  // less memory than every faster plan.
  std::vector<size_t> order(plans.size());
  std::iota(order.begin(), order.end(), 0);
  auto time = [&](size_t i) { return plans[i].report.step_time_s; };
  auto memory = [&](size_t i) { return plans[i].report.memory.peak_bytes; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (time(a) != time(b)) return time(a) < time(b);
    return memory(a) < memory(b);
  });
  std::vector<RankedPlan> front;
  for (size_t i : order) {
    if (front.empty() || memory(i) < front.back().report.memory.peak_bytes)
      front.push_back(plans[i]);
  }
  return front;
}

}  // namespace sextant::planner
