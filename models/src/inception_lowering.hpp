// The lowering of one Inception-v3 module (spec/inception_module.hpp): each branch's
// convolutions (with batch norm and ReLU) and pools, module e's split outputs joined, and the
// module's join. Private to models/; the CNN lowering (cnn_lowering.cpp) calls it for each
// inception layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sextant/models/lowering.hpp"
#include "sextant/spec/model_spec.hpp"
#include "unit_builder.hpp"

namespace sextant::models {

// Appends the forward ops of module `l` named `name` reading `in` to `layer` (its params,
// params_total, matrices and saved_bytes too), B samples of e bytes: the branches `share` gives
// this rank and, split, the join's all-gather (`join` names it; the input's gradient is summed).
// Returns the module's output.
CellMap add_inception_module(Layer& layer, const std::string& name, const spec::CnnLayer& l,
                             CellMap in, int64_t B, int64_t e, const BranchShare& share,
                             BranchJoin& join);

}  // namespace sextant::models
