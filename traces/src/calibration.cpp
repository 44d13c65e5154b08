// Least-squares fits of the compute and network models.
#include "sextant/traces/calibration.hpp"

#include <fmt/format.h>

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

#include "sextant/sim/collective_cost.hpp"
#include "sextant/sim/compute_model.hpp"
#include "sextant/sim/sync_wait.hpp"
#include "sextant/traces/sample_checks.hpp"

namespace sextant::traces {

namespace {

// Least squares y ~ a * x1 + b * x2 with a, b >= 0, minimising the *relative* residuals
// ((fit - y) / y: rows weighted by 1/y), so that microsecond ops weigh as much as long ones.
// The two-variable non-negative case: drop a variable whose unconstrained estimate is negative.
std::pair<double, double> nonnegative_fit(const std::vector<double>& x1,
                                          const std::vector<double>& x2,
                                          const std::vector<double>& y) {
  const Eigen::Index n = static_cast<Eigen::Index>(y.size());
  Eigen::MatrixXd a(n, 2);
  Eigen::VectorXd b(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    const double w = 1.0 / y[static_cast<size_t>(i)];
    a(i, 0) = x1[static_cast<size_t>(i)] * w;
    a(i, 1) = x2[static_cast<size_t>(i)] * w;
    b(i) = 1.0;
  }
  Eigen::Vector2d s = a.colPivHouseholderQr().solve(b);
  auto only = [&](int col) {
    double num = a.col(col).dot(b), den = a.col(col).squaredNorm();
    return den > 0 ? std::max(0.0, num / den) : 0.0;
  };
  if (s(0) < 0) return {0.0, only(1)};
  if (s(1) < 0) return {only(0), 0.0};
  return {s(0), s(1)};
}

double r_squared(const std::vector<double>& y, const std::vector<double>& fit) {
  double mean = 0;
  for (double v : y) mean += v;
  mean /= static_cast<double>(y.size());
  double ss_res = 0, ss_tot = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    ss_res += (y[i] - fit[i]) * (y[i] - fit[i]);
    ss_tot += (y[i] - mean) * (y[i] - mean);
  }
  return ss_tot > 0 ? 1 - ss_res / ss_tot : 1.0;
}

bool matrix(spec::OpClass c) {
  return sim::is_matrix_op(c);
}

// How far the compute model with `device` is from the measured op times: the RMS of the relative
// errors (every op alike) and the time-weighted mean |error|, sum |predicted - measured| / sum
// measured (what the ops' share of a step can be off by; what the fits below aim at).
std::pair<double, double> compute_errors(const spec::DeviceSpec& device, spec::Dtype dtype,
                                         const std::vector<ComputeSample>& samples) {
  if (samples.empty()) return {0, 0};
  sim::ComputeModel model(device, dtype);
  double squares = 0, abs_sum = 0, measured = 0;
  for (const ComputeSample& s : samples) {
    double t = model.seconds(s.flops, static_cast<double>(s.bytes), s.op_class, s.name);
    double e = (t - s.seconds) / s.seconds;
    squares += e * e;
    abs_sum += std::fabs(t - s.seconds);
    measured += s.seconds;
  }
  return {std::sqrt(squares / static_cast<double>(samples.size())), abs_sum / measured};
}

// The middle value (the upper one of an even count) of a non-empty list.
double upper_median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// The middle value (the lower one of an even count) of a non-empty list.
double lower_median(std::vector<double> v) {
  const auto k = static_cast<long>((v.size() - 1) / 2);
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[static_cast<size_t>(k)];
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// The samples as their ops would have run alone on their node: a run of n ranks ran each op beside
// the node's other busy devices, slowed by the device's co_run figure (its own measurement, not a
// fit), and the fits below describe a device alone (ComputeModel::set_busy_devices puts it back).
Samples as_if_alone(Samples samples, const spec::ClusterSpec& cluster) {
  if (!cluster.device.co_run) return samples;
  for (ComputeSample& s : samples.compute) {
    s.seconds /= cluster.device.co_run->at(matrix(s.op_class) && s.flops > 0,
                                           sim::busy_devices_per_node(cluster, s.run_ranks));
  }
  return samples;
}

// A peak `clusters detect` measured (DeviceSpec::peak_measured) is the fastest GEMM it saw; a
// faster one measured now (a quiet moment, another shape) is the better bound, so the peak
// becomes the fastest matrix op's FLOPs over its whole time. The launch overhead is not taken
// off: fitted on memory-bound ops, it would leave a 32^3 GEMM of 1 us a fraction of that and a
// rate of 0.29 TFLOP/s on a Zen 4 core whose training GEMMs ran at 0.085. The memory bandwidth
// is not raised so: memory-bound rates include bytes counted that were not moved (the loop's
// embedding lookups "moved" 78-1900 GB/s on that core).
void raise_measured_peak(const Samples& samples, spec::Dtype dtype, spec::DeviceSpec& device,
                         CalibrationReport& rep) {
  const auto peak = device.peak_tflops.find(dtype);
  if (!device.peak_measured || peak == device.peak_tflops.end()) return;
  double fastest = 0;
  for (const ComputeSample& s : samples.compute)
    if (matrix(s.op_class) && s.flops > 0 && s.seconds > 0)
      fastest = std::max(fastest, s.flops / s.seconds);
  if (fastest <= peak->second * kFlopsPerTflop) return;
  rep.notes.push_back(fmt::format(
      "matrix ops ran at up to {:.3g} TFLOP/s, above the measured peak of {:.3g}: the peak "
      "raised to it",
      fastest / kFlopsPerTflop, peak->second));
  peak->second = fastest / kFlopsPerTflop;
}

// 1. Memory-bound ops: the launch overhead and memory efficiency, and an efficiency per op class.
void fit_memory_bound_ops(const Samples& samples, spec::DeviceSpec& device,
                          CalibrationReport& rep) {
  // time = launch + bytes * b, b = 1 / (bandwidth * efficiency).
  std::vector<double> ones, bytes, times;
  for (const ComputeSample& s : samples.compute) {
    if (matrix(s.op_class) || s.bytes <= 0) continue;
    ones.push_back(1.0);
    bytes.push_back(static_cast<double>(s.bytes));
    times.push_back(s.seconds);
  }
  if (times.size() >= 2) {
    auto [launch, per_byte] = nonnegative_fit(ones, bytes, times);
    device.launch_overhead_us = launch * 1e6;
    if (per_byte > 0) {
      device.memory_efficiency =
          std::clamp(1.0 / (per_byte * device.memory_bandwidth_GBps * kBytesPerGB), 0.001, 1.0);
    }
  } else {
    rep.notes.push_back(
        "fewer than 2 memory-bound ops: launch overhead and memory efficiency kept");
  }
  // Per op class, with the launch overhead L fixed: the slope b of t = L + b * bytes minimising
  // the relative residuals, b = sum(x (t - L) / t^2) / sum(x^2 / t^2).
  const double launch_s = device.launch_overhead_us * 1e-6;
  std::map<spec::OpClass, std::pair<double, double>> sums;  // class -> (numerator, denominator)
  for (const ComputeSample& s : samples.compute) {
    if (matrix(s.op_class) || s.bytes <= 0) continue;
    const double x = static_cast<double>(s.bytes), t = s.seconds;
    sums[s.op_class].first += x * (t - launch_s) / (t * t);
    sums[s.op_class].second += x * x / (t * t);
  }
  device.memory_efficiency_by_class.clear();
  std::map<spec::OpClass, double> raw;  // achieved bandwidth / the file's bandwidth, unclamped
  for (const auto& [cls, nd] : sums) {
    const auto& [num, den] = nd;
    if (den <= 0 || num <= 0) continue;
    const double per_byte = num / den;
    raw[cls] = 1.0 / (per_byte * device.memory_bandwidth_GBps * kBytesPerGB);
  }
  // The file's bandwidth is the device's peak (a datasheet figure, or a CPU core's cache
  // bandwidth): it is never raised. A class that seems faster ran from a cache or had its bytes
  // over-counted; its efficiency stops at 1 and the note says so.
  for (const auto& [cls, e] : raw) {
    device.memory_efficiency_by_class[cls] = std::clamp(e, 0.001, 1.0);
    if (e > 1.0)
      rep.notes.push_back(fmt::format(
          "{} ops moved their bytes at {:.0f} GB/s, above the peak {:.0f} GB/s (cache-resident "
          "data or bytes counted that were not moved): efficiency capped at 1",
          spec::enum_name(spec::op_class_names(), cls), e * device.memory_bandwidth_GBps,
          device.memory_bandwidth_GBps));
  }
  rep.launch_overhead_us = device.launch_overhead_us;
  rep.memory_efficiency = device.memory_efficiency;
}

// 2. Matrix ops: the GEMM efficiency curve.
void fit_matrix_ops(const Samples& samples, spec::Dtype dtype, spec::DeviceSpec& device,
                    CalibrationReport& rep) {
  // achieved fraction of peak after the launch overhead per half decade of FLOPs,
  // as total FLOPs over total time: a step pays its ops' mean time, and op times are skewed (a
  // few stalled ops), so a median efficiency would predict steps several percent fast.
  const double peak = device.peak_flops(dtype);
  std::map<int64_t, std::vector<std::pair<double, double>>> bins;  // bin -> (flops, efficiency)
  int64_t above_peak = 0;
  double fastest = 0;
  for (const ComputeSample& s : samples.compute) {
    if (!matrix(s.op_class) || s.flops <= 0) continue;
    double busy = s.seconds - device.launch_overhead_us * 1e-6;
    if (busy <= 0) continue;
    const double achieved = s.flops / busy;
    if (achieved > peak) {
      ++above_peak;
      fastest = std::max(fastest, achieved);
    }
    double eff = std::min(1.0, achieved / peak);
    bins[static_cast<int64_t>(std::floor(std::log10(s.flops) * 2))].push_back({s.flops, eff});
  }
  if (above_peak > 0)
    rep.notes.push_back(fmt::format(
        "{} matrix ops ran above the file's peak of {:.1f} TFLOP/s (up to {:.1f}): the peak is "
        "wrong (clock or FLOPs per cycle); their efficiency is capped at 1",
        above_peak, peak / kFlopsPerTflop, fastest / kFlopsPerTflop));
  if (!bins.empty()) {
    device.gemm_efficiency.clear();
    for (auto& [bin, points] : bins) {
      double log_sum = 0, flops = 0, time = 0;  // time in units of 1 / peak: flops / efficiency
      for (auto [f, e] : points) {
        log_sum += std::log(f);
        flops += f;
        time += f / e;
      }
      device.gemm_efficiency.push_back(
          {std::exp(log_sum / static_cast<double>(points.size())), std::max(1e-4, flops / time)});
    }
  } else {
    rep.notes.push_back("no matrix ops: the GEMM efficiency curve kept");
  }
  rep.gemm_efficiency = device.gemm_efficiency;
}

// 2b. Per op name and size: an efficiency curve of each op seen often enough.
void fit_ops_by_name(const Samples& samples, spec::Dtype dtype, spec::DeviceSpec& device) {
  const double peak = device.peak_flops(dtype);
  // the achieved efficiency of an op at each size (FLOPs of a matrix
  // op, bytes otherwise) seen at least kMinSamples times, as total work over total time (the
  // mean time per op, which is what a step pays; see 2), as a curve over the size. The
  // curves above stay for ops a trace did not show; these capture what they cannot (batched
  // small attention GEMMs, transcendental-heavy softmax and activations, the optimizer, an
  // activation that stops fitting a CPU's L2 at the next micro-batch).
  constexpr size_t kMinSamples = 3;
  struct Totals {
    size_t count = 0;
    double work = 0, busy = 0, rate = 0;  // rate: the peak the work is measured against
  };
  std::map<std::string, std::map<double, Totals>> by_name;  // name -> work per op -> totals
  for (const ComputeSample& s : samples.compute) {
    const double busy = s.seconds - device.launch_overhead_us * 1e-6;
    if (busy <= 0 || s.name.empty()) continue;
    const bool gemm = matrix(s.op_class) && s.flops > 0;
    if (!gemm && s.bytes <= 0) continue;
    const double work = gemm ? s.flops : static_cast<double>(s.bytes);
    Totals& t = by_name[s.name][work];
    t.count += 1;
    t.work += work;
    t.busy += busy;
    t.rate = gemm ? peak : device.memory_bandwidth_GBps * kBytesPerGB;
  }
  device.efficiency_by_op.clear();
  for (const auto& [name, sizes] : by_name) {
    std::vector<spec::WorkEfficiency> curve;
    for (const auto& [work, t] : sizes) {
      if (t.count < kMinSamples) continue;
      curve.push_back({work, std::clamp(t.work / (t.rate * t.busy), 1e-4, 1.0)});
    }
    if (!curve.empty()) device.efficiency_by_op[name] = curve;
  }
}

// 2c. Host time per step (Device::step_overhead_us).
void fit_step_overhead(const Samples& samples, spec::DeviceSpec& device, CalibrationReport& rep) {
  // what the ops and transfers of a measured step leave unexplained,
  // median over the training runs (robust to one run that waited on a slow neighbour).
  if (!samples.steps.empty()) {
    std::vector<double> host;
    for (const StepSample& s : samples.steps) host.push_back(std::max(0.0, s.host_s()));
    device.step_overhead_us = upper_median(host) * 1e6;
  }
  rep.step_overhead_us = device.step_overhead_us;
}

// 2d. Compute jitter (sim/sync_wait.hpp).
void fit_compute_jitter(const Samples& samples, spec::DeviceSpec& device, CalibrationReport& rep) {
  // a collective's last member arrives j * e(p) * S after the members' mean
  // (S their time since the previous collective; sim/sync_wait.hpp), so each collective gives
  // j = spread / (e(p) S). Per run, the median over its collectives is robust to the rare long
  // stall; across runs, the lower median of the runs' values is robust to one run spent beside a
  // busy neighbour (a core slow for the whole run widens every spread of that run, and slowness
  // only ever adds spread), as the loop's choice of each plan's fastest run is.
  constexpr size_t kMinSyncSamples = 10;    // in all
  constexpr size_t kMinRunSyncSamples = 5;  // for a run's own value
  if (samples.sync.size() >= kMinSyncSamples) {
    std::map<std::string, std::vector<double>> j_by_run;
    std::vector<double> all;
    for (const SyncSample& s : samples.sync) {
      all.push_back(s.spread_s / (sim::expected_max_of_normals(s.ranks) * s.segment_s));
      j_by_run[s.source].push_back(all.back());
    }
    std::vector<double> run_jitter;
    std::string per_run;
    for (const auto& [source, j] : j_by_run) {
      if (j.size() < kMinRunSyncSamples) continue;
      run_jitter.push_back(upper_median(j));
      per_run += fmt::format("{}{} {:.3f} ({} collectives)", per_run.empty() ? "" : ", ", source,
                             run_jitter.back(), j.size());
    }
    if (run_jitter.size() > 1)
      rep.notes.push_back(fmt::format("compute jitter per run: {}", per_run));
    // Many short runs, none long enough alone: their collectives pooled.
    if (run_jitter.empty()) run_jitter.push_back(upper_median(all));
    device.compute_jitter = std::clamp(lower_median(run_jitter), 0.0, 1.0);
  } else if (!samples.sync.empty()) {
    rep.notes.push_back(fmt::format(
        "{} collectives with every member in the traces, fewer than {}: compute jitter kept",
        samples.sync.size(), kMinSyncSamples));
  }
  rep.compute_jitter = device.compute_jitter;
}

struct AlphaBeta {
  double alpha = 0, beta = 0, r2 = 0;
  int64_t samples = 0;
};

// A fit through the mean time at each (ranks, bytes), each such point weighted alike: a step
// pays a collective's mean time, and collective times are skewed (a relative least-squares fit
// through the raw samples lands below their mean, and the size with the most samples decides).
using Shape = std::pair<int64_t, int64_t>;  // (ranks, bytes)
std::map<Shape, double> mean_by_shape(const std::vector<const CommSample*>& list) {
  std::map<Shape, std::pair<double, int64_t>> sum_count;
  for (const CommSample* c : list) {
    auto& [sum, count] = sum_count[{c->ranks, c->bytes}];
    sum += c->seconds;
    ++count;
  }
  std::map<Shape, double> mean;
  for (const auto& [shape, sc] : sum_count) mean[shape] = sc.first / static_cast<double>(sc.second);
  return mean;
}

AlphaBeta fit_group(const std::vector<const CommSample*>& list) {
  const spec::CollectiveKind kind = list.front()->collective;
  const spec::CollectiveAlgorithm a = sim::fitted_algorithm(kind);
  std::vector<double> f, g, y;
  for (const auto& [shape, seconds] : mean_by_shape(list)) {
    const double n = static_cast<double>(shape.second);
    f.push_back(sim::flat_cost(kind, a, shape.first, n, {1, 0, 0}).total());
    g.push_back(sim::flat_cost(kind, a, shape.first, n, {0, 1, 0}).total());
    y.push_back(seconds);
  }
  auto [alpha, beta] = nonnegative_fit(f, g, y);
  std::vector<double> fitted;
  for (size_t i = 0; i < y.size(); ++i) fitted.push_back(alpha * f[i] + beta * g[i]);
  return AlphaBeta{alpha, beta, r_squared(y, fitted), static_cast<int64_t>(list.size())};
}

// The largest miss of a fit over the mean times at the shapes of `list` of size `only_bytes`
// (every size when 0), relative to the measured time.
double worst_miss(const std::vector<const CommSample*>& list, const AlphaBeta& fit,
                  int64_t only_bytes) {
  const spec::CollectiveKind kind = list.front()->collective;
  const spec::CollectiveAlgorithm algorithm = sim::fitted_algorithm(kind);
  double miss = 0;
  for (const auto& [shape, measured] : mean_by_shape(list)) {
    if (only_bytes != 0 && shape.second != only_bytes) continue;
    const double t = sim::flat_cost(kind, algorithm, shape.first, static_cast<double>(shape.second),
                                    {fit.alpha, fit.beta, 0})
                         .total();
    miss = std::max(miss, std::fabs(t - measured) / measured);
  }
  return miss;
}

// Per-byte cost alone (alpha = 0) through the mean times at the shapes of size `at_bytes`: the
// relative least-squares beta = sum(g / t) / sum(g^2 / t^2).
AlphaBeta per_byte_fit(const std::vector<const CommSample*>& list, int64_t at_bytes) {
  const spec::CollectiveKind kind = list.front()->collective;
  const spec::CollectiveAlgorithm a = sim::fitted_algorithm(kind);
  double num = 0, den = 0;
  std::vector<double> g, y;
  for (const auto& [shape, seconds] : mean_by_shape(list)) {
    g.push_back(
        sim::flat_cost(kind, a, shape.first, static_cast<double>(shape.second), {0, 1, 0}).total());
    y.push_back(seconds);
    if (shape.second != at_bytes) continue;
    num += g.back() / seconds;
    den += g.back() * g.back() / (seconds * seconds);
  }
  const double beta = den > 0 ? num / den : 0;
  std::vector<double> fitted;
  for (double gi : g) fitted.push_back(beta * gi);
  return AlphaBeta{0, beta, r_squared(y, fitted), static_cast<int64_t>(list.size())};
}

// Open MPI's tuned collectives switch algorithms with the size. Where one line misses the mean
// time at some size by more than kSwitchMiss and the samples span three sizes or more, each pair
// of neighbouring sizes gets its own fit, bounded by the larger size; otherwise one line (noise
// alone leaves it within a few percent, and it extrapolates better). A switch to an algorithm
// that costs more per byte has no line with alpha >= 0 through both sizes (the line through them
// crosses zero above the smaller): that range is priced by the larger size's per-byte cost, as if
// the switch came right above the smaller size (the switch point is not measured; the price is
// exact at the larger size and at most its per-byte cost in between). A fit through both sizes
// with alpha clamped to 0 instead kept the smaller size and priced a 4 MB reduce-scatter measured
// at 17.5 ms at 1.6 ms.
constexpr double kSwitchMiss = 0.25;
std::vector<std::pair<int64_t, AlphaBeta>> fit_segments(
    const std::vector<const CommSample*>& list) {
  std::set<int64_t> sizes;
  for (const CommSample* c : list) sizes.insert(c->bytes);
  const AlphaBeta line = fit_group(list);
  std::vector<std::pair<int64_t, AlphaBeta>> segments;  // (max_bytes or 0, fit)
  if (sizes.size() < 3 || worst_miss(list, line, 0) <= kSwitchMiss) {
    segments.push_back({0, line});
    return segments;
  }
  const std::vector<int64_t> sorted(sizes.begin(), sizes.end());
  for (size_t i = 0; i + 1 < sorted.size(); ++i) {
    std::vector<const CommSample*> pair;
    for (const CommSample* c : list)
      if (c->bytes == sorted[i] || c->bytes == sorted[i + 1]) pair.push_back(c);
    AlphaBeta fit = fit_group(pair);
    if (worst_miss(pair, fit, sorted[i + 1]) > kSwitchMiss) fit = per_byte_fit(pair, sorted[i + 1]);
    segments.push_back({i + 2 == sorted.size() ? 0 : sorted[i + 1], fit});
  }
  return segments;
}

// 3. Collectives: alpha and beta per collective and network level (segments where the
// algorithm switches with the size).
void fit_collectives(const Samples& samples, const spec::ClusterSpec& base,
                     spec::ClusterSpec& cluster, CalibrationReport& rep) {
  // t = alpha * f(p) + beta * g(p, n) through the ring (pairwise) formula, per
  // collective and level (a group no larger than a node is taken to be inside one). Where
  // training runs show a collective at two sizes or more, those samples decide: a collective
  // inside training (its data just written by compute, cold in the other ranks' caches) costs
  // what a benchmark loop over hot buffers does not show (1.8x for 128 KB all-reduces between the
  // two cores of the CI machine).
  std::map<spec::CollectiveKind, std::set<int64_t>> training_sizes;
  for (const CommSample& c : samples.comm)
    if (c.in_training) training_sizes[c.collective].insert(c.bytes);
  for (const auto& [kind, sizes] : training_sizes)
    if (sizes.size() >= 2)
      rep.notes.push_back(fmt::format("{}: fitted on the training runs' own collectives ({} sizes)",
                                      spec::enum_name(spec::collective_kind_names(), kind),
                                      sizes.size()));
  // Samples by (collective, level, from training runs?).
  using GroupKey = std::tuple<spec::CollectiveKind, std::string, bool>;
  std::map<GroupKey, std::vector<const CommSample*>> groups;
  for (const CommSample& c : samples.comm) {
    const spec::NetworkLevel* level =
        c.ranks <= base.devices_per_node || base.network.cluster_level() == nullptr
            ? &base.network.node_level()
            : base.network.cluster_level();
    groups[{c.collective, level->name, c.in_training}].push_back(&c);
  }
  std::map<std::pair<spec::CollectiveKind, std::string>, std::vector<const CommSample*>> chosen;
  // Per level, how much more a byte costs inside training than in the benchmark loop, for the
  // collectives seen both ways: the same cold caches slow the collectives that training runs
  // showed only once or not at all (a tp plan's all-reduces calibrate a sequence-parallel plan's
  // reduce-scatters and all-gathers).
  std::map<std::string, std::vector<double>> training_ratio;
  for (const auto& [key, list] : groups) {
    const auto& [kind, level, in_training] = key;
    const bool training_decides = training_sizes[kind].size() >= 2;
    if (training_decides != in_training) continue;
    std::set<int64_t> sizes;
    for (const CommSample* c : list) sizes.insert(c->bytes);
    if (sizes.size() < 2) {
      // Two unknowns (alpha, beta) need two sizes at least: one size fits any split of its time.
      rep.warnings.push_back(fmt::format(
          "{} on {}: measured at one size only ({} B, {} sample(s)): alpha and beta cannot be "
          "told apart, not fitted",
          spec::enum_name(spec::collective_kind_names(), kind), level, *sizes.begin(),
          list.size()));
      continue;
    }
    chosen[{kind, level}] = list;
    auto bench = groups.find({kind, level, false});
    if (in_training && bench != groups.end() && bench->second.size() >= 2) {
      const AlphaBeta b = fit_group(bench->second);
      if (b.beta > 0) training_ratio[level].push_back(fit_group(list).beta / b.beta);
    }
  }
  cluster.collective_fits.clear();
  for (const auto& [key, list] : chosen) {
    const auto& [kind, level] = key;
    const std::string name(spec::enum_name(spec::collective_kind_names(), kind));
    double scale = 1;
    auto ratio = training_ratio.find(level);
    if (training_sizes[kind].size() < 2 && ratio != training_ratio.end()) {
      scale = std::max(1.0, upper_median(ratio->second));
      rep.notes.push_back(fmt::format(
          "{} on {}: benchmark fit with its per-byte cost times {:.2f}, what training runs "
          "cost over the benchmark for the collectives they showed",
          name, level, scale));
    }
    for (const auto& [max_bytes, ab] : fit_segments(list)) {
      spec::CollectiveFit fit;
      fit.collective = name;
      fit.level = level;
      fit.max_bytes = max_bytes;
      fit.alpha_us = ab.alpha * 1e6;
      fit.beta_us_per_byte = std::max(ab.beta * scale * 1e6, 1e-15);
      fit.r2 = ab.r2;
      fit.samples = ab.samples;
      cluster.collective_fits.push_back(fit);
    }
  }
  rep.collective_fits = cluster.collective_fits;
}

// What the calibrated file says of itself: where it came from and how well it fits, checked to
// read back.
void describe_calibration(Calibration& out, const spec::ClusterSpec& base, const Samples& samples,
                          spec::Dtype dtype) {
  const CalibrationReport& rep = out.report;
  spec::DeviceSpec& device = out.cluster.device;
  spec::Json fits = spec::Json::array();
  for (const spec::CollectiveFit& c : rep.collective_fits)
    fits.push_back({{"collective", c.collective},
                    {"level", c.level},
                    {"max_bytes", c.max_bytes},
                    {"r2", c.r2},
                    {"samples", c.samples}});
  out.cluster.calibrated_from = {
      {"date", utc_now()},
      {"files", samples.sources},
      {"base", base.name},
      {"dtype", spec::enum_name(spec::dtype_names(), dtype)},
      {"compute_samples", rep.compute_samples},
      {"comm_samples", rep.comm_samples},
      {"step_samples", static_cast<int64_t>(samples.steps.size())},
      {"sync_samples", static_cast<int64_t>(samples.sync.size())},
      {"compute_rms_relative_error",
       {{"before", rep.compute_error_before}, {"after", rep.compute_error_after}}},
      {"compute_time_weighted_error",
       {{"before", rep.compute_time_error_before}, {"after", rep.compute_time_error_after}}},
      {"collectives", fits},
      {"notes", rep.notes},
      {"warnings", rep.warnings}};
  out.cluster.name = base.name + "-calibrated";
  out.cluster.description = base.description + " (calibrated)";
  device.source += fmt::format("; efficiencies and launch overhead calibrated on {}", utc_now());
  // What is written must read back: a value the reader refuses (a NaN, a negative efficiency)
  // would be a fit that escaped the checks above, not the user's error.
  try {
    (void)spec::cluster_from_json(spec::to_json(out.cluster), out.cluster.name);
  } catch (const InputError& e) {
    throw std::logic_error(
        fmt::format("calibration produced a cluster it cannot read back: {}", e.what()));
  }
}

}  // namespace

Calibration calibrate(const spec::ClusterSpec& base, const Samples& read, spec::Dtype dtype) {
  const Samples samples = as_if_alone(screen_samples(read, base), base);
  if (samples.compute.empty() && samples.comm.empty() && samples.steps.empty() &&
      samples.sync.empty()) {
    std::string why;
    for (const std::string& w : samples.warnings) why += "; " + w;
    throw InputError("calibration", "", "",
                     "the traces hold no compute ops, collectives or training steps to fit" + why);
  }
  Calibration out{base, {}};
  CalibrationReport& rep = out.report;
  rep.warnings = samples.warnings;
  spec::DeviceSpec& device = out.cluster.device;
  rep.compute_samples = static_cast<int64_t>(samples.compute.size());
  rep.comm_samples = static_cast<int64_t>(samples.comm.size());
  std::tie(rep.compute_error_before, rep.compute_time_error_before) =
      compute_errors(base.device, dtype, samples.compute);

  fit_memory_bound_ops(samples, device, rep);
  raise_measured_peak(samples, dtype, device, rep);
  fit_matrix_ops(samples, dtype, device, rep);
  fit_ops_by_name(samples, dtype, device);
  std::tie(rep.compute_error_after, rep.compute_time_error_after) =
      compute_errors(device, dtype, samples.compute);
  fit_step_overhead(samples, device, rep);
  fit_compute_jitter(samples, device, rep);
  fit_collectives(samples, base, out.cluster, rep);
  describe_calibration(out, base, samples, dtype);
  return out;
}

}  // namespace sextant::traces
