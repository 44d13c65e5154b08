// The CPU backend: fp32 kernels on Eigen (GEMMs) and plain loops (everything else).
#pragma once

#include <memory>

#include "sextant/exec/backend.hpp"

namespace sextant::exec {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace sextant::exec
