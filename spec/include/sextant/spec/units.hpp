// Unit conversions, done in one place. Simulated time is integer picoseconds (int64 holds ~106
// days); sizes are int64 bytes; FLOPs are doubles. GB = 1e9 bytes, TFLOP/s = 1e12 FLOP/s.
#pragma once

#include <cstdint>

namespace sextant {

using Picoseconds = int64_t;

inline constexpr double kPicosecondsPerSecond = 1e12;
inline constexpr double kBytesPerGB = 1e9;
inline constexpr double kFlopsPerTflop = 1e12;
inline constexpr int64_t kBytesPerGiB = int64_t{1} << 30;

// Seconds (double) to picoseconds, rounded to nearest; throws InternalError on overflow or NaN.
Picoseconds seconds_to_ps(double seconds);
inline double ps_to_seconds(Picoseconds ps) {
  return static_cast<double>(ps) / kPicosecondsPerSecond;
}
inline double ps_to_us(Picoseconds ps) {
  return static_cast<double>(ps) / 1e6;
}
// Microseconds (double) to picoseconds, rounded; throws InternalError on overflow or NaN.
Picoseconds us_to_ps(double us);

}  // namespace sextant
