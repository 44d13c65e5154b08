// The GEMM model and attention-kernel tables of a cluster file.
#include "sextant/spec/device_models.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace sextant::spec {

namespace {

// Linear interpolation of `ys` over `xs` in log(x), clamped at the ends.
double interpolate_log(const std::vector<double>& xs, const std::vector<double>& ys, double x) {
  if (x <= xs.front()) return ys.front();
  if (x >= xs.back()) return ys.back();
  for (size_t i = 1; i < xs.size(); ++i) {
    if (x <= xs[i]) {
      double t = (std::log(x) - std::log(xs[i - 1])) / (std::log(xs[i]) - std::log(xs[i - 1]));
      return ys[i - 1] + t * (ys[i] - ys[i - 1]);
    }
  }
  return ys.back();
}

// Throughput of the curves of one pass name and mask, interpolated over head_dim; nullopt when
// there is none.
std::optional<double> curves_tflops(const std::vector<AttentionCurve>& curves,
                                    std::string_view pass, bool causal, int64_t head_dim,
                                    int64_t seq_len) {
  const AttentionCurve* below = nullptr;
  const AttentionCurve* above = nullptr;
  for (const AttentionCurve& c : curves) {
    if (c.pass != pass || c.causal != causal) continue;
    if (c.head_dim <= head_dim && (!below || c.head_dim > below->head_dim)) below = &c;
    if (c.head_dim >= head_dim && (!above || c.head_dim < above->head_dim)) above = &c;
  }
  if (!below && !above) return std::nullopt;
  auto at = [&](const AttentionCurve* c) {
    return interpolate_log(c->seq_len, c->tflops, static_cast<double>(seq_len));
  };
  if (!below) return at(above);
  if (!above || above == below) return at(below);
  double t = static_cast<double>(head_dim - below->head_dim) /
             static_cast<double>(above->head_dim - below->head_dim);
  return at(below) + t * (at(above) - at(below));
}

std::optional<double> pass_tflops(const AttentionKernelData& d, std::string_view pass, bool causal,
                                  int64_t head_dim, int64_t seq_len) {
  if (auto v = curves_tflops(d.curves, pass, causal, head_dim, seq_len)) return v;
  if (auto v = curves_tflops(d.curves, "fwd+bwd", causal, head_dim, seq_len)) return v;
  return std::nullopt;
}

// A non-empty array of numbers > 0 (increasing when asked); problems name the element.
std::vector<double> positive_numbers(ObjectReader& r, std::string_view key, bool increasing) {
  std::vector<double> out;
  const Json* a = r.array(key);
  if (a == nullptr) return out;
  const std::string base = pointer_join(r.pointer(), key);
  if (a->empty()) r.problem(key, "[]", "needs at least one value");
  for (size_t i = 0; i < a->size(); ++i) {
    const Json& v = (*a)[i];
    if (!v.is_number() || v.get<double>() <= 0) {
      r.diagnostics().add(pointer_join(base, i), short_dump(v), "must be a number > 0");
      continue;
    }
    if (increasing && !out.empty() && v.get<double>() <= out.back()) {
      r.diagnostics().add(pointer_join(base, i), short_dump(v),
                          "must be larger than the entry before it");
      continue;
    }
    out.push_back(v.get<double>());
  }
  return out;
}

}  // namespace

AttentionKernel attention_data_kernel(const std::map<AttentionKernel, AttentionKernelData>& kernels,
                                      AttentionKernel kernel) {
  auto it = kernels.find(kernel);
  for (int hops = 0; it != kernels.end() && it->second.same_as && hops < 4; ++hops) {
    kernel = *it->second.same_as;
    it = kernels.find(kernel);
  }
  return kernel;
}

