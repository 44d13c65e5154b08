#include "lt_gemm.hpp"

#include <cuda_runtime.h>

#include "cuda_check.hpp"

namespace sextant::exec {

namespace {

// cuBLASLt's workspace: what PyTorch gives it on Hopper (CublasHandlePool.cpp), enough for the
// split-K and stream-K algorithms the heuristic picks for training shapes.
constexpr size_t kWorkspaceBytes = 32u << 20;

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing p's address.
int alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && address % static_cast<uintptr_t>(a) != 0) a /= 2;
  return a;
}

template <typename V>
void set(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t what, const V& value) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, what, &value, sizeof(value)));
}
template <typename V>
void set(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t what,
         const V& value) {
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, what, &value, sizeof(value)));
}

}  // namespace

LtGemm::LtGemm() {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
  CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
}

LtGemm::~LtGemm() {
  for (auto& [key, plan] : plans_) {
    if (plan.op != nullptr) cublasLtMatmulDescDestroy(plan.op);
    for (cublasLtMatrixLayout_t l : {plan.a, plan.b, plan.d})
      if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
  }
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

LtGemm::Plan LtGemm::make_plan(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
                               int64_t k, int64_t lda, int64_t ldb, int64_t ldd,
                               cudaDataType_t type, cublasComputeType_t compute,
                               const int (&alignment)[4]) {
  Plan plan;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.op, compute, CUDA_R_32F));
  set(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(ta));
  set(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(tb));
  set(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(CUBLASLT_EPILOGUE_BIAS));
  // Stored shapes (column-major): op(a) is m x k, op(b) k x n.
  const auto rows_a = static_cast<uint64_t>(ta == CUBLAS_OP_N ? m : k);
  const auto cols_a = static_cast<uint64_t>(ta == CUBLAS_OP_N ? k : m);
  const auto rows_b = static_cast<uint64_t>(tb == CUBLAS_OP_N ? k : n);
  const auto cols_b = static_cast<uint64_t>(tb == CUBLAS_OP_N ? n : k);
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, type, rows_a, cols_a, lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, type, rows_b, cols_b, ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.d, type, static_cast<uint64_t>(m),
                                          static_cast<uint64_t>(n), ldd));
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes));
  set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(alignment[0]));
  set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(alignment[1]));
  set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(alignment[2]));
  set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(alignment[2]));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle_, plan.op, plan.a, plan.b, plan.d,
                                                          plan.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  plan.usable = s == CUBLAS_STATUS_SUCCESS && found > 0;
  if (plan.usable) plan.algo = result.algo;
  return plan;
}

bool LtGemm::gemm_bias(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                       const void* a, int64_t lda, const void* b, int64_t ldb, cudaDataType_t type,
                       cublasComputeType_t compute, float beta, void* d, int64_t ldd,
                       const void* bias) {
  const int alignment[4] = {alignment_of(a), alignment_of(b), alignment_of(d), alignment_of(bias)};
  const Key key{static_cast<int>(ta),
                static_cast<int>(tb),
                m,
                n,
                k,
                lda,
                ldb,
                ldd,
                static_cast<int>(type),
                static_cast<int>(compute),
                beta != 0.0f,
                alignment[0],
                alignment[1],
                alignment[2],
                alignment[3]};
  auto it = plans_.find(key);
  if (it == plans_.end())
    it = plans_.emplace(key, make_plan(ta, tb, m, n, k, lda, ldb, ldd, type, compute, alignment))
             .first;
  Plan& plan = it->second;
  if (!plan.usable) return false;
  set(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  const float alpha = 1.0f;
  const cublasStatus_t s =
      cublasLtMatmul(handle_, plan.op, &alpha, a, plan.a, b, plan.b, &beta, d, plan.d, d, plan.d,
                     &plan.algo, workspace_, kWorkspaceBytes, nullptr);
  if (s == CUBLAS_STATUS_SUCCESS) return true;
  // Refused at the call (the bias's alignment, which the heuristic does not see): not again.
  if (s != CUBLAS_STATUS_NOT_SUPPORTED && s != CUBLAS_STATUS_INVALID_VALUE) CUBLAS_CHECK(s);
  plan.usable = false;
  return false;
}

}  // namespace sextant::exec
