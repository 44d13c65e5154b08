// Per-core speed probe (core_probe.hpp says why).
#include "sextant/exec/core_probe.hpp"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>

#include "sextant/spec/error.hpp"

namespace sextant::exec {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// 4096 fp32 multiply-adds per pass, independent across the array (vectorised), 40,000 passes.
double multiply_add_kernel() {
  constexpr int kSize = 4096, kPasses = 40000;
  static float a[kSize], b[kSize];
  for (int i = 0; i < kSize; ++i) {
    a[i] = 1.0f + static_cast<float>(i) * 1e-6f;
    b[i] = 0.999f;
  }
  const auto t0 = Clock::now();
  for (int r = 0; r < kPasses; ++r)
    for (int i = 0; i < kSize; ++i) a[i] = a[i] * b[i] + 1e-3f;
  const double t = seconds_since(t0);
  volatile float sink = a[17];
  (void)sink;
  return t;
}

// 2 M dependent loads through a 64 KB permutation, with a data-dependent branch each.
double pointer_chase_kernel() {
  constexpr uint32_t kSize = 1 << 14;
  constexpr int kSteps = 2000000;
  static uint32_t next[kSize];
  for (uint32_t i = 0; i < kSize; ++i) next[i] = (i * 7919u + 1) % kSize;
  const auto t0 = Clock::now();
  uint32_t p = 0, acc = 0;
  for (int s = 0; s < kSteps; ++s) {
    p = next[p];
    if (p & 1u)
      acc += p;
    else
      acc ^= p;
  }
  const double t = seconds_since(t0);
  volatile uint32_t sink = acc;
  (void)sink;
  return t;
}

}  // namespace

std::vector<CoreSpeed> probe_cores(int repeats) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  SEXTANT_CHECK(sched_getaffinity(0, sizeof allowed, &allowed) == 0, "sched_getaffinity failed");
  std::vector<CoreSpeed> out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) continue;  // offline since
    CoreSpeed s{cpu, std::numeric_limits<double>::infinity(),
                std::numeric_limits<double>::infinity()};
    for (int r = 0; r < std::max(repeats, 1); ++r) {
      s.multiply_add_s = std::min(s.multiply_add_s, multiply_add_kernel());
      s.pointer_chase_s = std::min(s.pointer_chase_s, pointer_chase_kernel());
    }
    out.push_back(s);
  }
  sched_setaffinity(0, sizeof allowed, &allowed);
  return out;
}

CoreVerdict judge_cores(const std::vector<CoreSpeed>& speeds, CoreSpeed& best, double tolerance) {
  auto lower = [](double& best_time, double t) {
    if (t > 0 && (best_time <= 0 || t < best_time)) best_time = t;
  };
  for (const CoreSpeed& s : speeds) {
    lower(best.multiply_add_s, s.multiply_add_s);
    lower(best.pointer_chase_s, s.pointer_chase_s);
  }
  CoreVerdict v;
  auto judge = [&](int cpu, const char* kernel, double t, double best_time) {
    if (best_time <= 0) return;
    const double slowdown = t / best_time - 1;
    if (slowdown <= v.slowdown && v.slowest_cpu >= 0) return;
    v.slowest_cpu = cpu;
    v.slowdown = slowdown;
    v.description = fmt::format("cpu {}: {} {:.2f} ms, {:.0f}% above the best {:.2f} ms", cpu,
                                kernel, t * 1e3, slowdown * 100, best_time * 1e3);
  };
  for (const CoreSpeed& s : speeds) {
    judge(s.cpu, "multiply-add", s.multiply_add_s, best.multiply_add_s);
    judge(s.cpu, "pointer chase", s.pointer_chase_s, best.pointer_chase_s);
  }
  v.quiet = v.slowdown <= tolerance;
  return v;
}

}  // namespace sextant::exec
