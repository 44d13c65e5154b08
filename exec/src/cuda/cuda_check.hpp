// CUDA_CHECK, CUBLAS_CHECK, NCCL_CHECK: a failing call throws std::runtime_error naming the call,
// the library's message, the rank and the host.
#pragma once

#include <string>

namespace sextant::exec {

[[noreturn]] void throw_library_error(const char* library, const char* call,
                                      const std::string& message, const char* file, int line);

}  // namespace sextant::exec

#define CUDA_CHECK(call)                                                                  \
  do {                                                                                    \
    cudaError_t sextant_e_ = (call);                                                      \
    if (sextant_e_ != cudaSuccess)                                                        \
      ::sextant::exec::throw_library_error("CUDA", #call, cudaGetErrorString(sextant_e_), \
                                           __FILE__, __LINE__);                           \
  } while (false)

#define CUBLAS_CHECK(call)                                                                     \
  do {                                                                                         \
    cublasStatus_t sextant_s_ = (call);                                                        \
    if (sextant_s_ != CUBLAS_STATUS_SUCCESS)                                                   \
      ::sextant::exec::throw_library_error("cuBLAS", #call, cublasGetStatusString(sextant_s_), \
                                           __FILE__, __LINE__);                                \
  } while (false)

#define NCCL_CHECK(call)                                                                  \
  do {                                                                                    \
    ncclResult_t sextant_r_ = (call);                                                     \
    if (sextant_r_ != ncclSuccess)                                                        \
      ::sextant::exec::throw_library_error("NCCL", #call, ncclGetErrorString(sextant_r_), \
                                           __FILE__, __LINE__);                           \
  } while (false)
