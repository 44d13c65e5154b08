// The public validation suite of `sextant validate`: the simulator against the published tables
// of shared/reference/published.md, one row per published figure.
//   T1  Narayanan et al. (SC'21) Table 1: TFLOP/s per A100 of Megatron-LM runs, 1.7B to 1T.
//   T4  Korthikanti et al. (2022) Table 4: forward and backward time of one 22B layer.
//   T5  Korthikanti et al. Table 5: iteration time of 22B..1T, full recompute vs SP + selective.
//   T5d Korthikanti et al. Table 2 / §4: activation bytes per layer against the paper's formulas.
//   T6  Megatron-LM README (2020): iteration time of tensor-parallel GPT models on V100s and A100s.
//   T9  NVIDIA NeMo 24.07: tokens/s per H100 of Megatron-Core FP8 runs, 8 to 512 GPUs.
//   K1  a PyTorch-profiler trace of GPT-2 124M on one H100: GPU time per op class.
//   K2  the same of 8 Llama-3 8B layers on the project's H200, eager; K3 compiled per block;
//   K4, K5 the same under FSDP2 with bf16 parameters (TorchTitan's precision path).
// Every row uses the shipped cluster file of its GPU and the preset of its software stack; no row
// has a knob of its own beyond what its publication states (layout, batch, recompute, DDP kind).
#pragma once

#include <string>
#include <vector>

#include "sextant/sim/simulator.hpp"

namespace sextant::cli {

struct ValidationRow {
  std::string name;
  double published = 0;
  double predicted = 0;
  std::string detail;  // the plan or configuration the prediction used
  double error() const { return published != 0 ? predicted / published - 1 : 0; }
};

struct ValidationTable {
  std::string id;     // T1, T4, T5, T5d, T6, T9, K1-K5
  std::string title;  // what the rows are, with the source
  std::string unit;
  bool bounded = false;  // held to --max-mean-error and --max-row-error (published timings)
  std::vector<ValidationRow> rows;
  std::string note;  // why a table was skipped, or how to read it
  double mean_abs_error() const;
  double max_abs_error() const;
};

struct ValidationOptions {
  sim::Fidelity fidelity = sim::Fidelity::kAnalytic;
  std::string kineto;                     // the K1 trace; empty: skip K1
  std::string llama_eager_trace;          // K2's trace; empty: skip
  std::string llama_compiled_trace;       // K3's trace; empty: skip
  std::string llama_fsdp_eager_trace;     // K4's
  std::string llama_fsdp_compiled_trace;  // K5's
};

std::vector<ValidationTable> run_validation(const ValidationOptions& options);

}  // namespace sextant::cli
