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

// How a module's branches are placed: all on the one rank (ranks 1), or SUPER's split over
// `ranks` tp ranks (spec/branch_parallel.hpp), `owners[b]` running branch b, the ops those of
// rank `rank`.
struct BranchShare {
  int64_t ranks = 1;
  int64_t rank = 0;
  std::vector<int64_t> owners;
};

// Appends the forward ops of module `l` named `name` reading `in` to `layer` (its params,
// params_total, matrices and saved_bytes too), B samples of e bytes: the branches `share` gives
// this rank and, split, the join's all-gather (its name in `gather`). Returns the module's output.
CellMap add_inception_module(Layer& layer, const std::string& name, const spec::CnnLayer& l,
                             CellMap in, int64_t B, int64_t e, const BranchShare& share,
                             std::string* gather);

}  // namespace sextant::models
