// An expert's capacity in a mixture of experts with a capacity factor (GShard, Lepikhin et al.
// 2020, §2.2; Switch Transformer, Fedus et al. 2021, §2.2; Megatron-LM's
// --moe-expert-capacity-factor): the rows each expert takes of the copies one rank routes,
// ceil(factor x copies / experts). One home: the lowering prices it, the executor drops and pads
// to it.
#pragma once

#include <cmath>
#include <cstdint>

#include "sextant/spec/model_spec.hpp"

namespace sextant::models {

// The rows each expert takes of `copies` routed copies (tokens x top_k); 0 when dropless.
// Computed in double in Megatron-LM's order (moe_utils.py get_capacity: ceil((copies / experts)
// x factor)), so both round alike where the product is not exact (80 / 8 x 1.1 =
// 11.000000000000002: 12).
inline int64_t expert_capacity(const spec::MoeSpec& moe, int64_t copies) {
  if (moe.capacity_factor <= 0) return 0;
  return static_cast<int64_t>(std::ceil(static_cast<double>(copies) /
                                        static_cast<double>(moe.experts) * moe.capacity_factor));
}

}  // namespace sextant::models
