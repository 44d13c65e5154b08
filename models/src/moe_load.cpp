// The load of a dropless mixture of experts' most loaded expert-parallel rank.
#include "sextant/models/moe_load.hpp"

#include <cmath>
#include <numbers>

namespace sextant::models {

double expected_max_standard_normal(int64_t n) {
  if (n <= 1) return 0;
  // Simpson's rule on [-12, 12] (the integrand is below 1e-30 beyond): ample for n up to 2^20.
  constexpr int kSteps = 6000;
  constexpr double kLow = -12, kHigh = 12, kStep = (kHigh - kLow) / kSteps;
  const double nn = static_cast<double>(n);
  auto f = [&](double x) {
    const double pdf = std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi);
    const double cdf = 0.5 * std::erfc(-x / std::numbers::sqrt2);
    return x * nn * pdf * std::pow(cdf, nn - 1);
  };
  double sum = f(kLow) + f(kHigh);
  for (int i = 1; i < kSteps; ++i) sum += (i % 2 == 1 ? 4 : 2) * f(kLow + i * kStep);
  return sum * kStep / 3;
}

double moe_load_factor(const spec::MoeSpec& moe, int64_t copies, int64_t ep) {
  if (ep <= 1 || moe.capacity_factor > 0 || copies <= 0) return 1;
  if (moe.load_imbalance > 0) return moe.load_imbalance;
  return 1 + expected_max_standard_normal(ep) / std::sqrt(static_cast<double>(copies));
}

}  // namespace sextant::models
