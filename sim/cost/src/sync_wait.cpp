// Expected arrival spread at a collective.
#include "sextant/sim/sync_wait.hpp"

#include <array>
#include <cmath>
#include <numbers>

namespace sextant::sim {

double expected_max_of_normals(int64_t p) {
  static constexpr std::array<double, 9> kTable = {0,      0,      0.5642, 0.8463, 1.0294,
                                                   1.1630, 1.2672, 1.3522, 1.4236};
  if (p < 2) return 0;
  if (p < static_cast<int64_t>(kTable.size())) return kTable[static_cast<size_t>(p)];
  // Blom's (1958) plotting position: the expected k-th of n normal order statistics is close to
  // the quantile of (k - 0.375) / (n + 0.25); for the maximum, k = n. The quantile by bisection
  // of the normal CDF 0.5 erfc(-x / sqrt 2).
  const double n = static_cast<double>(p);
  const double target = (n - 0.375) / (n + 0.25);
  double lo = 0, hi = 10;
  for (int i = 0; i < 80; ++i) {
    const double mid = (lo + hi) / 2;
    (0.5 * std::erfc(-mid / std::numbers::sqrt2) < target ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

}  // namespace sextant::sim