double attention_tflops(const std::map<AttentionKernel, AttentionKernelData>& kernels,
                        const std::string& device, AttentionKernel kernel, int64_t head_dim,
                        int64_t seq_len, bool causal, bool backward) {
  auto it = kernels.find(attention_data_kernel(kernels, kernel));
  if (it == kernels.end() || it->second.curves.empty()) {
    std::vector<std::string_view> have;
    for (const auto& [k, d] : kernels) have.push_back(enum_name(attention_kernel_names(), k));
    throw InputError("device " + device, "/device/attention_kernels",
                     std::string(enum_name(attention_kernel_names(), kernel)),
                     "the cluster file has no throughput data for this attention kernel (it has " +
                         (have.empty() ? std::string("none") : join_names(have)) +
                         "): choose another stack or attention kernel");
  }
  const AttentionKernelData& d = it->second;
  std::string_view pass = backward ? "bwd" : "fwd";
  if (auto v = pass_tflops(d, pass, causal, head_dim, seq_len)) return *v;
  // No curve for this mask in this pass: causal masking costs the same fraction of throughput in
  // both passes (the same block skipping and load imbalance), so take it from the other pass.
  std::string_view other = backward ? "fwd" : "bwd";
  auto base = pass_tflops(d, pass, !causal, head_dim, seq_len);
  auto num = pass_tflops(d, other, causal, head_dim, seq_len);
  auto den = pass_tflops(d, other, !causal, head_dim, seq_len);
  if (!base || !num || !den) {
    throw InputError(
        "device " + device,
        "/device/attention_kernels/" + std::string(enum_name(attention_kernel_names(), it->first)),
        "",
        fmt::format("no {} {} curve for head dim {} (give one, or a fwd+bwd curve)",
                    causal ? "causal" : "non-causal", pass, head_dim));
  }
  return *base * *num / *den;
}

GemmModel decode_gemm_model(ObjectReader& r) {
  GemmModel g;
  g.sms = r.integer("sms", Range::at_least(1)).value_or(1);
  g.peak_clock_MHz = r.number("peak_clock_MHz", Range::positive()).value_or(1);
  // Required unless the device has a power object (decode_device checks which).
  g.clock_MHz = r.number("clock_MHz", Range::positive(), Presence::kOptional).value_or(0);
  g.mainloop_efficiency = r.number("mainloop_efficiency", Range::fraction()).value_or(1);
  g.tile_overhead_k = r.number("tile_overhead_k", Range::non_negative()).value_or(0);
  g.kernel_overhead_us = r.number("kernel_overhead_us", Range::non_negative()).value_or(0);
  g.max_split_k = r.integer("max_split_k", Range::between(1, 64)).value_or(1);
  g.misaligned_efficiency =
      r.number("misaligned_efficiency", Range::between(1e-3, 1), Presence::kOptional).value_or(1);
  g.fp8_split_accumulator_efficiency =
      r.number("fp8_split_accumulator_efficiency", Range::between(1e-3, 1), Presence::kOptional)
          .value_or(1);
  if (const Json* tiles = r.array("tiles")) {
    std::string base = pointer_join(r.pointer(), "tiles");
    for (size_t i = 0; i < tiles->size(); ++i) {
      const Json& t = (*tiles)[i];
      const std::string at = pointer_join(base, i);
      if (!t.is_array() || t.size() != 2) {
        r.diagnostics().add(at, short_dump(t), "must be [rows, columns] of a tile");
        continue;
      }
      bool ok = true;
      for (size_t j = 0; j < 2; ++j) {
        if (!t[j].is_number_integer() || t[j].get<int64_t>() < 1) {
          r.diagnostics().add(pointer_join(at, j), short_dump(t[j]), "must be an integer > 0");
          ok = false;
        }
      }
      if (!ok) continue;
      g.tiles.push_back({t[0].get<int64_t>(), t[1].get<int64_t>()});
    }
    if (tiles->empty()) r.problem("tiles", "[]", "needs at least one tile");
  }
  g.source = r.string("source").value_or("");
  r.finish();
  return g;
}

