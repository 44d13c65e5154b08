// The run summary's reading of how steady the cores were (step_steadiness.hpp says why).
#include "step_steadiness.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "sextant/spec/step_times.hpp"
#include "sextant/traces/rank_speeds.hpp"

namespace sextant::cli {

namespace {

constexpr size_t kFewestSteps = 3;  // fewer: one slow step would be the whole verdict

std::string milliseconds(double seconds) {
  return fmt::format("{:.2f} ms", 1e3 * seconds);
}

}  // namespace

std::string steadiness_lines(const spec::Trace& trace, const std::vector<StepTime>& steps,
                             double predicted_s) {
  std::vector<double> times;
  for (const StepTime& s : steps) times.push_back(s.seconds);
  const size_t dropped = times.size() - spec::steps_after_warmup(times).size();
  if (dropped >= steps.size()) return "";
  const std::map<int64_t, double> slowdowns = traces::step_slowdowns(trace, steps[dropped].step);
  std::vector<double> slow, steady_s;  // slow steps' slowdowns; steady steps' times
  for (size_t i = dropped; i < steps.size(); ++i) {
    const auto it = slowdowns.find(steps[i].step);
    if (it == slowdowns.end()) continue;
    if (it->second > kSteadyTolerance)
      slow.push_back(it->second);
    else
      steady_s.push_back(steps[i].seconds);
  }
  const size_t judged = slow.size() + steady_s.size();
  if (judged < kFewestSteps) return "";
  if (slow.empty()) {
    double most = 0;
    for (const auto& [step, s] : slowdowns) most = std::max(most, s);
    return fmt::format(
        "cores steady: every step's compute within {:.1f}% of the fastest ({} steps)\n", 100 * most,
        judged);
  }
  const auto [least, most] = std::minmax_element(slow.begin(), slow.end());
  std::string out = fmt::format(
      "cores slowed: in {} of {} steps a rank computed {:.0f}-{:.0f}% slower than in its fastest "
      "step\n  (the same ops each step); steady steps: {}",
      slow.size(), judged, 100 * *least, 100 * *most, steady_s.size());
  if (steady_s.size() < kFewestSteps) return out + ", too few to hold the prediction against\n";
  double sum = 0;
  for (double t : steady_s) sum += t;
  const double mean = sum / static_cast<double>(steady_s.size());
  out += fmt::format(", mean {}", milliseconds(mean));
  if (predicted_s > 0) {
    const double off = mean / predicted_s - 1;
    out += fmt::format(", {:.1f}% {} than predicted", 100 * std::abs(off),
                       off >= 0 ? "slower" : "faster");
  }
  return out + "\n";
}

}  // namespace sextant::cli
