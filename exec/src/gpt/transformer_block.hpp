// A transformer block on this rank (pre-norm, as GPT-2 and Llama): x1 = x + proj(attn(qkv(ln1(x))))
// and y = x1 + fc2(act(fc1(ln2(x1)))), or a mixture of experts in place of the MLP. The two layer
// pairs run as linear_pairs.hpp splits them (Megatron-LM's 1D split, with or without sequence
// parallelism, or AxoNN's 3D grid); the attention core on the rank's heads, or as the context-
// parallel algorithm says. Under the layer's recompute mode (models::layer_recompute) forward
// keeps only the input (full) or drops the attention probabilities (selective, Korthikanti et
// al. 2022), and backward runs those steps again first, traced as recompute.
#pragma once

#include <map>

#include "gpt_layer.hpp"

namespace sextant::exec {

class TransformerBlock final : public GptLayer {
 public:
  // Lowered layer `layer` (block layer - 1 in the parameter names); `moe` when its MLP is a
  // mixture of experts; `offload` when what it keeps for backward is offloaded to the host
  // (models::layer_activation_offload).
  TransformerBlock(const GptParts& parts, ParamStore& store, int32_t layer, bool moe,
                   spec::Recompute recompute, bool offload);
  Tensor forward(const MicroBatch& mb, const Tensor& x) override;
  Tensor backward(const MicroBatch& mb, const Tensor& dy) override;

 private:
  struct Params {
    Param* ln1_g = nullptr;
    Param* ln1_b = nullptr;
    Param* qkv_w = nullptr;
    Param* qkv_b = nullptr;
    Param* proj_w = nullptr;
    Param* proj_b = nullptr;
    Param* ln2_g = nullptr;
    Param* ln2_b = nullptr;
    Param* fc1_w = nullptr;
    Param* fc1_b = nullptr;
    Param* fc2_w = nullptr;
    Param* fc2_b = nullptr;
  };
  struct Cache {
    Tensor x;  // input (kept under every recompute mode)
    Tensor ln1, ln1_mean, ln1_rstd, a_in, qkv, att, o, x1, ln2, ln2_mean, ln2_rstd, m_in, f1, g;
    Tensor qkv_heads;  // Ulysses: the whole sequences' q, k, v of this rank's heads
    MoeCache moe;      // a mixture-of-experts block's MLP
  };

  // The tensors the cache holds (some may be one tensor: a layer pair's input is the norm's
  // output itself without sequence parallelism).
  static std::vector<Tensor*> cached_tensors(Cache& c);
  // Activation offload (Megatron-LM --cpu-offloading): what the cache holds, copied to tensors
  // of the host pool and freed on the device after the forward (`phase` kFwd, traced as the
  // simulator's offload.activations_to_host), and back before the backward (kBwd,
  // offload.activations_to_device).
  void move_cache(Cache& c, spec::Phase phase, int64_t mb);

  // The block's forward from c.x, filling the cache; `phase` is kFwd or kRecompute.
  Tensor run_forward(Cache& c, int64_t mb, spec::Phase phase);
  // y = x1 + m (+ the MLP's output bias).
  Tensor mlp_residual(Cache& c, Tensor m, spec::Phase phase, int64_t mb);
  // The backward of `out = in + branch (+ bias)`: the gradient of `in` is the incoming gradient
  // `dout` plus what the branch's norm gave back (`dnorm`, accumulated in place), and the bias
  // gradient is the sum of `dout` over rows. One op, as the lowering counts it.
  void residual_backward(models::OpId residual, int64_t mb, const Tensor& dout, Param* bias,
                         Tensor& dnorm);
  // The attention core, as the simulator names its steps; returns the probabilities (fused: each
  // row's fp32 log-sum-exp).
  Tensor attention_core(const Tensor& qkv, Tensor& out, Tensor& qkv_heads, spec::Phase phase,
                        int64_t mb);
  void attention_core_backward(Cache& c, const Tensor& dout, Tensor& dqkv, int64_t mb);
  // The bias of a pair's second layer, added by the residual (on a grid the layer adds it).
  Param* residual_bias(Param* bias) const { return parts_.grid != nullptr ? nullptr : bias; }
  bool rope() const;

  int32_t layer_;
  spec::Recompute recompute_;
  Params p_;
  MoeWeights moe_weights_;  // a mixture-of-experts block's
  bool moe_ = false;
  bool offload_ = false;
  bool fused_attention_ = false;     // the plan's attention core runs as one flash kernel
  std::map<int64_t, Cache> caches_;  // by micro-batch
};

}  // namespace sextant::exec
