// 3D tensor parallelism (AxoNN: Singh et al., "A 4D Hybrid Algorithm to Scale Parallel Training to
// Thousands of GPUs", arXiv:2305.13525, 2023; the algorithm as axonn/intra_layer/fully_connected.py
// and Megatron-AxoNN's transformer.py run it). The tp ranks form an x * y * z grid (Plan::tp_grid);
// for a linear layer Y = X W with W of k inputs and n outputs, a rank holding the (i, j) block of
// W (k/x by n/y, "inner" group x, "outer" group y) and a 1/z shard of that block:
//   forward:  all-gather the block over z, Y_ij = X_i W_ij on its m/z rows, all-reduce Y over x;
//   backward: all-gather the block over z again, dX_i = dY_j W_ij^T all-reduced over y,
//             dW_ij = X_i^T dY_j reduce-scattered over z (back to the rank's shard).
// The second linear layer of each pair (attention output projection, FC2) swaps x and y, so the
// output of the first (split over y) is already the input it needs. Around each block's two
// layers Megatron-AxoNN drops the x-split part of the whole activation before the first layer
// (no transfer) and all-gathers the output of the second over x; norms, residuals and the
// embedding and output layer run on the whole hidden vector of the slice's m/z rows.
// The one home of the rules: the plan check, the planner and the lowering ask them.
#pragma once

#include <cstdint>
#include <string>

#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::spec {

// What is wrong with the plan's tensor grid on its own (without a model), or "" when nothing is:
// x * y * z must equal tp; the grid replaces Megatron-LM's 1D tensor parallelism and is not
// (yet) combined with sequence, context or expert parallelism, ZeRO-3 or offload (its z axis
// already shards the weights as ZeRO-3 would).
std::string tensor_grid_problem(const Plan& plan);

// What is wrong with splitting `model` over the grid for micro-batches of `micro_batch`
// sequences, or "": a dense transformer whose heads and key/value heads (and so its hidden size)
// and ffn_hidden y divides, whose hidden size x divides, whose weight blocks z divides (each
// rank holds 1/z of its block's elements), and micro_batch that z divides (each z slice takes
// whole sequences).
std::string tensor_grid_model_problem(const ModelSpec& model, const TensorGrid& grid,
                                      int64_t micro_batch);

// "2x2x4": the grid as plan names and flags write it.
std::string tensor_grid_text(const TensorGrid& grid);

}  // namespace sextant::spec
