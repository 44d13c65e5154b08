// A transformer block's two layer pairs (QKV with the projection, FC1 with FC2) and the
// collectives around them, split as Megatron-LM splits them (Shoeybi et al. 2019: the first layer
// column-parallel, the second row-parallel, its partial outputs all-reduced; under sequence
// parallelism, Korthikanti et al. 2022, the all-reduce becomes a reduce-scatter and the input an
// all-gather: the f and g operators) or on AxoNN's 3D tensor grid (grid_linear.hpp). The
// embedding's and the output layer's own collectives are the same operators.
#pragma once

#include <cstdint>

#include "grid_linear.hpp"
#include "sextant/exec/context.hpp"
#include "sextant/exec/parameters.hpp"
#include "sextant/models/op_id.hpp"

namespace sextant::exec {

class LinearPairs {
 public:
  // `rows` of the micro-batch's activations [rows, h] on this rank; `grid` null under
  // Megatron-LM's split.
  LinearPairs(Context& ctx, GridLinear* grid, int64_t rows, int64_t h);
  // The rows a rank holds between the pairs: rows / tp under sequence parallelism
  // (Context::sequence_parallel), else all of them.
  int64_t local_rows() const { return local_rows_; }
  // Under sequence parallelism a rank holds 1/tp of the micro-batch's rows, by default. Here
  // instead 1/tp of the positions of each of the `batch` sequences (rank r: [r s/tp, (r+1) s/tp),
  // sequence after sequence), as Megatron-LM's [s, b, h] tensors split and per-op blocks' stream
  // is laid out (split_block.hpp): the gathers put the ranks' blocks back in sequence order and
  // the scatters take them out of it (fp32).
  void split_each_sequence(int64_t batch) { sequences_ = batch; }
  bool splits_each_sequence() const { return sp_ && sequences_ > 0; }

  // --- Megatron's f and g operators over the tp group ---
  // [local_rows, h] -> [rows, h] in front of a column-parallel GEMM.
  Tensor gather(const Tensor& x, const models::PartCollectives& part, spec::Phase phase,
                int32_t layer, int64_t mb);
  // Backward of gather: partial [rows, h] -> summed [local_rows, h].
  Tensor gather_backward(Tensor& d, const models::PartCollectives& part, int32_t layer, int64_t mb);
  // After a row-parallel GEMM: partial [rows, h] -> summed [local_rows, h].
  Tensor reduce_out(Tensor& y, const models::PartCollectives& part, spec::Phase phase,
                    int32_t layer, int64_t mb);
  // Backward of reduce_out: [local_rows, h] -> [rows, h].
  Tensor reduce_out_backward(const Tensor& d, const models::PartCollectives& part, int32_t layer,
                             int64_t mb);
  // A collective of `bytes` over the tp group, traced as `name`.
  Recorder::Scope comm_scope(models::OpId name, spec::OpClass cls, int64_t bytes, spec::Phase phase,
                             int32_t layer, int64_t mb);

  // --- A pair's linear layers ---
  // [local_rows, h] -> what the pair's first layer reads: the rows of every rank (sequence
  // parallelism's all-gather), or on a grid the rank's x part of the columns.
  Tensor pair_input(const Tensor& x, const models::PartCollectives& part, spec::Phase phase,
                    int32_t layer, int64_t mb);
  Tensor pair_input_backward(Tensor& d, const models::PartCollectives& part, int32_t layer,
                             int64_t mb);
  // The columns of a pair's input as its first layer reads them.
  int64_t pair_input_width() const;
  // QKV or FC1: the rank's columns of y = x W (+ b).
  void first_linear(models::OpId name, const Tensor& x, const Param& w, const Param* b, Tensor& y,
                    spec::Phase phase, int32_t layer, int64_t mb);
  void first_linear_backward(models::OpId name, const Tensor& x, Param& w, Param* b,
                             const Tensor& dy, Tensor& dx, int32_t layer, int64_t mb);
  // The projection or FC2 and the pair's output [local_rows, h]: the partial products summed
  // over tp (reduce-scattered under sequence parallelism; the bias is the residual's), or on a
  // grid the layer's x-split output (its bias added by the layer) all-gathered over x.
  Tensor second_linear(const models::PartCollectives& collectives, models::OpId name,
                       const Tensor& x, const Param& w, const Param* b, spec::Phase phase,
                       int32_t layer, int64_t mb);
  // The gradient of a pair's output [local_rows, h] -> that of the second layer's output.
  Tensor pair_output_backward(const Tensor& d, const models::PartCollectives& part, int32_t layer,
                              int64_t mb);
  void second_linear_backward(models::OpId name, const Tensor& x, Param& w, Param* b,
                              const Tensor& dy, Tensor& dx, int32_t layer, int64_t mb);

 private:
  Backend& backend() { return *ctx_.backend; }
  // Activations and their gradients: fp32, or bf16 in mixed precision.
  Tensor act(std::vector<int64_t> shape);

  // [rows, h] in sequence order -> the tp ranks' blocks in rank order, each [batch, s/tp, h]
  // (split_each_sequence), and back; as it is otherwise.
  Tensor to_rank_blocks(const Tensor& x);
  Tensor from_rank_blocks(const Tensor& x);

  Context& ctx_;
  GridLinear* grid_;
  int64_t t_;
  bool sp_;
  int64_t rows_, local_rows_, h_;
  int64_t sequences_ = 0;  // split_each_sequence's batch (0: the rows are split)
};

}  // namespace sextant::exec
