// GPU kernels of a Kineto trace by op class; gzip-compressed JSON files.
#include "sextant/traces/kernel_classes.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "kineto_fields.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::traces {

namespace {

bool has(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

spec::OpClass kernel_class(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (has(n, "nccl")) return spec::OpClass::kAllReduce;
  if (has(n, "sdpa") || has(n, "flash") || has(n, "fmha") || has(n, "attention") ||
      has(n, "cudnn::fusion") || has(n, "dot_do_o") || has(n, "convert_dq"))
    return spec::OpClass::kAttention;
  if (has(n, "nvjet") || has(n, "gemm") || has(n, "cutlass") || has(n, "xmma"))
    return spec::OpClass::kGemm;
  if (has(n, "layer_norm") || has(n, "gammabeta") || has(n, "rms_norm") || has(n, "layernorm"))
    return spec::OpClass::kNorm;
  if (has(n, "softmax") || has(n, "nll_loss") || has(n, "cross_entropy"))
    return spec::OpClass::kLoss;
  if (has(n, "multi_tensor_apply") || has(n, "adam")) return spec::OpClass::kOptimizer;
  if (has(n, "embedding") || has(n, "indexing_backward") || has(n, "compute_grad_weight") ||
      has(n, "sum_and_scatter") || has(n, "radix_sort") || has(n, "gather_kernel"))
    return spec::OpClass::kEmbedding;
  return spec::OpClass::kElementwise;
}

KernelTimes kernel_times(const spec::Json& json, const std::string& source) {
  if (!json.is_object() || !json.contains("traceEvents") || !json.at("traceEvents").is_array())
    throw InputError(source, "/traceEvents", "", "missing: not a Chrome/Kineto trace");
  KernelTimes out;
  std::vector<double> step_ends_us;
  for (const spec::Json& e : json.at("traceEvents")) {
    if (!e.is_object()) continue;
    const std::optional<double> dur = kineto::number(e, "dur");
    if (!dur || !std::isfinite(*dur) || *dur < 0) continue;
    const std::string cat = kineto::text(e, "cat");
    const std::string name = kineto::text(e, "name");
    if (cat == "kernel") {
      const spec::OpClass c = kernel_class(name);
      out.seconds[c] += *dur * 1e-6;
      ++out.counts[c];
      ++out.kernels;
    } else if (cat == "gpu_memset" || cat == "gpu_memcpy") {
      out.seconds[spec::OpClass::kElementwise] += *dur * 1e-6;
      ++out.counts[spec::OpClass::kElementwise];
      ++out.kernels;
    } else if (cat == "user_annotation" && name.rfind("Optimizer.step", 0) == 0) {
      ++out.steps;
    } else if (cat == "gpu_user_annotation" && name.rfind("Optimizer.step", 0) == 0) {
      const std::optional<double> ts = kineto::number(e, "ts");
      if (ts && std::isfinite(*ts)) step_ends_us.push_back(*ts + *dur);
    }
  }
  if (step_ends_us.size() >= 2) {
    std::sort(step_ends_us.begin(), step_ends_us.end());
    out.wall_step_s = (step_ends_us.back() - step_ends_us.front()) * 1e-6 /
                      static_cast<double>(step_ends_us.size() - 1);
  }
  if (out.kernels == 0)
    throw InputError(source, "/traceEvents", "",
                     "no GPU kernels: profile with ProfilerActivity.CUDA on a GPU");
  // Kineto records an annotation both on the CPU and on the GPU timeline.
  return out;
}

KernelTimes merge_ranks(const std::vector<KernelTimes>& ranks) {
  KernelTimes out;
  int64_t walls = 0;
  for (const KernelTimes& r : ranks) {
    for (const auto& [c, t] : r.seconds) out.seconds[c] += t;
    for (const auto& [c, n] : r.counts) out.counts[c] += n;
    out.steps += r.steps;
    out.kernels += r.kernels;
    if (r.wall_step_s > 0) {
      out.wall_step_s += r.wall_step_s;
      ++walls;
    }
  }
  if (walls > 0) out.wall_step_s /= static_cast<double>(walls);
  return out;
}

}  // namespace sextant::traces
