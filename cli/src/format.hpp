// Human-readable numbers for terminal output: counts (1.2B), bytes (3.4 GiB), FLOPs, durations.
#pragma once

#include <cstdint>
#include <string>

namespace sextant::cli {

std::string human_count(double n);      // 124.4M, 175.0B
std::string human_bytes(double bytes);  // 512 B, 3.40 GiB
std::string human_flops(double flops);  // 1.23 TFLOP
std::string human_seconds(double s);    // 12.3 ms, 4.56 s

}  // namespace sextant::cli
