// The warm-up rule.
#include "sextant/spec/step_times.hpp"

namespace sextant::spec {

std::vector<double> steps_after_warmup(const std::vector<double>& steps) {
  const size_t skip = steps.size() > 3 ? 2 : (steps.size() > 1 ? 1 : 0);
  return {steps.begin() + static_cast<std::ptrdiff_t>(skip), steps.end()};
}

std::optional<double> mean_step_after_warmup(const std::vector<double>& steps) {
  const std::vector<double> kept = steps_after_warmup(steps);
  if (kept.empty()) return std::nullopt;
  double sum = 0;
  for (double s : kept) sum += s;
  return sum / static_cast<double>(kept.size());
}

}  // namespace sextant::spec
