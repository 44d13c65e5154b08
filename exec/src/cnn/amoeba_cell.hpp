// One AmoebaNet-D cell on CPU ranks (Real et al. 2019; the cell GPipe pipelines, Huang et al.
// 2019) as a unit tape (unit_tape.hpp): the two previous cells' outputs reduced to `filters`
// channels, five nodes each summing two edges' operations on earlier states, and the join of some
// states along the channels, as spec/amoeba_cell.hpp's genotype and torchgpipe's operations
// define them, in models::add_amoeba_cell's order and names.
#pragma once

#include <cstdint>
#include <string>

#include "unit_tape.hpp"

namespace sextant::exec {

// Cell `name` ("layerN", lowered layer `layer`) reading the previous cell's output `prev` (input
// 0) and the one before, `prev_prev` (input 1: the same map for the first cell of a chain; twice
// the rows and columns when `reduction_prev`), on micro-batches of `batch` samples. With `ranks`
// > 1 its sub-graphs are split over the tp ranks (SUPER, spec/branch_parallel.hpp): every rank
// reduces both inputs (their parameters whole on each), sums the reduced states' gradients over
// the ranks, and runs its groups of nodes; the join is all-gathered.
UnitTape amoeba_cell(const std::string& name, int32_t layer, CellMap prev, CellMap prev_prev,
                     bool reduction_prev, int64_t filters, bool reduction, int64_t batch,
                     int64_t ranks = 1, int64_t rank = 0);

}  // namespace sextant::exec
