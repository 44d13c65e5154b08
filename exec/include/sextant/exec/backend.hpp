// A compute backend: memory and the kernels the GPT and MLP models need, forward and backward.
// The CPU backend implements them with Eigen on fp32; the CUDA backend with cuBLAS and its own
// kernels. Layout, batching and communication live above this interface and are shared.
//
// Conventions: row-major matrices; x is [rows, in], a linear weight is [in, out]. Backward
// kernels accumulate (+=) into weight and bias gradients, and overwrite input gradients.
//
// Types (mixed precision as in Megatron-LM): activations, their gradients and the parameters'
// compute copy (weights, biases, norms, tables as the kernels read them) share one type, fp32 or
// bf16 (activation_dtype()); parameter gradients (dw, db, dgamma, dbeta, dtable, dpos), layer
// norm statistics, sum_squares and everything AdamW touches are fp32. Arithmetic is fp32 inside
// every kernel; bf16 is a storage format.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sextant/exec/tensor.hpp"

namespace sextant::exec {

// The fused qkv activation [batch*seq, width()]: the q heads, then the k heads, then the v heads
// (head-major, head_dim columns each). q head h attends with kv head h / group(): grouped-query
// attention (Ainslie et al. 2023); kv_heads == heads is multi-head attention.
struct QkvLayout {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  // The position of each of a sequence's `seq` rows in the whole sequence (a context-parallel
  // rank's chunks: spec::context_positions), or null: row r of a sequence is at position r.
  const int32_t* positions = nullptr;
  int64_t position(int64_t row) const {
    return positions != nullptr ? positions[row % seq] : row % seq;
  }
  int64_t group() const { return heads / kv_heads; }
  int64_t width() const { return (heads + 2 * kv_heads) * head_dim; }
  int64_t q_column(int64_t h) const { return h * head_dim; }
  int64_t k_column(int64_t h) const { return (heads + h / group()) * head_dim; }  // of q head h
  int64_t v_column(int64_t h) const { return (heads + kv_heads + h / group()) * head_dim; }
  // A logic error unless qkv is [batch*seq, width()] and the heads divide into groups.
  void check(const Tensor& qkv) const;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Memory.
  Tensor empty(std::vector<int64_t> shape, DType dtype = DType::kF32);
  Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::kF32);
  virtual DType activation_dtype() const { return DType::kF32; }
  virtual void* allocate(int64_t bytes) = 0;
  virtual void release(void* data) = 0;
  virtual void fill(Tensor& t, float value) = 0;
  // Element by element, converting when the types differ (fp32 -> bf16 rounds to nearest even).
  virtual void copy(const Tensor& from, Tensor& to) = 0;
  // Host vectors are fp32 whatever the tensor's type.
  virtual void to_host(const Tensor& t, std::vector<float>& out) = 0;
  virtual void from_host(const std::vector<float>& in, Tensor& t) = 0;
  virtual void synchronize() = 0;

  // Timing that does not stall the device: a mark records "now" in the order of the backend's
  // work (a CUDA event on the compute stream; on the CPU, the host clock), and seconds_between
  // waits for the later mark to be reached.
  class TimeMark {
   public:
    virtual ~TimeMark() = default;
  };
  virtual std::unique_ptr<TimeMark> mark();
  virtual double seconds_between(const TimeMark& from, const TimeMark& to);

