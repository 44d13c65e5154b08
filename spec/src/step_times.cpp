// The warm-up rule.
#include "sextant/spec/step_times.hpp"

namespace sextant::spec {

std::optional<double> mean_step_after_warmup(const std::vector<double>& steps) {
  if (steps.empty()) return std::nullopt;
  const size_t skip = steps.size() > 3 ? 2 : (steps.size() > 1 ? 1 : 0);
  double sum = 0;
  for (size_t k = skip; k < steps.size(); ++k) sum += steps[k];
  return sum / static_cast<double>(steps.size() - skip);
}

}  // namespace sextant::spec
