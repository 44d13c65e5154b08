// The power-limited clock of a GPU (power_model.hpp) and its cluster-file object.
#include "sextant/spec/power_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "sextant/spec/error.hpp"

namespace sextant::spec {

namespace {

// Dynamic power grows with the cube of the clock (power_model.hpp).
constexpr double kPowerExponent = 3.0;

// The clock given for `dtype` in `clocks`, bf16's when the dtype has none; 0 when neither is.
double clock_for(const std::map<Dtype, double>& clocks, Dtype dtype) {
  auto it = clocks.find(dtype);
  if (it == clocks.end()) it = clocks.find(Dtype::kBf16);
  return it == clocks.end() ? 0.0 : it->second;
}

// The tensor-core SM clock measured for `dtype` at rated_W.
double tensor_clock(const PowerModel& p, Dtype dtype) {
  const double clock = clock_for(p.tensor_clock_MHz, dtype);
  SEXTANT_CHECK(clock > 0, "power model without a bf16 tensor clock");
  return clock;
}

// What the board would draw above idle at the boost clock for this mix of work: tensor-core
// work's from its measured clock at rated_W (P(f) inverted at that point), memory-bound work's
// as measured.
double dynamic_at_max_W(const PowerModel& p, Dtype dtype, double tensor_share) {
  const double share = std::clamp(tensor_share, 0.0, 1.0);
  const double tensor =
      (p.rated_W - p.idle_W) * std::pow(p.max_clock_MHz / tensor_clock(p, dtype), kPowerExponent);
  const double memory = p.memory_bound_W - p.idle_W;
  return share * tensor + (1 - share) * memory;
}

constexpr std::array<std::pair<Dtype, std::string_view>, 5> kTensorDtypes{{{Dtype::kFp32, "fp32"},
                                                                           {Dtype::kTf32, "tf32"},
                                                                           {Dtype::kBf16, "bf16"},
                                                                           {Dtype::kFp16, "fp16"},
                                                                           {Dtype::kFp8, "fp8"}}};

}  // namespace

double board_power_W(const PowerModel& p, Dtype gemm_dtype, double tensor_share, double clock_MHz) {
  return p.idle_W + dynamic_at_max_W(p, gemm_dtype, tensor_share) *
                        std::pow(clock_MHz / p.max_clock_MHz, kPowerExponent);
}

double sustained_clock_MHz(const PowerModel& p, Dtype gemm_dtype, double tensor_share) {
  if (p.locked_clock_MHz) return *p.locked_clock_MHz;
  const double dynamic = dynamic_at_max_W(p, gemm_dtype, tensor_share);
  if (dynamic <= 0) return p.max_clock_MHz;
  // P(f) = limit solved for f, never above the boost clock.
  const double ratio = std::pow((p.limit_W - p.idle_W) / dynamic, 1.0 / kPowerExponent);
  return p.max_clock_MHz * std::min(1.0, ratio);
}

double gemm_model_clock_MHz(const PowerModel& p, Dtype gemm_dtype, double sm_clock_MHz) {
  if (p.gemm_clock_MHz.empty()) return sm_clock_MHz;
  // A dtype measured with both clocks has its own ratio; any other, bf16's.
  const Dtype measured =
      p.gemm_clock_MHz.contains(gemm_dtype) && p.tensor_clock_MHz.contains(gemm_dtype)
          ? gemm_dtype
          : Dtype::kBf16;
  const double ratio = clock_for(p.gemm_clock_MHz, measured) / tensor_clock(p, measured);
  return std::min(p.max_clock_MHz, sm_clock_MHz * ratio);
}

namespace {

// A per-dtype clock object (tensor_clock_MHz, gemm_clock_MHz): positive numbers, bf16 required.
std::map<Dtype, double> decode_clocks(ObjectReader& clocks, const std::string& what) {
  std::map<Dtype, double> out;
  for (const auto& [dtype, name] : kTensorDtypes) {
    if (auto v = clocks.number(name, Range::positive(), Presence::kOptional)) out[dtype] = *v;
  }
  if (!out.contains(Dtype::kBf16))
    clocks.problem("bf16", "(missing)", fmt::format("must give the bf16 {}", what));
  return out;
}

}  // namespace

PowerModel decode_power_model(ObjectReader& r) {
  PowerModel p;
  p.limit_W = r.number("limit_W", Range::positive()).value_or(1);
  p.max_clock_MHz = r.number("max_clock_MHz", Range::positive()).value_or(1);
  p.idle_W = r.number("idle_W", Range::positive()).value_or(0);
  p.memory_bound_W = r.number("memory_bound_W", Range::positive()).value_or(0);
  p.rated_W = r.number("rated_W", Range::positive()).value_or(1);
  if (auto clocks = r.object("tensor_clock_MHz")) {
    p.tensor_clock_MHz = decode_clocks(*clocks, "tensor-core clock");
    for (const auto& [dtype, clock] : p.tensor_clock_MHz) {
      if (clock > p.max_clock_MHz)
        clocks->problem(enum_name(dtype_names(), dtype), fmt::format("{}", clock),
                        fmt::format("must be <= max_clock_MHz ({})", p.max_clock_MHz));
    }
    clocks->finish();
  }
  if (auto clocks = r.object("gemm_clock_MHz", Presence::kOptional)) {
    p.gemm_clock_MHz = decode_clocks(*clocks, "GEMM model clock");
    clocks->finish();
  }
  p.locked_clock_MHz = r.number("locked_clock_MHz", Range::positive(), Presence::kOptional);
  p.source = r.string("source").value_or("");
  if (p.limit_W <= p.idle_W)
    r.problem("limit_W", fmt::format("{}", p.limit_W),
              fmt::format("must be > idle_W ({}): the GPU could not run", p.idle_W));
  if (p.rated_W <= p.idle_W)
    r.problem("rated_W", fmt::format("{}", p.rated_W),
              fmt::format("must be > idle_W ({})", p.idle_W));
  if (p.memory_bound_W < p.idle_W)
    r.problem("memory_bound_W", fmt::format("{}", p.memory_bound_W),
              fmt::format("must be >= idle_W ({})", p.idle_W));
  if (p.locked_clock_MHz && *p.locked_clock_MHz > p.max_clock_MHz)
    r.problem("locked_clock_MHz", fmt::format("{}", *p.locked_clock_MHz),
              fmt::format("must be <= max_clock_MHz ({})", p.max_clock_MHz));
  r.finish();
  return p;
}

Json to_json(const PowerModel& p) {
  Json clocks = Json::object();
  for (const auto& [dtype, clock] : p.tensor_clock_MHz)
    clocks[std::string(enum_name(dtype_names(), dtype))] = clock;
  Json j = {{"limit_W", p.limit_W},       {"max_clock_MHz", p.max_clock_MHz},
            {"idle_W", p.idle_W},         {"memory_bound_W", p.memory_bound_W},
            {"tensor_clock_MHz", clocks}, {"rated_W", p.rated_W}};
  if (!p.gemm_clock_MHz.empty()) {
    Json gemm = Json::object();
    for (const auto& [dtype, clock] : p.gemm_clock_MHz)
      gemm[std::string(enum_name(dtype_names(), dtype))] = clock;
    j["gemm_clock_MHz"] = gemm;
  }
  if (p.locked_clock_MHz) j["locked_clock_MHz"] = *p.locked_clock_MHz;
  j["source"] = p.source;
  return j;
}

}  // namespace sextant::spec
