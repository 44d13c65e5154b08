// The linear layers of a GPT block on AxoNN's 3D tensor grid (spec/tensor_grid.hpp has the
// algorithm and its rules; models/src/grid_lowering.cpp's grid_linear and grid_block price the same
// ops, under the same names). A rank at (i, j, l) of the x * y * z grid holds a 1/z shard of the
// (i, j) block of each weight of a layer pair's first layer (QKV, FC1: inputs split over x,
// outputs over y) and of the (j, i) block of its second (projection, FC2: x and y swapped), and
// works on the rows of its z slice's sequences:
//   forward:  block all-gathered over z; y = x W (+ bias); y all-reduced over the inner axis;
//   backward: block all-gathered again (no copy is kept); dx = dy W^T all-reduced over the outer
//             axis; dW = x^T dy reduce-scattered over z into the rank's shard.
// Around a pair, Megatron-AxoNN takes the rank's x part of the whole activation before the first
// layer (a slice; backward: an all-gather over x) and all-gathers the second layer's x-split
// output over x (backward: a slice).
// Host copies rearrange the column blocks: CPU ranks in fp32 (runner.cpp refuses the others).
#pragma once

#include <string>

#include "sextant/exec/context.hpp"
#include "sextant/exec/parameters.hpp"

namespace sextant::exec {

class GridLinear {
 public:
  // Which layer of a pair: the first reads inputs split over x and writes outputs split over y
  // (inner axis x, outer y); the second the other way round.
  enum class Role { kFirst, kSecond };

  explicit GridLinear(Context& ctx);

  int64_t x() const { return axis(0).size; }
  int64_t y() const { return axis(1).size; }
  int64_t z() const { return axis(2).size; }
  int64_t x_rank() const { return axis(0).rank; }
  int64_t y_rank() const { return axis(1).rank; }
  int64_t z_rank() const { return axis(2).rank; }

  // [rows, h] -> the rank's x part [rows, h / x]: columns [i h / x, (i + 1) h / x). No transfer.
  Tensor slice(const Tensor& whole) const;
  // The rank's x part [rows, h / x] -> [rows, h], all-gathered over x (traced prefix.all_gather).
  Tensor gather(const Tensor& part, const models::PartCollectives& collectives, spec::Phase phase,
                int32_t layer, int64_t mb);

  // y[rows, n / outer] = x[rows, k / inner] W (+ bias, added by the inner axis's first rank
  // before the sum). `w` is the rank's shard of its block; traced as `name` with
  // name.weight_gather and name.all_reduce.
  void forward(models::OpId name, Role role, const Tensor& x, const Param& w, const Param* bias,
               Tensor& y, spec::Phase phase, int32_t layer, int64_t mb);
  // dx = dy W^T (summed over the outer axis); w's shard of dW and the bias's gradient added to.
  void backward(models::OpId name, Role role, const Tensor& x, Param& w, Param* bias,
                const Tensor& dy, Tensor& dx, int32_t layer, int64_t mb);

 private:
  const GridAxis& axis(size_t a) const { return ctx_.groups->grid[a]; }
  const GridAxis& inner(Role r) const { return axis(r == Role::kFirst ? 0 : 1); }
  const GridAxis& outer(Role r) const { return axis(r == Role::kFirst ? 1 : 0); }
  // The whole block [k_local, block / k_local] of `w` for inputs of k_local features.
  Tensor block(const models::GridLinearOps& ops, const Param& w, int64_t k_local, spec::Phase phase,
               int32_t layer, int64_t mb);
  // A collective of the grid, traced on the tp stream, or over z on the depth group's own
  // (spec::Stream::kDepthComm, as the simulator places it).
  Recorder::Scope comm(models::OpId name, spec::OpClass cls, int64_t bytes, int64_t group_size,
                       spec::Phase phase, int32_t layer, int64_t mb,
                       spec::Stream stream = spec::Stream::kTpComm);

  Context& ctx_;
};

}  // namespace sextant::exec
