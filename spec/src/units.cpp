// Checked time conversions.
#include "sextant/spec/units.hpp"

#include <cmath>

#include "sextant/spec/error.hpp"
#include "sextant/spec/limits.hpp"

namespace sextant {

Picoseconds seconds_to_ps(double seconds) {
  double ps = std::round(seconds * kPicosecondsPerSecond);
  SEXTANT_CHECK(std::isfinite(ps) && std::fabs(seconds) < spec::kMaxSeconds,
                "time {} s does not fit in int64 ps", seconds);
  return static_cast<Picoseconds>(ps);
}

Picoseconds us_to_ps(double us) {
  return seconds_to_ps(us * 1e-6);
}

}  // namespace sextant
