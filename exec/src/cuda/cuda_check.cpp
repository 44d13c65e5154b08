// The failure path of CUDA_CHECK and friends.
#include "cuda_check.hpp"

#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <stdexcept>

namespace sextant::exec {

void throw_library_error(const char* library, const char* call, const std::string& message,
                         const char* file, int line) {
  int rank = -1, initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  throw std::runtime_error(fmt::format("{} call {} failed at {}:{} on rank {} ({}): {}", library,
                                       call, file, line, rank, host, message));
}

}  // namespace sextant::exec
