// How an executor backend stores tensors and multiplies matrices.
#pragma once

#include <optional>

namespace sextant::exec {

enum class Precision {
  kFp32,      // fp32 tensors, exact fp32 GEMMs
  kTf32,      // fp32 tensors, tf32 tensor-core GEMMs (cuda)
  kBf16Gemm,  // fp32 tensors, bf16 tensor-core GEMMs (cuda): isolates the storage's share
  // Mixed precision (Megatron-LM, llm.c): bf16 activations and compute copies of the parameters,
  // fp32 master weights, gradients and optimizer state; bf16 tensor-core GEMMs with fp32
  // accumulation on cuda, emulated (rounding at every store) on cpu.
  kBf16,
};

inline const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kTf32:
      return "tf32";
    case Precision::kBf16Gemm:
      return "bf16-gemm";
    case Precision::kBf16:
      return "bf16";
  }
  return "?";
}

}  // namespace sextant::exec