std::map<AttentionKernel, AttentionKernelData> decode_attention_kernels(ObjectReader& r) {
  std::map<AttentionKernel, AttentionKernelData> out;
  for (const auto& [name, kernel] : attention_kernel_names()) {
    if (kernel == AttentionKernel::kUnfused) continue;
    auto k = r.object(name, Presence::kOptional);
    if (!k) continue;
    AttentionKernelData d;
    d.same_as = k->enumeration("same_as", attention_kernel_names(), Presence::kOptional);
    if (d.same_as && (*d.same_as == AttentionKernel::kUnfused || *d.same_as == kernel))
      k->problem("same_as", std::string(enum_name(attention_kernel_names(), *d.same_as)),
                 "must name another fused kernel");
    if (const Json* curves = k->array("curves", Presence::kOptional)) {
      std::string base = pointer_join(k->pointer(), "curves");
      for (size_t i = 0; i < curves->size(); ++i) {
        ObjectReader c = element_reader(*curves, base, i, r.diagnostics());
        AttentionCurve curve;
        curve.head_dim = c.integer("head_dim", Range::at_least(1)).value_or(1);
        curve.causal = c.boolean("causal").value_or(false);
        curve.pass = c.string("pass").value_or("fwd");
        if (curve.pass != "fwd" && curve.pass != "bwd" && curve.pass != "fwd+bwd")
          c.problem("pass", short_dump(Json(curve.pass)), "must be fwd, bwd or fwd+bwd");
        curve.seq_len = positive_numbers(c, "seq_len", /*increasing=*/true);
        curve.tflops = positive_numbers(c, "tflops", /*increasing=*/false);
        c.finish();
        if (curve.tflops.size() != curve.seq_len.size())
          c.problem(
              "tflops", fmt::format("{} values", curve.tflops.size()),
              fmt::format("must give one throughput per seq_len entry ({})", curve.seq_len.size()));
        d.curves.push_back(std::move(curve));
      }
    }
    if (!d.same_as && d.curves.empty()) k->problem("curves", "", "give \"curves\" or \"same_as\"");
    d.clock_MHz = k->number("clock_MHz", Range::positive(), Presence::kOptional);
    if (auto drop = k->object("dropout_ps_per_score", Presence::kOptional)) {
      AttentionDropoutCost cost;
      cost.fwd_ps = drop->number("fwd", Range::non_negative()).value_or(0);
      cost.bwd_ps = drop->number("bwd", Range::non_negative()).value_or(0);
      drop->finish();
      d.dropout = cost;
    }
    d.source = k->string("source").value_or("");
    k->finish();
    out[kernel] = std::move(d);
  }
  r.finish();
  for (const auto& [kernel, d] : out) {
    if (!d.same_as) continue;
    // Follow the chain: it must end at a kernel with curves, without a cycle.
    std::optional<AttentionKernel> at = d.same_as;
    for (size_t hops = 0; at && hops <= out.size(); ++hops) {
      auto next = out.find(*at);
      if (next == out.end() || !next->second.same_as) break;
      at = next->second.same_as;
    }
    auto end = at ? out.find(*at) : out.end();
    if (end == out.end() || end->second.curves.empty())
      r.problem(std::string(enum_name(attention_kernel_names(), kernel)) + "/same_as",
                std::string(enum_name(attention_kernel_names(), *d.same_as)),
                "must lead to a kernel this file gives curves for (no cycle)");
  }
  return out;
}

Json to_json(const GemmModel& g) {
  Json tiles = Json::array();
  for (const GemmTile& t : g.tiles) tiles.push_back({t.m, t.n});
  Json j = {{"sms", g.sms},
            {"peak_clock_MHz", g.peak_clock_MHz},
            {"mainloop_efficiency", g.mainloop_efficiency},
            {"tile_overhead_k", g.tile_overhead_k},
            {"kernel_overhead_us", g.kernel_overhead_us},
            {"tiles", tiles},
            {"max_split_k", g.max_split_k},
            {"misaligned_efficiency", g.misaligned_efficiency},
            {"fp8_split_accumulator_efficiency", g.fp8_split_accumulator_efficiency},
            {"source", g.source}};
  if (g.clock_MHz > 0) j["clock_MHz"] = g.clock_MHz;
  return j;
}

Json to_json(const std::map<AttentionKernel, AttentionKernelData>& kernels) {
  Json out = Json::object();
  for (const auto& [kernel, d] : kernels) {
    Json k = Json::object();
    if (d.same_as) k["same_as"] = enum_name(attention_kernel_names(), *d.same_as);
    if (!d.curves.empty()) {
      Json curves = Json::array();
      for (const AttentionCurve& c : d.curves)
        curves.push_back({{"head_dim", c.head_dim},
                          {"causal", c.causal},
                          {"pass", c.pass},
                          {"seq_len", c.seq_len},
                          {"tflops", c.tflops}});
      k["curves"] = curves;
    }
    if (d.clock_MHz) k["clock_MHz"] = *d.clock_MHz;
    if (d.dropout)
      k["dropout_ps_per_score"] = {{"fwd", d.dropout->fwd_ps}, {"bwd", d.dropout->bwd_ps}};
    k["source"] = d.source;
    out[std::string(enum_name(attention_kernel_names(), kernel))] = k;
  }
  return out;
}

}  // namespace sextant::spec
