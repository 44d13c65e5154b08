// A build without nvcc: the CUDA entry points exist and say why they cannot run.
#include <stdexcept>

#include "sextant/exec/communicators.hpp"
#include "sextant/exec/cuda_backend.hpp"

namespace sextant::exec {

namespace {
constexpr const char* kReason =
    "this build has no CUDA backend (nvcc was not found when CMake configured it; "
    "rebuild with the cuda preset or -DSEXTANT_ENABLE_CUDA=REQUIRE)";
}

bool built_with_cuda() {
  return false;
}
int cuda_device_count() {
  return 0;
}
std::string cuda_unavailable_reason() {
  return kReason;
}

std::unique_ptr<Backend> make_cuda_backend(int, Precision) {
  throw std::runtime_error(kReason);
}

std::unique_ptr<Communicator> make_device_communicator(CommKind, MPI_Comm, std::string) {
  throw std::runtime_error(kReason);
}

}  // namespace sextant::exec
