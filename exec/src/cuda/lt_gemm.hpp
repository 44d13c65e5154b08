// GEMMs with the bias added in cuBLASLt's epilogue (CUBLASLT_EPILOGUE_BIAS), so that a linear
// layer's bias costs no pass of its own over the output: on GPT-2 124M on the H200 the separate
// bias passes of qkv and fc1 took ~2.6 ms of a 72.6 ms step (bench/results/gpu_h200.md), and
// PyTorch runs nn.Linear's bias the same way (at::cuda::blas::gemm_and_bias). A shape, type and
// alignment cuBLASLt has no algorithm for is refused (false), and the caller runs the GEMM and the
// bias apart; each such case is asked of cuBLASLt once.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace sextant::exec {

class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // d (column-major m x n, ldd) = op(a) op(b) + beta d + bias (m values, broadcast over the n
  // columns), on the default stream; a, b, d and bias of `type`, accumulated as `compute` says.
  // False, with nothing launched, when cuBLASLt has no algorithm for the call.
  bool gemm_bias(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                 const void* a, int64_t lda, const void* b, int64_t ldb, cudaDataType_t type,
                 cublasComputeType_t compute, float beta, void* d, int64_t ldd, const void* bias);

 private:
  // A call's shape, types and operand alignments (the algorithm depends on all of them).
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int,
                         bool, int, int, int, int>;
  struct Plan {
    bool usable = false;
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  Plan make_plan(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                 int64_t lda, int64_t ldb, int64_t ldd, cudaDataType_t type,
                 cublasComputeType_t compute, const int (&alignment)[4]);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<Key, Plan> plans_;
};

}  // namespace sextant::exec
