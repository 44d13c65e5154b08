// Formatting helpers for the command line.
#include "format.hpp"

#include <fmt/format.h>

#include <cmath>

namespace sextant::cli {

std::string human_count(double n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  int i = 0;
  while (std::fabs(n) >= 1000 && i < 4) {
    n /= 1000;
    ++i;
  }
  return i == 0 ? fmt::format("{:.0f}", n) : fmt::format("{:.2f}{}", n, units[i]);
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (std::fabs(bytes) >= 1024 && i < 4) {
    bytes /= 1024;
    ++i;
  }
  return i == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[i]);
}

std::string human_flops(double flops) {
  const char* units[] = {"FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"};
  int i = 0;
  while (std::fabs(flops) >= 1000 && i < 6) {
    flops /= 1000;
    ++i;
  }
  return fmt::format("{:.2f} {}", flops, units[i]);
}

std::string human_seconds(double s) {
  if (s < 1e-3) return fmt::format("{:.1f} us", s * 1e6);
  if (s < 1) return fmt::format("{:.2f} ms", s * 1e3);
  if (s < 120) return fmt::format("{:.2f} s", s);
  if (s < 7200) return fmt::format("{:.1f} min", s / 60);
  if (s < 172800) return fmt::format("{:.1f} h", s / 3600);
  return fmt::format("{:.1f} days", s / 86400);
}

}  // namespace sextant::cli
