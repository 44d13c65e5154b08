// One Inception-v3 module on CPU ranks (Szegedy et al. 2016) as a unit tape (unit_tape.hpp):
// spec/inception_module.hpp's branches, each convolution followed by batch norm and ReLU, pools
// counting their padding, module e's split outputs joined, and the module's join, in
// models::add_inception_module's order and names.
#pragma once

#include <cstdint>
#include <string>

#include "sextant/spec/model_spec.hpp"
#include "unit_tape.hpp"

namespace sextant::exec {

// Module `l` named `name` ("layerN", lowered layer `layer`) reading `in` (its one input), on
// micro-batches of `batch` samples. With `ranks` > 1 its branches are split over the tp ranks
// (SUPER, spec/branch_parallel.hpp): the tape holds tp rank `rank`'s branches, the join's
// all-gather and the input gradient's sum.
UnitTape inception_module(const std::string& name, int32_t layer, const spec::CnnLayer& l,
                          CellMap in, int64_t batch, int64_t ranks = 1, int64_t rank = 0);

}  // namespace sextant::exec
