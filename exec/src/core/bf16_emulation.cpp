// Mixed precision on the CPU, for tests: the CPU backend's fp32 kernels with every bf16 argument
// widened to fp32 before the call and every bf16 result rounded back after it. Rounding happens
// exactly where the CUDA backend's bf16 kernels store (outputs are computed in fp32 and stored
// once), so the trainer's mixed-precision paths -- compute copies of the parameters, fp32 master
// weights and gradients, conversions around communication -- run and are checked on any machine.
// Slow by design: two conversions per tensor per call.
#include "sextant/exec/cpu_backend.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {

namespace {

class Bf16Emulation : public Backend {
 public:
  Bf16Emulation() : inner_(make_cpu_backend()) {}
  std::string name() const override { return "cpu-bf16"; }
  spec::ExecutorBackend kind() const override { return spec::ExecutorBackend::kCpu; }
  spec::ExecutorPrecision precision() const override { return spec::ExecutorPrecision::kBf16; }
  DType activation_dtype() const override { return DType::kBF16; }

  void* allocate(int64_t bytes) override { return inner_->allocate(bytes); }
  void release(void* data) override { inner_->release(data); }
  void fill(Tensor& t, float value) override { inner_->fill(t, value); }
  void copy(const Tensor& from, Tensor& to) override { inner_->copy(from, to); }
  void copy_box(const Tensor& from, const Box& held_from, Tensor& to, const Box& held_to,
                const Box& r, int64_t maps, bool add) override {
    inner_->copy_box(from, held_from, to, held_to, r, maps, add);
  }
  void to_host(const Tensor& t, std::vector<float>& out) override { inner_->to_host(t, out); }
  void from_host(const std::vector<float>& in, Tensor& t) override { inner_->from_host(in, t); }
  void synchronize() override {}

