// The CUDA module's entry point: the table of its functions.
#include "cuda_module.hpp"

extern "C" __attribute__((visibility("default"))) const sextant::exec::cuda_module::Table*
sextant_cuda_module() {
  namespace m = sextant::exec::cuda_module;
  static const m::Table table{m::kAbiVersion, &m::device_count, &m::unavailable_reason,
                              &m::make_backend, &m::make_communicator};
  return &table;
}
