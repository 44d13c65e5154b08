// The lowering of one AmoebaNet-D cell (spec/amoeba_cell.hpp): its reductions of the two inputs,
// every edge's operations and the nodes' sums, and the join. Private to models/; the CNN
// lowering (cnn_lowering.cpp) calls it for each amoeba_cell layer.
#pragma once

#include <cstdint>
#include <string>

#include "sextant/models/lowering.hpp"
#include "unit_builder.hpp"

namespace sextant::models {

// Appends the forward ops of a cell named `name` of `filters` channels per state to `layer` (its
// params, params_total, matrices and saved_bytes too), reading `prev` (the previous cell's output,
// or the map before the first cell) and `prev_prev` (the output before that; `prev` for the first
// cell); `reduction_prev`: `prev` came out of a reduction cell, so `prev_prev` has twice its rows
// and columns. B samples, e bytes per element. Returns the cell's output.
// Split (`share`, spec/branch_parallel.hpp), the reductions of both inputs on every rank, this
// rank's nodes, and the join's all-gather; `join` says it and the reduced states' gradient sum.
CellMap add_amoeba_cell(Layer& layer, const std::string& name, CellMap prev, CellMap prev_prev,
                        bool reduction_prev, int64_t filters, bool reduction, int64_t B, int64_t e,
                        const BranchShare& share, BranchJoin& join);

}  // namespace sextant::models
