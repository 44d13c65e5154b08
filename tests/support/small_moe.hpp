// A small mixture-of-experts model for lowering and simulator tests.
#pragma once

#include "sextant/models/zoo.hpp"
#include "sextant/spec/model_spec.hpp"

namespace sextant::test {

// A small mixture of experts: llama-tiny's h 64 and 4 heads, 8 experts of 32 (SwiGLU), top-2,
// 1 shared expert, the first of 3 layers dense (ffn 128), 16 tokens a sequence.
inline spec::ModelSpec small_moe(double capacity_factor = 0) {
  spec::ModelSpec m = models::zoo_model("llama-tiny");
  spec::TransformerSpec& t = m.transformer();
  t.layers = 3;
  t.kv_heads = 4;
  t.seq_len = 16;
  spec::MoeSpec moe;
  moe.experts = 8;
  moe.top_k = 2;
  moe.expert_ffn_hidden = 32;
  moe.shared_experts = 1;
  moe.capacity_factor = capacity_factor;
  moe.dense_layers = 1;
  t.moe = moe;
  return m;
}

}  // namespace sextant::test