  void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y,
              bool accumulate) override {
    Tensor y32 = out(y, accumulate);
    Tensor b32 = bias ? wide(*bias) : Tensor();
    inner_->matmul(wide(x), wide(w), bias ? &b32 : nullptr, y32, accumulate);
    store(y32, y);
  }
  void matmul_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                       Tensor* db, bool accumulate_dx) override {
    Tensor dx32 = dx ? out(*dx, accumulate_dx) : Tensor();
    inner_->matmul_backward(wide(x), wide(w), wide(dy), dx ? &dx32 : nullptr, dw, db,
                            accumulate_dx);
    if (dx) store(dx32, *dx);
  }
  void matmul_nt(const Tensor& x, const Tensor& w, Tensor& y) override {
    Tensor y32 = out(y);
    inner_->matmul_nt(wide(x), wide(w), y32);
    store(y32, y);
  }
  void matmul_nt_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                          Tensor& dw) override {
    Tensor dx32 = out(dx);
    inner_->matmul_nt_backward(wide(x), wide(w), wide(dy), dx32, dw);
    store(dx32, dx);
  }
  void layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& mean,
                 Tensor& rstd) override {
    Tensor y32 = out(y);
    inner_->layernorm(wide(x), wide(gamma), wide(beta), y32, mean, rstd);
    store(y32, y);
  }
  void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                          const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dgamma,
                          Tensor& dbeta) override {
    Tensor dx32 = out(dx);
    inner_->layernorm_backward(wide(x), wide(gamma), mean, rstd, wide(dy), dx32, dgamma, dbeta);
    store(dx32, dx);
  }
  void rmsnorm(const Tensor& x, const Tensor& gamma, Tensor& y, Tensor& rstd) override {
    Tensor y32 = out(y);
    inner_->rmsnorm(wide(x), wide(gamma), y32, rstd);
    store(y32, y);
  }
  void rmsnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& rstd, const Tensor& dy,
                        Tensor& dx, Tensor& dgamma) override {
    Tensor dx32 = out(dx);
    inner_->rmsnorm_backward(wide(x), wide(gamma), rstd, wide(dy), dx32, dgamma);
    store(dx32, dx);
  }
  void rope(Tensor& qkv, const QkvLayout& l, float base, bool inverse) override {
    Tensor q32 = out(qkv, true);
    inner_->rope(q32, l, base, inverse);
    store(q32, qkv);
  }
  void gelu(const Tensor& x, Tensor& y) override { unary(&Backend::gelu, x, y); }
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    binary(&Backend::gelu_backward, x, dy, dx);
  }
  void relu(const Tensor& x, Tensor& y) override { unary(&Backend::relu, x, y); }
  void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    binary(&Backend::relu_backward, x, dy, dx);
  }
  void swiglu(const Tensor& x, Tensor& y) override { unary(&Backend::swiglu, x, y); }
  void swiglu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    binary(&Backend::swiglu_backward, x, dy, dx);
  }
  void bias_add(Tensor& y, const Tensor& b) override {
    Tensor y32 = out(y, true);
    inner_->bias_add(y32, wide(b));
    store(y32, y);
  }
  void bias_backward(const Tensor& dy, Tensor& db) override { inner_->bias_backward(wide(dy), db); }
  void add(const Tensor& a, const Tensor& b, Tensor& y) override { binary(&Backend::add, a, b, y); }
  void scale(Tensor& x, float factor) override {
    Tensor x32 = out(x, true);
    inner_->scale(x32, factor);
    store(x32, x);
  }
  void attention_scores(const Tensor& qkv, const QkvLayout& l, Tensor& scores) override {
    Tensor s32 = out(scores);
    inner_->attention_scores(wide(qkv), l, s32);
    store(s32, scores);
  }
  void causal_softmax(Tensor& scores_to_probs, int64_t seq) override {
    Tensor p32 = out(scores_to_probs, true);
    inner_->causal_softmax(p32, seq);
    store(p32, scores_to_probs);
  }
  void attention_context(const Tensor& probs, const Tensor& qkv, const QkvLayout& l,
                         Tensor& out_) override {
    Tensor o32 = out(out_);
    inner_->attention_context(wide(probs), wide(qkv), l, o32);
    store(o32, out_);
  }
  void attention_context_backward(const Tensor& probs, const Tensor& qkv, const Tensor& dout,
                                  const QkvLayout& l, Tensor& dprobs, Tensor& dqkv) override {
    Tensor dp32 = out(dprobs), dqkv32 = out(dqkv, true);  // q and k blocks untouched
    inner_->attention_context_backward(wide(probs), wide(qkv), wide(dout), l, dp32, dqkv32);
    store(dp32, dprobs);
    store(dqkv32, dqkv);
  }
  void causal_softmax_backward(const Tensor& probs, Tensor& dprobs_to_dscores,
                               int64_t seq) override {
    Tensor d32 = out(dprobs_to_dscores, true);
    inner_->causal_softmax_backward(wide(probs), d32, seq);
    store(d32, dprobs_to_dscores);
  }
  void attention_scores_backward(const Tensor& dscores, const Tensor& qkv, const QkvLayout& l,
                                 Tensor& dqkv) override {
    Tensor dqkv32 = out(dqkv, true);  // the v block untouched
    inner_->attention_scores_backward(wide(dscores), wide(qkv), l, dqkv32);
    store(dqkv32, dqkv);
  }
  // The log-sum-exp and delta are fp32 on every backend: they pass through.
  void flash_attention(const Tensor& qkv, const QkvLayout& l, Tensor& out_, Tensor& lse) override {
    Tensor o32 = out(out_);
    inner_->flash_attention(wide(qkv), l, o32, lse);
    store(o32, out_);
  }
  void flash_attention_backward_prep(const Tensor& out_, const Tensor& dout, const QkvLayout& l,
                                     Tensor& delta) override {
    inner_->flash_attention_backward_prep(wide(out_), wide(dout), l, delta);
  }
  void flash_attention_backward(const Tensor& qkv, const Tensor& dout, const Tensor& lse,
                                const Tensor& delta, const QkvLayout& l, Tensor& dqkv) override {
    Tensor dqkv32 = out(dqkv);
    inner_->flash_attention_backward(wide(qkv), wide(dout), lse, delta, l, dqkv32);
    store(dqkv32, dqkv);
  }
  void embedding(const std::vector<int32_t>& tokens, const Tensor& table, int64_t vocab_begin,
                 Tensor& y) override {
    Tensor y32 = out(y);
    inner_->embedding(tokens, wide(table), vocab_begin, y32);
    store(y32, y);
  }
  void embedding_backward(const std::vector<int32_t>& tokens, const Tensor& dy, int64_t vocab_begin,
                          Tensor& dtable) override {
    inner_->embedding_backward(tokens, wide(dy), vocab_begin, dtable);
  }
  void add_positions(const Tensor& pos, int64_t row_begin, int64_t seq, Tensor& y) override {
    Tensor y32 = out(y, true);
    inner_->add_positions(wide(pos), row_begin, seq, y32);
    store(y32, y);
  }
  void add_positions_backward(const Tensor& dy, int64_t row_begin, int64_t seq,
                              Tensor& dpos) override {
    inner_->add_positions_backward(wide(dy), row_begin, seq, dpos);
  }
  void softmax_stats(const Tensor& logits, const std::vector<int32_t>& targets, int64_t vocab_begin,
                     int64_t valid, std::vector<float>& max, std::vector<float>& sum,
                     std::vector<float>& target) override {
    inner_->softmax_stats(wide(logits), targets, vocab_begin, valid, max, sum, target);
  }
  void cross_entropy_backward(const Tensor& logits, const std::vector<int32_t>& targets,
                              int64_t vocab_begin, int64_t valid, const std::vector<float>& max,
                              const std::vector<float>& sum, float scale,
                              Tensor& dlogits) override {
    Tensor d32 = out(dlogits);
    inner_->cross_entropy_backward(wide(logits), targets, vocab_begin, valid, max, sum, scale, d32);
    store(d32, dlogits);
  }
  double sum_squares(const Tensor& x) override { return inner_->sum_squares(wide(x)); }
  void adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, int64_t step, float lr,
             float beta1, float beta2, float eps, float weight_decay, float grad_scale) override {
    inner_->adamw(param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay, grad_scale);
  }

  // ConvolutionKernels: the CPU's own, on fp32 tensors (CNNs run in fp32: a bf16 tensor here is
  // a logic error, caught by Tensor::data).
  void convolution(const Tensor& x, const Tensor& w, const Tensor* bias, int64_t stride,
                   Tensor& y) override {
    inner_->convolution(x, w, bias, stride, y);
  }
  void convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy, int64_t stride,
                            Tensor* dx, Tensor& dw, Tensor* db) override {
    inner_->convolution_backward(x, w, dy, stride, dx, dw, db);
  }
  void transposed_convolution(const Tensor& x, const Tensor& w, int64_t stride,
                              Tensor& y) override {
    inner_->transposed_convolution(x, w, stride, y);
  }
  void transposed_convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                       int64_t stride, Tensor* dx, Tensor& dw) override {
    inner_->transposed_convolution_backward(x, w, dy, stride, dx, dw);
  }
  void crop_concat(const Tensor& kept, const Tensor& x, Tensor& y) override {
    inner_->crop_concat(kept, x, y);
  }
  void crop_concat_backward(const Tensor& dy, Tensor& dkept, Tensor& dx) override {
    inner_->crop_concat_backward(dy, dkept, dx);
  }
  double pixel_cross_entropy(const Tensor& logits, const std::vector<int32_t>& labels, float scale,
                             Tensor* dlogits, int64_t map_pixels) override {
    return inner_->pixel_cross_entropy(logits, labels, scale, dlogits, map_pixels);
  }
  void add_channel_bias(Tensor& y, const Tensor& bias) override {
    inner_->add_channel_bias(y, bias);
  }
  void channel_bias_backward(const Tensor& dy, Tensor& db) override {
    inner_->channel_bias_backward(dy, db);
  }
  void channel_sums(const Tensor& x, std::vector<double>& sums) override {
    inner_->channel_sums(x, sums);
  }
  void batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                  const std::vector<double>& mean, const std::vector<double>& rstd,
                  Tensor& y) override {
    inner_->batch_norm(x, gamma, beta, mean, rstd, y);
  }
  void batch_norm_backward_sums(const Tensor& x, const Tensor& dy, const std::vector<double>& mean,
                                const std::vector<double>& rstd,
                                std::vector<double>& sums) override {
    inner_->batch_norm_backward_sums(x, dy, mean, rstd, sums);
  }
  void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                           const std::vector<double>& mean, const std::vector<double>& rstd,
                           const std::vector<double>& sums, int64_t count, Tensor& dx) override {
    inner_->batch_norm_backward(x, dy, gamma, mean, rstd, sums, count, dx);
  }
  void batch_norm_whole(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                        Tensor& stats) override {
    inner_->batch_norm_whole(x, gamma, beta, y, stats);
  }
  void batch_norm_whole_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                 const Tensor& stats, Tensor& dx, Tensor& dgamma,
                                 Tensor& dbeta) override {
    inner_->batch_norm_whole_backward(x, dy, gamma, stats, dx, dgamma, dbeta);
  }
  void max_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y) override {
    inner_->max_pool(x, kernel, stride, y);
  }
  void max_pool_backward(const Tensor& x, const Tensor& y, const Tensor& dy, int64_t kernel,
                         int64_t stride, Tensor& dx) override {
    inner_->max_pool_backward(x, y, dy, kernel, stride, dx);
  }
  void avg_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y) override {
    inner_->avg_pool(x, kernel, stride, y);
  }
  void avg_pool_backward(const Tensor& dy, int64_t kernel, int64_t stride, Tensor& dx) override {
    inner_->avg_pool_backward(dy, kernel, stride, dx);
  }
  void adaptive_avg_pool(const Tensor& x, const spec::MapBlock& block, const spec::MapExtent& map,
                         Tensor& y) override {
    inner_->adaptive_avg_pool(x, block, map, y);
  }
  void adaptive_avg_pool_backward(const Tensor& dy, const spec::MapBlock& block,
                                  const spec::MapExtent& map, Tensor& dx) override {
    inner_->adaptive_avg_pool_backward(dy, block, map, dx);
  }

 private:
  // An fp32 tensor holding t's values (t itself when it is fp32).
  Tensor wide(const Tensor& t) {
    if (t.dtype() == DType::kF32) return t;
    Tensor w = inner_->empty(t.shape());
    inner_->copy(t, w);
    return w;
  }
  // An fp32 tensor for the kernel to write into; with its current values when the kernel reads
  // them too (accumulation, in-place updates, blocks left untouched).
  Tensor out(Tensor& t, bool keep = false) {
    if (t.dtype() == DType::kF32) return t;
    return keep ? wide(t) : inner_->empty(t.shape());
  }
  // Rounds the kernel's fp32 result into t (nothing to do when t was written directly).
  void store(const Tensor& result, Tensor& t) {
    if (t.dtype() != DType::kF32) inner_->copy(result, t);
  }
  void unary(void (Backend::*kernel)(const Tensor&, Tensor&), const Tensor& x, Tensor& y) {
    Tensor y32 = out(y);
    ((*inner_).*kernel)(wide(x), y32);
    store(y32, y);
  }
  void binary(void (Backend::*kernel)(const Tensor&, const Tensor&, Tensor&), const Tensor& a,
              const Tensor& b, Tensor& y) {
    Tensor y32 = out(y);
    ((*inner_).*kernel)(wide(a), wide(b), y32);
    store(y32, y);
  }

  std::unique_ptr<Backend> inner_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_bf16_emulation() {
  return std::make_unique<Bf16Emulation>();
}

std::unique_ptr<Backend> make_cpu_backend(Precision precision) {
  if (precision == Precision::kFp32) return make_cpu_backend();
  if (precision == Precision::kBf16) return make_cpu_bf16_emulation();
  // spec::executor_problems refuses the tensor-core modes on CPU ranks before a backend is made.
  SEXTANT_CHECK(false, "the cpu backend in {}", precision_name(precision));
}

}  // namespace sextant::exec
