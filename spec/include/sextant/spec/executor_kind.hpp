// The executor's backends and precisions as plain enums, for headers CUDA code includes too
// (exec/backend.hpp); their rules are spec/executor_support.hpp's.
#pragma once

namespace sextant::spec {

// The executor's backends (`run --backend`): Eigen kernels on CPU ranks, CUDA with cuBLAS.
enum class ExecutorBackend { kCpu, kCuda };

// How a backend stores tensors and multiplies matrices (`run --precision`).
enum class ExecutorPrecision {
  kFp32,      // fp32 tensors, exact fp32 GEMMs
  kTf32,      // fp32 tensors, tf32 tensor-core GEMMs (cuda)
  kBf16Gemm,  // fp32 tensors, bf16 tensor-core GEMMs (cuda): isolates the storage's share
  // Mixed precision (Megatron-LM, llm.c): bf16 activations and compute copies of the parameters,
  // fp32 master weights, gradients and optimizer state; bf16 tensor-core GEMMs with fp32
  // accumulation on cuda, emulated (rounding at every store) on cpu.
  kBf16,
};

// "cpu", "cuda"; "fp32", "tf32", "bf16-gemm", "bf16" (executor_backend_names' and
// executor_precision_names' entries).
const char* executor_backend_name(ExecutorBackend backend);
const char* executor_precision_name(ExecutorPrecision precision);

}  // namespace sextant::spec
