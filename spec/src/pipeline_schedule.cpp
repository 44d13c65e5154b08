// Pipeline schedules as unit sequences.
#include "sextant/spec/pipeline_schedule.hpp"

#include <algorithm>

#include "sextant/spec/error.hpp"

namespace sextant::spec {

std::vector<ScheduleUnit> pipeline_schedule(Schedule schedule, int64_t pp, int64_t vpp, int64_t m,
                                            int64_t stage) {
  SEXTANT_CHECK(pp >= 1 && vpp >= 1 && m >= 1 && stage >= 0 && stage < pp, "bad schedule request");
  std::vector<ScheduleUnit> units;
  if (pp == 1 && vpp == 1) {
    // No pipeline: gradient accumulation, each micro-batch forward then backward.
    for (int64_t i = 0; i < m; ++i) {
      units.push_back({true, i, 0});
      units.push_back({false, i, 0});
    }
    return units;
  }
  if (schedule == Schedule::kGpipe && vpp == 1) {
    for (int64_t i = 0; i < m; ++i) units.push_back({true, i, 0});
    for (int64_t i = 0; i < m; ++i) units.push_back({false, i, 0});
    return units;
  }
  if (vpp == 1) {
    // 1F1B: warm up with pp - stage - 1 forwards, alternate, then drain the backwards.
    int64_t warmup = std::min(pp - stage - 1, m);
    for (int64_t i = 0; i < warmup; ++i) units.push_back({true, i, 0});
    for (int64_t i = 0; i < m - warmup; ++i) {
      units.push_back({true, warmup + i, 0});
      units.push_back({false, i, 0});
    }
    for (int64_t i = m - warmup; i < m; ++i) units.push_back({false, i, 0});
    return units;
  }
  // Interleaved 1F1B (Megatron-LM forward_backward_pipelining_with_interleaving): micro-batches
  // go through the chunks in groups of pp.
  SEXTANT_CHECK(m % pp == 0, "interleaving needs micro-batches ({}) divisible by pp ({})", m, pp);
  const int64_t total = m * vpp;
  int64_t warmup = m == pp ? total : std::min((pp - stage - 1) * 2 + (vpp - 1) * pp, total);
  auto unit = [&](int64_t k, bool forward) {
    int64_t in_group = k % (pp * vpp);
    int64_t chunk = in_group / pp;
    if (!forward) chunk = vpp - 1 - chunk;
    return ScheduleUnit{forward, (k / (pp * vpp)) * pp + k % pp, chunk};
  };
  for (int64_t k = 0; k < warmup; ++k) units.push_back(unit(k, true));
  for (int64_t i = 0; i < total - warmup; ++i) {
    units.push_back(unit(warmup + i, true));
    units.push_back(unit(i, false));
  }
  for (int64_t k = total - warmup; k < total; ++k) units.push_back(unit(k, false));
  return units;
}

int64_t peak_in_flight(const std::vector<ScheduleUnit>& units) {
  int64_t live = 0;
  int64_t peak = 0;
  for (const ScheduleUnit& u : units) {
    live += u.forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace sextant::spec
