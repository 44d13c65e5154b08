// The CPU backend: fp32 kernels on Eigen (GEMMs) and plain loops (everything else).
#pragma once

#include <memory>

#include "sextant/exec/backend.hpp"
#include "sextant/exec/precision.hpp"

namespace sextant::exec {

std::unique_ptr<Backend> make_cpu_backend();
// Mixed precision emulated on the CPU (bf16 activations and compute copies, fp32 arithmetic and
// master weights), to test the trainer's mixed-precision paths without a GPU.
std::unique_ptr<Backend> make_cpu_bf16_emulation();
// fp32, or bf16 (the emulation); InputError for the GPU-only precisions.
std::unique_ptr<Backend> make_cpu_backend(Precision precision);

}  // namespace sextant::exec
