// Op costs: roofline, GEMM tiles and waves, published fused-attention throughput.
#include "sextant/sim/compute_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace sextant::sim {

bool is_matrix_op(spec::OpClass c) {
  return c == spec::OpClass::kGemm || c == spec::OpClass::kAttention || c == spec::OpClass::kConv;
}

namespace {

double default_clock_MHz(const spec::DeviceSpec& device, spec::Dtype gemm_dtype) {
  if (device.power)
    return spec::gemm_model_clock_MHz(*device.power, gemm_dtype,
                                      spec::sustained_clock_MHz(*device.power, gemm_dtype, 1.0));
  return device.gemm_model ? device.gemm_model->clock_MHz : 0.0;
}

}  // namespace

ComputeModel::ComputeModel(const spec::DeviceSpec& device, spec::Dtype dtype,
                           spec::AttentionKernel attention, std::optional<spec::Dtype> gemm_dtype,
                           std::optional<double> clock_MHz)
    : device_(&device),
      dtype_(dtype),
      attention_(attention),
      peak_flops_(device.peak_flops(dtype)),
      gemm_peak_flops_(device.peak_flops(gemm_dtype.value_or(dtype))),
      tile_overhead_scale_(device.peak_tflops.contains(spec::Dtype::kBf16)
                               ? gemm_peak_flops_ / device.peak_flops(spec::Dtype::kBf16)
                               : 1.0),
      fp8_gemms_(gemm_dtype.value_or(dtype) == spec::Dtype::kFp8),
      clock_MHz_(clock_MHz.value_or(default_clock_MHz(device, gemm_dtype.value_or(dtype)))) {}

// The op's bytes by the kernels that move them, each kernel at its own bandwidth: the family's
// (spec::MemoryKernel), eager PyTorch's dynamic-casting kernels', and a kernel of fewer thread
// blocks than SMs at most its blocks' own bandwidth (DeviceSpec::block_bandwidth_GBps).
double ComputeModel::memory_bound_seconds(const models::Op& op) const {
  const double peak = device_->memory_bandwidth_GBps * kBytesPerGB;
  const double family = peak * device_->memory_efficiency_for(op.op_class, op.memory_kernel);
  const double mixed =
      peak * device_->memory_efficiency_for(op.op_class, spec::MemoryKernel::kMixedDtype);
  double narrow = family;
  if (op.narrow_blocks > 0 && device_->block_bandwidth_GBps > 0)
    narrow = std::min(family, static_cast<double>(op.narrow_blocks) *
                                  device_->block_bandwidth_GBps * kBytesPerGB);
  const double rest = static_cast<double>(op.bytes - op.mixed_dtype_bytes - op.narrow_bytes);
  return std::max(0.0, rest) / family + static_cast<double>(op.mixed_dtype_bytes) / mixed +
         static_cast<double>(op.narrow_bytes) / narrow;
}

double ComputeModel::seconds(double flops, double bytes, spec::OpClass op_class,
                             std::string_view op_key) const {
  const bool matrix = is_matrix_op(op_class) && flops > 0;
  double gemm_eff = matrix ? device_->gemm_efficiency_at(flops) : 1.0;
  double mem_eff = device_->memory_efficiency_for(op_class);
  if (!op_key.empty()) {
    if (auto e = device_->op_efficiency(std::string(op_key), matrix ? flops : bytes)) {
      if (matrix) {
        gemm_eff = *e;
      } else {
        mem_eff = *e;
      }
    }
  }
  double compute = matrix ? co_run_matrix_ * flops / (gemm_peak_flops_ * gemm_eff) : 0.0;
  double memory = co_run_memory_ * bytes / (device_->memory_bandwidth_GBps * kBytesPerGB * mem_eff);
  return std::max(compute, memory) + device_->launch_overhead_us * 1e-6;
}

// NVIDIA, "Matrix Multiplication Background User's Guide" §3 (tile and wave quantization): the
// output is cut into tm x tn tiles, one thread block each; the SMs run them in waves, a partial
// wave costing a whole one. A tile streams its K dimension through the tensor cores, plus a
// pipeline fill and epilogue worth `tile_overhead_k` elements of K. cuBLAS chooses among its
// tiles and may split K over several blocks (their fp32 partial outputs are then summed), which
// fills the GPU when M x N has few tiles; the model takes the fastest choice.
double ComputeModel::matmul_seconds(const models::MatmulShape& s, bool in_gemm_dtype) const {
  const spec::GemmModel& g = *device_->gemm_model;
  const double peak = in_gemm_dtype ? gemm_peak_flops_ : peak_flops_;
  const double overhead_scale = in_gemm_dtype ? tile_overhead_scale_ : 1.0;
  const double sm_flops =
      peak / static_cast<double>(g.sms) * (clock_MHz_ / g.peak_clock_MHz) * g.mainloop_efficiency;
  const double bandwidth = device_->memory_bandwidth_GBps * kBytesPerGB *
                           device_->memory_efficiency_for(spec::OpClass::kGemm);
  const double k = static_cast<double>(s.k);
  double best = std::numeric_limits<double>::infinity();
  for (const spec::GemmTile& t : g.tiles) {
    const int64_t tiles = s.batch * ((s.m + t.m - 1) / t.m) * ((s.n + t.n - 1) / t.n);
    for (int64_t split = 1; split <= g.max_split_k; ++split) {
      if (split > 1 && k / static_cast<double>(split) < 128) break;
      const int64_t blocks = tiles * split;
      const double waves = static_cast<double>((blocks + g.sms - 1) / g.sms);
      // The fill and epilogue take the same time whatever the tensor cores' rate (loading the
      // first stages, writing the 16-bit output tile): tile_overhead_k is in 16-bit K elements,
      // twice as many fp8 ones.
      double time = waves * 2.0 * static_cast<double>(t.m * t.n) *
                    (k / static_cast<double>(split) + g.tile_overhead_k * overhead_scale) /
                    sm_flops;
      if (split > 1) {
        // Partial outputs written and read in fp32, the sum written in the output type.
        const double out = static_cast<double>(s.batch * s.m * s.n);
        time += out * (8.0 * static_cast<double>(split) + spec::dtype_bytes(dtype_)) / bandwidth;
      }
      best = std::min(best, time);
    }
  }
  // Row-major Y[M x N] = X[M x K] W^T: the operands' leading dimensions are N and K, never the
  // rows M. The lowering's backward shapes keep that reading (dgrad {M, K, N}, wgrad {K, N, M}:
  // models/src/lowering_ops.cpp), so a width off the 16-byte grid (GPT-2's unpadded 50257-row
  // vocabulary) shows up as N or K in all three GEMMs and takes the slow kernels. (A token count
  // off the grid would be K of the wgrad and priced slow too; b x s is a multiple of 8 in
  // practice.)
  const int64_t grid = std::max<int64_t>(1, 16 / spec::dtype_bytes(dtype_));
  if (s.n % grid != 0 || s.k % grid != 0) best /= g.misaligned_efficiency;
  return best + g.kernel_overhead_us * 1e-6;
}