  // y[rows, out] = x[rows, in] @ w[in, out] (+ b); accumulate: y += instead of =.
  virtual void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y,
                      bool accumulate = false) = 0;
  // dx = dy @ w^T (accumulate optional); dw += x^T @ dy; db += sum_rows dy.
  virtual void matmul_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                               Tensor& dw, Tensor* db, bool accumulate_dx = false) = 0;
  // y[rows, n] = x[rows, k] @ w[n, k]^T: a weight stored transposed (the tied output layer uses
  // the embedding table [vocab, hidden] this way).
  virtual void matmul_nt(const Tensor& x, const Tensor& w, Tensor& y) = 0;
  // dx = dy @ w; dw += dy^T @ x.
  virtual void matmul_nt_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                                  Tensor& dw) = 0;
  // Per-row layer norm over the last dimension; saves mean and rstd per row.
  virtual void layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                         Tensor& mean, Tensor& rstd) = 0;
  virtual void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                  const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dgamma,
                                  Tensor& dbeta) = 0;
  // Per-row RMS norm (Llama): y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps); saves rstd.
  virtual void rmsnorm(const Tensor& x, const Tensor& gamma, Tensor& y, Tensor& rstd) = 0;
  virtual void rmsnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                                const Tensor& dy, Tensor& dx, Tensor& dgamma) = 0;
  // Rotary position embedding (RoFormer, in the rotate-half layout of GPT-NeoX and Llama) in place
  // on the q and k heads of qkv: within each head, dimension i of the first half and i of the
  // second rotate by l.position(row) * base^(-2i/head_dim) (CUDA: positions null only). inverse
  // rotates back (the backward pass, applied to dq and dk).
  virtual void rope(Tensor& qkv, const QkvLayout& l, float base, bool inverse) = 0;
  // GELU, tanh approximation (GPT-2).
  virtual void gelu(const Tensor& x, Tensor& y) = 0;
  virtual void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  virtual void relu(const Tensor& x, Tensor& y) = 0;
  virtual void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  // SwiGLU on x = [gate | up] (each [rows, f]): y = silu(gate) * up.
  virtual void swiglu(const Tensor& x, Tensor& y) = 0;
  virtual void swiglu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  // y[rows, n] += b[n] (broadcast over rows); db[n] += column sums of dy[rows, n].
  virtual void bias_add(Tensor& y, const Tensor& b) = 0;
  virtual void bias_backward(const Tensor& dy, Tensor& db) = 0;
  // y = a + b (elementwise); y may alias a.
  virtual void add(const Tensor& a, const Tensor& b, Tensor& y) = 0;
  virtual void scale(Tensor& x, float factor) = 0;
  // Causal self-attention, in the three steps the trace names (attn.scores, attn.softmax,
  // attn.context), over qkv laid out as QkvLayout says; scores and probabilities =
  // [batch, heads, seq, seq]; out = [batch*seq, heads*head_dim].
  virtual void attention_scores(const Tensor& qkv, const QkvLayout& l,
                                Tensor& scores) = 0;                      // q k^T / sqrt(head_dim)
  virtual void causal_softmax(Tensor& scores_to_probs, int64_t seq) = 0;  // in place, masked
  virtual void attention_context(const Tensor& probs, const Tensor& qkv, const QkvLayout& l,
                                 Tensor& out) = 0;  // probs v
  // dprobs = dout v^T; the v heads of dqkv = sum over their q heads of probs^T dout (q and k
  // heads untouched).
  virtual void attention_context_backward(const Tensor& probs, const Tensor& qkv,
                                          const Tensor& dout, const QkvLayout& l, Tensor& dprobs,
                                          Tensor& dqkv) = 0;
  // In place: dprobs -> dscores = probs * (dprobs - rowsum(dprobs * probs)), zero above diagonal.
  virtual void causal_softmax_backward(const Tensor& probs, Tensor& dprobs_to_dscores,
                                       int64_t seq) = 0;
  // The q and k heads of dqkv from dscores (the v heads untouched; each k head sums over its
  // q heads).
  virtual void attention_scores_backward(const Tensor& dscores, const Tensor& qkv,
                                         const QkvLayout& l, Tensor& dqkv) = 0;
  // Rows of `table` ([vocab_shard, hidden]) for token ids in [vocab_begin, vocab_begin + shard);
  // other tokens give zero rows (vocabulary-parallel embedding).
  virtual void embedding(const std::vector<int32_t>& tokens, const Tensor& table,
                         int64_t vocab_begin, Tensor& y) = 0;
  virtual void embedding_backward(const std::vector<int32_t>& tokens, const Tensor& dy,
                                  int64_t vocab_begin, Tensor& dtable) = 0;
  // Position embedding on rows [row_begin, row_begin + rows) of a [batch*seq, hidden] activation:
  // y[i] += pos[(row_begin + i) % seq].
  virtual void add_positions(const Tensor& pos, int64_t row_begin, int64_t seq, Tensor& y) = 0;
  virtual void add_positions_backward(const Tensor& dy, int64_t row_begin, int64_t seq,
                                      Tensor& dpos) = 0;
  // The local part of a (vocabulary-parallel) softmax cross-entropy, in one pass over logits
  // [rows, v]: per row the max, the sum of exp(x - max) and the logit of the row's target if it
  // falls in [vocab_begin, vocab_begin + valid) (else 0). Columns from `valid` on are padding
  // (the vocabulary padded so that the logits GEMM runs on aligned shapes): left out.
  virtual void softmax_stats(const Tensor& logits, const std::vector<int32_t>& targets,
                             int64_t vocab_begin, int64_t valid, std::vector<float>& max,
                             std::vector<float>& sum, std::vector<float>& target) = 0;
  // dlogits = (softmax(logits) - onehot(target)) * scale, with the global max and sum; 0 in the
  // padding columns from `valid` on.
  virtual void cross_entropy_backward(const Tensor& logits, const std::vector<int32_t>& targets,
                                      int64_t vocab_begin, int64_t valid,
                                      const std::vector<float>& max, const std::vector<float>& sum,
                                      float scale, Tensor& dlogits) = 0;
  // Sum of squares of x (fp32).
  virtual double sum_squares(const Tensor& x) = 0;
  // The same over spans [offset, offset + count) of a flat fp32 tensor, added up (one launch and
  // one transfer on CUDA, rather than one per span).
  virtual double sum_squares_spans(const Tensor& flat,
                                   const std::vector<std::pair<int64_t, int64_t>>& spans);
  // AdamW on a parameter and its gradient (fp32), bias-corrected, decoupled weight decay.
  virtual void adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, int64_t step,
                     float lr, float beta1, float beta2, float eps, float weight_decay,
                     float grad_scale) = 0;
  // AdamW over many spans of flat fp32 buffers at once (multi-tensor: the CUDA backend updates
  // every span in one launch). Each span is [offset, offset + count) with its own weight decay.
  struct AdamwSpan {
    int64_t offset = 0, count = 0;
    float weight_decay = 0;
  };
  virtual void adamw_spans(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v,
                           const std::vector<AdamwSpan>& spans, int64_t step, float lr, float beta1,
                           float beta2, float eps, float grad_scale);
};

}  // namespace sextant::exec
