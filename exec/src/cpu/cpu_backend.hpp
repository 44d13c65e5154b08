// The CPU backend: fp32 kernels on Eigen (GEMMs) and plain loops (everything else), one file per
// kernel family (kernels/*.hpp): memory.cpp, linear.cpp, norm.cpp, elementwise.cpp, attention.cpp,
// vocabulary.cpp, optimizer.cpp and convolution.cpp. All math in fp32, with fp64 row statistics
// where a reduction's order would otherwise drift between layouts. make_cpu_backend
// (sextant/exec/cpu_backend.hpp) is the only way in from outside this folder.
#pragma once

#include <string>
#include <vector>

#include "sextant/exec/backend.hpp"
#include "sextant/exec/block_pool.hpp"

namespace sextant::exec::cpu {

class CpuBackend final : public Backend {
 public:
  CpuBackend();
  std::string name() const override { return "cpu"; }
  spec::ExecutorBackend kind() const override { return spec::ExecutorBackend::kCpu; }
  spec::ExecutorPrecision precision() const override { return spec::ExecutorPrecision::kFp32; }

  // DeviceMemory (memory.cpp)
  void* allocate(int64_t bytes) override;
  void release(void* data) override;
  void fill(Tensor& t, float value) override;
  void copy(const Tensor& from, Tensor& to) override;
  void to_host(const Tensor& t, std::vector<float>& out) override;
  void from_host(const std::vector<float>& in, Tensor& t) override;
  void copy_box(const Tensor& from, const Box& held_from, Tensor& to, const Box& held_to,
                const Box& r, int64_t maps, bool add) override;
  void synchronize() override;