double ComputeModel::attention_seconds(const models::Op& op, bool backward) const {
  SEXTANT_CHECK(op.shape.size() == 4, "fused attention op {} needs shape {{b*h, s, s, d}}",
                op.name);
  double tflops = spec::attention_tflops(device_->attention_kernels, device_->name, attention_,
                                         op.shape[3], op.shape[1], op.causal, backward);
  // A kernel's published throughput holds at the clock it was measured at; it runs at this one.
  const spec::AttentionKernelData& data = device_->attention_kernels.at(
      spec::attention_data_kernel(device_->attention_kernels, attention_));
  const double clock_ratio = data.clock_MHz && clock_MHz_ > 0 ? clock_MHz_ / *data.clock_MHz : 1.0;
  double seconds = op.executed_flops() / (tflops * clock_ratio * kFlopsPerTflop);
  if (op.dropout && data.dropout) {
    // One random number per score element the kernel computes (shape {b*heads, sq, sk, d}).
    const double scores = static_cast<double>(op.shape[0]) * static_cast<double>(op.shape[1]) *
                          static_cast<double>(op.shape[2]) * (op.causal ? 0.5 : 1.0);
    const double ps = backward ? data.dropout->bwd_ps : data.dropout->fwd_ps;
    seconds += scores * ps * 1e-12 / clock_ratio;
  }
  return seconds;
}

Picoseconds ComputeModel::op_time(const models::Op& op, spec::Phase phase) const {
  const std::string key = spec::efficiency_key(op.name, phase);
  const double launches = device_->launch_overhead_us * 1e-6 * op.kernels;
  // The most loaded rank's work (models::Op::load_factor): its kernels run as many launches.
  const double load = op.load_factor;
  if (device_->efficiency_by_op.count(key) > 0) {
    // Calibrated for this op: one efficiency replaces the models below.
    return seconds_to_ps(
        load * (seconds(op.executed_flops(), static_cast<double>(op.bytes), op.op_class, key) -
                device_->launch_overhead_us * 1e-6) +
        launches);
  }
  const double memory = memory_bound_seconds(op);
  double compute = 0;
  if (op.fused_attention) {
    compute = attention_seconds(op, phase == spec::Phase::kBwd);
  } else if (is_matrix_op(op.op_class) && op.flops > 0) {
    // Under an fp8 recipe only the ops it quantizes run at the fp8 rate; the rest in 16 bits.
    const bool in_gemm_dtype = !fp8_gemms_ || models::fp8_recipe_quantizes(op.id);
    if (device_->gemm_model && !op.matmuls.empty()) {
      for (const models::MatmulShape& m : op.matmuls) compute += matmul_seconds(m, in_gemm_dtype);
      // Backward fp8 GEMMs accumulate in full precision (GemmModel).
      if (fp8_gemms_ && in_gemm_dtype && phase == spec::Phase::kBwd)
        compute /= device_->gemm_model->fp8_split_accumulator_efficiency;
    } else {
      const double flops = op.executed_flops();
      const double peak = in_gemm_dtype ? gemm_peak_flops_ : peak_flops_;
      compute = flops / (peak * device_->gemm_efficiency_at(flops));
    }
  }
  return seconds_to_ps(load * std::max(co_run_matrix_ * compute, co_run_memory_ * memory) +
                       launches);
}

int64_t busy_devices_per_node(const spec::ClusterSpec& cluster, int64_t ranks) {
  return std::clamp<int64_t>(ranks, 1, cluster.devices_per_node);
}

void ComputeModel::set_busy_devices(int64_t busy) {
  co_run_matrix_ = device_->co_run ? device_->co_run->at(true, busy) : 1.0;
  co_run_memory_ = device_->co_run ? device_->co_run->at(false, busy) : 1.0;
}

Picoseconds ComputeModel::optimizer_time(int64_t params, int64_t bytes_per_param) const {
  double bytes = static_cast<double>(params * bytes_per_param);
  return seconds_to_ps(
      seconds(0, bytes, spec::OpClass::kOptimizer, models::op_name(models::OpId::kOptimizerAdamw)));
}

}  // namespace sextant::sim
