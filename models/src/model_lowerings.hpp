// Each model family's lowering, which models::lower (lowering.cpp) dispatches to. Private to
// models/.
#pragma once

#include "sextant/models/lowering.hpp"

namespace sextant::models {

// Transformers (Megatron-LM's layout; transformer_lowering.cpp).
LoweredModel lower_transformer(const spec::ModelSpec& model, const LoweringOptions& o);
// MLPs (mlp_lowering.cpp).
LoweredModel lower_mlp(const spec::ModelSpec& model, const LoweringOptions& o);
// CNNs: sample, spatial and channel/filter splits (cnn_lowering.cpp).
LoweredModel lower_cnn(const spec::ModelSpec& model, const LoweringOptions& o);

}  // namespace sextant::models