  // LinearKernels (linear.cpp)
  void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y,
              bool accumulate) override;
  void matmul_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                       Tensor* db, bool accumulate_dx) override;
  void matmul_nt(const Tensor& x, const Tensor& w, Tensor& y) override;
  void matmul_nt_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                          Tensor& dw) override;
  void bias_add(Tensor& y, const Tensor& b) override;
  void bias_backward(const Tensor& dy, Tensor& db) override;

  // NormKernels (norm.cpp)
  void layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& mean,
                 Tensor& rstd) override;
  void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                          const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dgamma,
                          Tensor& dbeta) override;
  void rmsnorm(const Tensor& x, const Tensor& gamma, Tensor& y, Tensor& rstd) override;
  void rmsnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& rstd, const Tensor& dy,
                        Tensor& dx, Tensor& dgamma) override;

  // ElementwiseKernels (elementwise.cpp)
  void gelu(const Tensor& x, Tensor& y) override;
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void relu(const Tensor& x, Tensor& y) override;
  void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void swiglu(const Tensor& x, Tensor& y) override;
  void swiglu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void add(const Tensor& a, const Tensor& b, Tensor& y) override;
  void scale(Tensor& x, float factor) override;

  // AttentionKernels (attention.cpp)
  void rope(Tensor& qkv, const QkvLayout& l, float base, bool inverse) override;
  void attention_scores(const Tensor& qkv, const QkvLayout& l, Tensor& scores) override;
  void causal_softmax(Tensor& x, int64_t seq) override;
  void attention_context(const Tensor& probs, const Tensor& qkv, const QkvLayout& l,
                         Tensor& out) override;
  void attention_context_backward(const Tensor& probs, const Tensor& qkv, const Tensor& dout,
                                  const QkvLayout& l, Tensor& dprobs, Tensor& dqkv) override;
  void causal_softmax_backward(const Tensor& probs, Tensor& grad, int64_t seq) override;
  void attention_scores_backward(const Tensor& dscores, const Tensor& qkv, const QkvLayout& l,
                                 Tensor& dqkv) override;
  // (flash_attention.cpp)
  void flash_attention(const Tensor& qkv, const QkvLayout& l, Tensor& out, Tensor& lse) override;
  void flash_attention_backward_prep(const Tensor& out, const Tensor& dout, const QkvLayout& l,
                                     Tensor& delta) override;
  void flash_attention_backward(const Tensor& qkv, const Tensor& dout, const Tensor& lse,
                                const Tensor& delta, const QkvLayout& l, Tensor& dqkv) override;

  // VocabularyKernels (vocabulary.cpp)
  void embedding(const std::vector<int32_t>& tokens, const Tensor& table, int64_t vocab_begin,
                 Tensor& y) override;
  void embedding_backward(const std::vector<int32_t>& tokens, const Tensor& dy, int64_t vocab_begin,
                          Tensor& dtable) override;
  void add_positions(const Tensor& pos, int64_t row_begin, int64_t seq, Tensor& y) override;
  void add_positions_backward(const Tensor& dy, int64_t row_begin, int64_t seq,
                              Tensor& dpos) override;
  void softmax_stats(const Tensor& logits, const std::vector<int32_t>& targets, int64_t vocab_begin,
                     int64_t valid, std::vector<float>& max, std::vector<float>& sum,
                     std::vector<float>& target) override;
  void cross_entropy_backward(const Tensor& logits, const std::vector<int32_t>& targets,
                              int64_t vocab_begin, int64_t valid, const std::vector<float>& max,
                              const std::vector<float>& sum, float scale_factor,
                              Tensor& dlogits) override;

  // OptimizerKernels (optimizer.cpp)
  double sum_squares(const Tensor& x) override;
  void adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, int64_t step, float lr,
             float beta1, float beta2, float eps, float weight_decay, float grad_scale) override;

  // ConvolutionKernels (convolution.cpp: the host kernels of conv_kernels.hpp)
  void convolution(const Tensor& x, const Tensor& w, const Tensor* bias, int64_t stride,
                   Tensor& y) override;
  void convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy, int64_t stride,
                            Tensor* dx, Tensor& dw, Tensor* db) override;
  void transposed_convolution(const Tensor& x, const Tensor& w, int64_t stride, Tensor& y) override;
  void transposed_convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                       int64_t stride, Tensor* dx, Tensor& dw) override;
  void crop_concat(const Tensor& kept, const Tensor& x, Tensor& y) override;
  void crop_concat_backward(const Tensor& dy, Tensor& dkept, Tensor& dx) override;
  double pixel_cross_entropy(const Tensor& logits, const std::vector<int32_t>& labels, float scale,
                             Tensor* dlogits, int64_t map_pixels) override;
  void add_channel_bias(Tensor& y, const Tensor& bias) override;
  void channel_bias_backward(const Tensor& dy, Tensor& db) override;
  void channel_sums(const Tensor& x, std::vector<double>& sums) override;
  void batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                  const std::vector<double>& mean, const std::vector<double>& rstd,
                  Tensor& y) override;
  void batch_norm_backward_sums(const Tensor& x, const Tensor& dy, const std::vector<double>& mean,
                                const std::vector<double>& rstd,
                                std::vector<double>& sums) override;
  void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                           const std::vector<double>& mean, const std::vector<double>& rstd,
                           const std::vector<double>& sums, int64_t count, Tensor& dx) override;
  void batch_norm_whole(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                        Tensor& stats) override;
  void batch_norm_whole_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                 const Tensor& stats, Tensor& dx, Tensor& dgamma,
                                 Tensor& dbeta) override;
  void max_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y) override;
  void max_pool_backward(const Tensor& x, const Tensor& y, const Tensor& dy, int64_t kernel,
                         int64_t stride, Tensor& dx) override;
  void avg_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y) override;
  void avg_pool_backward(const Tensor& dy, int64_t kernel, int64_t stride, Tensor& dx) override;
  void adaptive_avg_pool(const Tensor& x, const spec::MapBlock& block, const spec::MapExtent& map,
                         Tensor& y) override;
  void adaptive_avg_pool_backward(const Tensor& dy, const spec::MapBlock& block,
                                  const spec::MapExtent& map, Tensor& dx) override;

 private:
  BlockPool pool_;
};

}  // namespace sextant::exec::cpu
