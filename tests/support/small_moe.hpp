// A small mixture-of-experts model for lowering and simulator tests.
#pragma once

#include "sextant/models/zoo.hpp"
#include "sextant/spec/model_spec.hpp"

namespace sextant::test {

// The zoo's moe-tiny (llama-tiny's h 64 and 4 heads, 8 experts of 32 with SwiGLU, top-2, 1 shared
// expert, the first block dense with ffn 128), cut to 3 layers of multi-head attention over 16
// tokens a sequence, with the given capacity factor (0: dropless).
inline spec::ModelSpec small_moe(double capacity_factor = 0) {
  spec::ModelSpec m = models::zoo_model("moe-tiny");
  spec::TransformerSpec& t = m.transformer();
  t.layers = 3;
  t.kv_heads = 4;
  t.seq_len = 16;
  t.moe->capacity_factor = capacity_factor;
  return m;
}

}  // namespace sextant::test
