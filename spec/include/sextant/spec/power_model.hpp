// The clock a GPU sustains under its power limit. A Hopper or Ampere GPU runs dense tensor-core
// GEMMs at a lower clock than its boost clock once the board reaches its power limit, while
// memory-bound kernels draw less and keep the boost clock. The clock a training step's GEMMs run
// at therefore depends on the power limit (700 W, or a site's 500 W cap), on the precision (FP8
// tensor cores draw more than BF16) and on how much of the step is tensor-core work.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "sextant/spec/dtype.hpp"
#include "sextant/spec/json_reader.hpp"

namespace sextant::spec {

// Power as a function of clock (CMOS dynamic power C V^2 f with the voltage raised in step with
// the clock over the DVFS range: dynamic power ~ f^3; Hennessy & Patterson, Computer Architecture
// 6th ed. §1.5) on top of what the board draws at its boost clock with no kernel running:
//   P(f) = idle_W + (P_activity(max_clock) - idle_W) * (f / max_clock)^3.
// The power controller averages over many kernels (NVIDIA's power capping reacts on millisecond
// windows), so the draw at a given clock is the time-weighted mix of tensor-core and
// memory-bound work; the GPU runs the highest clock, up to max_clock, whose mix stays within
// limit_W.
struct PowerModel {
  double limit_W = 0;         // the enforced board power limit (nvidia-smi -pl); sites may cap it
  double max_clock_MHz = 0;   // the highest boost clock
  double idle_W = 0;          // drawn at the boost clock with memory allocated and no kernel
  double memory_bound_W = 0;  // drawn at the boost clock while memory-bound kernels stream HBM
  // Per GEMM dtype: the SM clock (as nvidia-smi reads it) sustained while dense tensor-core GEMMs
  // of that dtype run back to back at rated_W. A dtype without an entry uses bf16's.
  std::map<Dtype, double> tensor_clock_MHz;
  // Per GEMM dtype: the clock at which the cluster's GEMM model gives the rate those GEMMs
  // sustained. The GEMM model was fitted at the boost clock, and a GEMM's rate falls slower than
  // the SM clock (memory and latency do not slow with it), so this is above tensor_clock_MHz.
  // Absent: tensor_clock_MHz (the GEMM model follows the SM clock).
  std::map<Dtype, double> gemm_clock_MHz;
  double rated_W = 0;  // the power limit the tensor_clock_MHz measurements ran under
  // The clock is locked (nvidia-smi -lgc, or a measurement's recorded clock): no power model.
  std::optional<double> locked_clock_MHz;
  std::string source;
};

// The SM clock (MHz) a GPU under `power` runs at, with GEMMs of `gemm_dtype`, when `tensor_share`
// (0-1) of its compute time is dense tensor-core work at that clock and the rest memory-bound.
double sustained_clock_MHz(const PowerModel& power, Dtype gemm_dtype, double tensor_share);

// The GEMM model's clock while the SM runs at `sm_clock_MHz`: the SM clock scaled by the ratio
// measured at rated_W (gemm_clock_MHz / tensor_clock_MHz of the dtype, else of bf16), never
// above the boost clock, at which the GEMM model was fitted.
double gemm_model_clock_MHz(const PowerModel& power, Dtype gemm_dtype, double sm_clock_MHz);

// The board power (W) at `clock_MHz` for that mix (the function sustained_clock_MHz inverts).
double board_power_W(const PowerModel& power, Dtype gemm_dtype, double tensor_share,
                     double clock_MHz);

PowerModel decode_power_model(ObjectReader& r);
Json to_json(const PowerModel& p);

}  // namespace sextant::spec
