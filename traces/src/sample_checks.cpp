// Physical bounds on measurements before they are fitted.
#include "sextant/traces/sample_checks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "sextant/sim/compute_model.hpp"
#include "sextant/spec/limits.hpp"

namespace sextant::traces {

namespace {

// Samples left out, per reason: the count and the first one's description.
class Dropped {
 public:
  void add(const std::string& reason, const std::string& example) {
    auto [it, fresh] = by_reason_.try_emplace(reason, 0, example);
    ++it->second.first;
  }
  void report(std::vector<std::string>& warnings) const {
    for (const auto& [reason, count_example] : by_reason_)
      warnings.push_back(fmt::format("{} measurement(s) left out: {} (first: {})",
                                     count_example.first, reason, count_example.second));
  }

 private:
  std::map<std::string, std::pair<int64_t, std::string>> by_reason_;
};

bool positive_time(double seconds) {
  return std::isfinite(seconds) && seconds > 0 && seconds <= spec::kMaxSeconds;
}

void check_device_kinds(const Samples& samples, const spec::ClusterSpec& cluster) {
  for (const auto& [source, kind] : samples.ran_on) {
    if (kind == cluster.device.kind) continue;
    const bool cpu_profile = kind == spec::DeviceKind::kCpu;
    throw InputError(
        source, "", "",
        cpu_profile ? fmt::format("its ops ran on the CPU (the profile has no GPU kernels) and {} "
                                  "describes GPUs: profile with activities=[ProfilerActivity.CPU, "
                                  "ProfilerActivity.CUDA]",
                                  cluster.name)
                    : fmt::format("its ops ran on a GPU and {} describes CPU cores: calibrate a "
                                  "GPU cluster file with it",
                                  cluster.name));
  }
}

void screen_compute(const Samples& in, const spec::DeviceSpec& device, Samples& out,
                    Dropped& dropped) {
  double top_peak = 0;
  for (const auto& [dtype, tflops] : device.peak_tflops)
    top_peak = std::max(top_peak, tflops * kFlopsPerTflop);
  const double top_bandwidth = device.memory_bandwidth_GBps * kBytesPerGB;
  for (const ComputeSample& s : in.compute) {
    const std::string example =
        fmt::format("{} of {:.3g} FLOPs, {} B in {:.3g} s", s.name.empty() ? "an op" : s.name,
                    s.flops, s.bytes, s.seconds);
    if (!positive_time(s.seconds) || !std::isfinite(s.flops) || s.flops < 0 || s.bytes < 0) {
      dropped.add("a time that is not a positive finite number of seconds, or negative work",
                  example);
    } else if (sim::is_matrix_op(s.op_class) && s.flops / s.seconds > kMaxPeakFactor * top_peak) {
      dropped.add(fmt::format("matrix ops faster than {}x the device's highest peak ({:.0f} "
                              "TFLOP/s): their shapes or times are wrong",
                              kMaxPeakFactor, top_peak / kFlopsPerTflop),
                  example);
    } else if (!sim::is_matrix_op(s.op_class) &&
               static_cast<double>(s.bytes) / s.seconds > kMaxBandwidthFactor * top_bandwidth) {
      dropped.add(fmt::format("memory-bound ops faster than {}x the memory bandwidth ({:.0f} "
                              "GB/s): their shapes or times are wrong",
                              kMaxBandwidthFactor, device.memory_bandwidth_GBps),
                  example);
    } else {
      out.compute.push_back(s);
    }
  }
}

void screen_comm(const Samples& in, const spec::ClusterSpec& cluster, Samples& out,
                 Dropped& dropped) {
  // Every collective (and a send) moves at least its bytes x (p-1)/p through each member's link:
  // no more than 2x the fastest link's bandwidth per second of its time (pairs: 1x).
  double top_link = 0;
  for (const spec::NetworkLevel& level : cluster.network.levels)
    top_link = std::max(top_link, level.bandwidth_GBps * kBytesPerGB);
  using CommShape = std::tuple<spec::CollectiveKind, int64_t, int64_t, bool>;
  std::map<CommShape, std::vector<double>> times;
  for (const CommSample& c : in.comm)
    times[{c.collective, c.ranks, c.bytes, c.in_training}].push_back(c.seconds);
  std::map<CommShape, double> median;
  for (auto& [shape, t] : times) {
    if (t.size() < 3) continue;
    std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
    median[shape] = t[t.size() / 2];
  }
  for (const CommSample& c : in.comm) {
    const std::string example = fmt::format(
        "{} of {} B over {} ranks in {:.3g} s",
        spec::enum_name(spec::collective_kind_names(), c.collective), c.bytes, c.ranks, c.seconds);
    auto m = median.find({c.collective, c.ranks, c.bytes, c.in_training});
    if (!positive_time(c.seconds) || c.bytes <= 0) {
      dropped.add("a collective without bytes, or a time that is not a positive finite number",
                  example);
    } else if (c.ranks < 2) {
      dropped.add("a collective over fewer than 2 ranks moves nothing", example);
    } else if (top_link > 0 &&
               static_cast<double>(c.bytes) / c.seconds > 2 * kMaxBandwidthFactor * top_link) {
      dropped.add(fmt::format("collectives faster than {}x what the fastest link ({:.0f} GB/s) "
                              "allows: their sizes or times are wrong",
                              kMaxBandwidthFactor, top_link / kBytesPerGB),
                  example);
    } else if (m != median.end() && c.seconds > kMaxOutlierFactor * m->second) {
      dropped.add(fmt::format("a collective more than {}x its shape's median time (a stall, not "
                              "the transfer)",
                              kMaxOutlierFactor),
                  example);
    } else {
      out.comm.push_back(c);
    }
  }
}

}  // namespace

Samples screen_samples(const Samples& samples, const spec::ClusterSpec& cluster) {
  check_device_kinds(samples, cluster);
  Samples out;
  out.sources = samples.sources;
  out.warnings = samples.warnings;
  out.ran_on = samples.ran_on;
  Dropped dropped;
  screen_compute(samples, cluster.device, out, dropped);
  screen_comm(samples, cluster, out, dropped);
  for (const StepSample& s : samples.steps) {
    if (positive_time(s.step_s) && std::isfinite(s.busy_s) && s.busy_s >= 0)
      out.steps.push_back(s);
    else
      dropped.add("a training step without a positive finite time",
                  fmt::format("{}: {:.3g} s", s.source, s.step_s));
  }
  for (const SyncSample& s : samples.sync) {
    if (std::isfinite(s.spread_s) && s.spread_s >= 0 && positive_time(s.segment_s))
      out.sync.push_back(s);
    else
      dropped.add(
          "an arrival spread that is negative or not finite",
          fmt::format("{}: spread {:.3g} s after {:.3g} s", s.source, s.spread_s, s.segment_s));
  }
  dropped.report(out.warnings);
  return out;
}

}  // namespace sextant::traces
