// Per-core speed probe (core_probe.hpp says why).
#include "sextant/exec/core_probe.hpp"

#include <fmt/format.h>
#include <sched.h>

#include <Eigen/Dense>
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <limits>
#include <thread>

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
  static thread_local float a[kSize], b[kSize];  // each core its own (run together too)
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

// The executor's GEMM at gpt-tiny's QKV shape (micro-batch 4: 512 rows), 10 products per timing.
constexpr int kGemmM = 512, kGemmK = 128, kGemmN = 384, kGemmProducts = 10;
constexpr double kGemmFlops = 2.0 * kGemmM * kGemmK * kGemmN * kGemmProducts;

double gemm_kernel() {
  static thread_local const Eigen::MatrixXf a = Eigen::MatrixXf::Constant(kGemmM, kGemmK, 0.5f);
  static thread_local const Eigen::MatrixXf b = Eigen::MatrixXf::Constant(kGemmK, kGemmN, 0.25f);
  static thread_local Eigen::MatrixXf c(kGemmM, kGemmN);
  const auto t0 = Clock::now();
  for (int r = 0; r < kGemmProducts; ++r) c.noalias() = a * b;
  const double t = seconds_since(t0);
  volatile float sink = c(1, 1);
  (void)sink;
  return t;
}

// y = a + b over 256 KiB arrays (an activation of gpt-tiny at micro-batch 4), 400 passes.
constexpr size_t kStreamSize = 64 * 1024;
constexpr int kStreamPasses = 400;
constexpr double kStreamBytes = 3.0 * kStreamSize * sizeof(float) * kStreamPasses;

double stream_kernel() {
  static thread_local std::vector<float> a(kStreamSize, 1.0f), b(kStreamSize, 2.0f), y(kStreamSize);
  const auto t0 = Clock::now();
  for (int r = 0; r < kStreamPasses; ++r) {
    for (size_t i = 0; i < kStreamSize; ++i) y[i] = a[i] + b[i];
    asm volatile("" : : "r"(y.data()) : "memory");  // each pass is stored, not folded away
  }
  return seconds_since(t0);
}

// False when the CPU went offline since it was listed.
bool pin_to(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return sched_setaffinity(0, sizeof one, &one) == 0;
}

// Each element of `best` lowered to the matching one of `times`.
void lower_each(std::vector<double>& best, const std::vector<double>& times) {
  for (size_t i = 0; i < times.size(); ++i) best[i] = std::min(best[i], times[i]);
}

// `kernel` on each of `cpus`, one pinned thread each: alone (one after another) or together
// (started at once); each thread's best of three timings.
std::vector<double> time_on(const std::vector<int>& cpus, double (*kernel)(), bool together) {
  std::vector<double> best(cpus.size(), std::numeric_limits<double>::infinity());
  std::barrier start(static_cast<std::ptrdiff_t>(together ? cpus.size() : 1));
  auto body = [&](size_t i) {
    pin_to(cpus[i]);
    kernel();  // warm: thread-local arrays allocated and in cache
    start.arrive_and_wait();
    for (int r = 0; r < 3; ++r) best[i] = std::min(best[i], kernel());
  };
  if (together) {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < cpus.size(); ++i) threads.emplace_back(body, i);
    for (std::thread& t : threads) t.join();
  } else {
    for (size_t i = 0; i < cpus.size(); ++i) std::thread(body, i).join();
  }
  return best;
}

}  // namespace

CoRunProbe probe_co_run(int repeats) {
  const std::vector<int> cpus = allowed_cpus();
  CoRunProbe p;
  p.cores = static_cast<int>(cpus.size());
  p.matrix_flops = kGemmFlops;
  p.memory_bytes = kStreamBytes;
  std::vector<double> matrix_alone(cpus.size(), std::numeric_limits<double>::infinity());
  std::vector<double> matrix_together = matrix_alone, memory_alone = matrix_alone,
                      memory_together = matrix_alone;
  for (int r = 0; r < std::max(repeats, 1); ++r) {
    lower_each(matrix_alone, time_on(cpus, gemm_kernel, false));
    lower_each(matrix_together, time_on(cpus, gemm_kernel, true));
    lower_each(memory_alone, time_on(cpus, stream_kernel, false));
    lower_each(memory_together, time_on(cpus, stream_kernel, true));
  }
  auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
  };
  p.matrix_alone_s = mean(matrix_alone);
  p.matrix_together_s = mean(matrix_together);
  p.memory_alone_s = mean(memory_alone);
  p.memory_together_s = mean(memory_together);
  return p;
}

std::vector<int> allowed_cpus() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  SEXTANT_CHECK(sched_getaffinity(0, sizeof allowed, &allowed) == 0, "sched_getaffinity failed");
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  return cpus;
}

std::vector<CoreSpeed> probe_cores(int repeats) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  SEXTANT_CHECK(sched_getaffinity(0, sizeof allowed, &allowed) == 0, "sched_getaffinity failed");
  std::vector<CoreSpeed> out;
  for (int cpu : allowed_cpus()) {
    if (!pin_to(cpu)) continue;  // offline since
    CoreSpeed s{cpu, std::numeric_limits<double>::infinity(),
                std::numeric_limits<double>::infinity()};
    for (int r = 0; r < std::max(repeats, 1); ++r) {
      s.multiply_add_s = std::min(s.multiply_add_s, multiply_add_kernel());
      s.pointer_chase_s = std::min(s.pointer_chase_s, pointer_chase_kernel());
    }
    out.push_back(s);
  }
  sched_setaffinity(0, sizeof allowed, &allowed);
  if (out.size() >= 2) {
    std::vector<int> cpus;
    for (const CoreSpeed& c : out) cpus.push_back(c.cpu);
    std::vector<double> together(cpus.size(), std::numeric_limits<double>::infinity());
    for (int r = 0; r < std::max(repeats, 1); ++r)
      lower_each(together, time_on(cpus, multiply_add_kernel, true));
    for (size_t i = 0; i < out.size(); ++i) out[i].together_s = together[i];
  }
  return out;
}

CoreVerdict judge_cores(const std::vector<CoreSpeed>& speeds, CoreSpeed& best, double tolerance) {
  auto lower = [](double& best_time, double t) {
    if (t > 0 && (best_time <= 0 || t < best_time)) best_time = t;
  };
  for (const CoreSpeed& s : speeds) {
    lower(best.multiply_add_s, s.multiply_add_s);
    lower(best.pointer_chase_s, s.pointer_chase_s);
    lower(best.together_s, s.together_s);
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
    if (s.together_s > 0)
      judge(s.cpu, "multiply-add beside the other cores", s.together_s, best.together_s);
  }
  v.quiet = v.slowdown <= tolerance;
  return v;
}

}  // namespace sextant::exec
