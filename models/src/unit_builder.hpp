// The ops of a multi-branch unit (an AmoebaNet cell, an Inception module): every convolution an
// implicit GEMM (M = B x output pixels, N = output channels, K = input channels x kernel area),
// batch norm, ReLU, pools, sums and joins as memory-bound passes. What backward keeps: each
// convolution's and pool's input, each batch norm's input and each ReLU's output (as the ResNet
// lowering counts them). Private to models/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lowering_ops.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/spec/amoeba_cell.hpp"
#include "sextant/spec/model_spec.hpp"

namespace sextant::models {

// A map of a sample: channels, rows, columns.
struct CellMap {
  int64_t c = 0, h = 0, w = 0;
};

// How a unit's work is placed: all on the one rank (ranks 1), or SUPER's split over `ranks` tp
// ranks (spec/branch_parallel.hpp), the ops those of rank `rank`: `owners` the rank of each
// Inception branch or AmoebaNet node, `join_owners` of each part of a cell's join.
struct BranchShare {
  int64_t ranks = 1;
  int64_t rank = 0;
  std::vector<int64_t> owners;
  std::vector<int64_t> join_owners;
};

// What a split unit adds beside its forward ops: the join's all-gather (`gather`, its name), and
// in backward one all-reduce of `sum_bytes` (the gradients every rank's branches add to), placed
// before the backward of the unit's first `prelude_ops` forward ops (those every rank runs).
struct BranchJoin {
  std::string gather;
  int64_t sum_bytes = 0;
  size_t prelude_ops = 0;
};

// Builds one multi-branch unit's ops into `layer`, B samples of e bytes.
class UnitBuilder {
 public:
  UnitBuilder(Layer& layer, int64_t B, int64_t e) : layer_(layer), B_(B), e_(e) {}

  void relu(const std::string& name, const CellMap& m) {
    layer_.forward.push_back(memory_op(OpName(name, OpId::kUnitRelu), OpClass::kElementwise,
                                       2 * bytes(m), TpSplit::kReplicated, {B_, m.c, m.h, m.w}));
    layer_.saved_bytes += bytes(m);
  }
  // A kh x kw convolution without bias padded by half its window, then batch norm; returns its
  // output.
  CellMap conv_bn(const std::string& name, const CellMap& in, int64_t out_c, int64_t kh, int64_t kw,
                  int64_t stride_h, int64_t stride_w) {
    return conv_bn_padded(name, in, out_c, kh, kw, stride_h, stride_w, (kh - 1) / 2, (kw - 1) / 2);
  }
  // The same with padding ph x pw.
  CellMap conv_bn_padded(const std::string& name, const CellMap& in, int64_t out_c, int64_t kh,
                         int64_t kw, int64_t stride_h, int64_t stride_w, int64_t ph, int64_t pw) {
    const CellMap o{out_c, spec::window_output(in.h, kh, stride_h, ph),
                    spec::window_output(in.w, kw, stride_w, pw)};
    conv(name, in, o, kh, kw);
    batch_norm(name, o);
    return o;
  }
  // ReLU, convolution, batch norm (torchgpipe's relu_conv_bn and the conv operations' steps).
  CellMap relu_conv_bn(const std::string& name, const CellMap& in, int64_t out_c, int64_t kh,
                       int64_t kw, int64_t stride_h, int64_t stride_w) {
    relu(name, in);
    return conv_bn(name, in, out_c, kh, kw, stride_h, stride_w);
  }
  // ReLU, two 1x1 convolutions of stride 2 to out_c/2 (the second on the map shifted by a
  // pixel, a padded view whose copy is not priced), joined, batch norm over out_c.
  CellMap factorized_reduce(const std::string& name, const CellMap& in, int64_t out_c) {
    relu(name, in);
    const CellMap o{out_c, (in.h + 1) / 2, (in.w + 1) / 2}, half{out_c / 2, o.h, o.w};
    conv(name + ".conv1", in, half, 1, 1);
    conv(name + ".conv2", in, half, 1, 1);
    layer_.forward.push_back(memory_op(OpName(name, OpId::kUnitConcat), OpClass::kElementwise,
                                       2 * bytes(o), TpSplit::kReplicated, {B_, o.c, o.h, o.w}));
    batch_norm(name, o);
    return o;
  }
  CellMap pool(const std::string& name, const CellMap& in, int64_t kernel, int64_t stride,
               int64_t padding) {
    const CellMap o{in.c, spec::window_output(in.h, kernel, stride, padding),
                    spec::window_output(in.w, kernel, stride, padding)};
    layer_.forward.push_back(memory_op(OpName(name, OpId::kUnitPool), OpClass::kPool,
                                       bytes(in) + bytes(o), TpSplit::kReplicated,
                                       {B_, o.c, o.h, o.w}));
    layer_.saved_bytes += bytes(in);
    return o;
  }
  // Steps of an edge's operation or of a cell input's reduction (spec::AmoebaStep) on `in`.
  CellMap steps(const std::string& name, const std::vector<spec::AmoebaStep>& list, CellMap in) {
    using K = spec::AmoebaStep::Kind;
    for (const spec::AmoebaStep& st : list) {
      switch (st.kind) {
        case K::kReluConvBn:
          in = relu_conv_bn(name + st.suffix, in, st.channels, st.kh, st.kw, st.sh, st.sw);
          break;
        case K::kMaxPool:
        case K::kAvgPool:
          in = pool(name, in, st.kh, st.sh, st.padding);
          break;
        case K::kFactorizedReduce:
          in = factorized_reduce(name, in, st.channels);
          break;
      }
    }
    return in;
  }
  // A node's sum of its two edges.
  void add(const std::string& name, const CellMap& m) {
    layer_.forward.push_back(memory_op(OpName(name, OpId::kUnitResidual), OpClass::kElementwise,
                                       3 * bytes(m), TpSplit::kReplicated, {B_, m.c, m.h, m.w}));
  }
  // A join of states or branches' outputs along the channels into `out`.
  void join(const std::string& name, const CellMap& out) {
    layer_.forward.push_back(memory_op(OpName(name, OpId::kUnitConcat), OpClass::kElementwise,
                                       2 * bytes(out), TpSplit::kReplicated,
                                       {B_, out.c, out.h, out.w}));
  }

 private:
  int64_t bytes(const CellMap& m) const { return B_ * m.c * m.h * m.w * e_; }
  // A kh x kw convolution without bias from `in` to `o`: an implicit GEMM (M = B x output
  // pixels, N = output channels, K = input channels x kernel area) that keeps its input.
  void conv(const std::string& name, const CellMap& in, const CellMap& o, int64_t kh, int64_t kw) {
    Op op = gemm(OpName(name, OpId::kUnitProduct), B_ * o.h * o.w, o.c, in.c * kh * kw, e_,
                 TpSplit::kReplicated);
    op.op_class = OpClass::kConv;
    op.bytes = bytes(in) + o.c * in.c * kh * kw * e_ + bytes(o);
    layer_.forward.push_back(op);
    layer_.saved_bytes += bytes(in);
    weights(o.c * in.c * kh * kw);
    layer_.matrices.push_back({o.c, in.c * kh * kw});
    // With the batch norm every unit's convolution feeds (its channels' scale and shift).
    layer_.add_convolution(name, in.c * in.h * in.w, o.c * o.h * o.w,
                           o.c * in.c * kh * kw + 2 * o.c);
  }
  // Batch norm over `m`, which it keeps; its scale and shift.
  void batch_norm(const std::string& name, const CellMap& m) {
    layer_.forward.push_back(memory_op(OpName(name, OpId::kUnitBatchNorm), OpClass::kNorm,
                                       2 * bytes(m), TpSplit::kReplicated, {B_, m.c, m.h, m.w}));
    weights(2 * m.c);
    layer_.saved_bytes += bytes(m);
  }
  void weights(int64_t n) {
    layer_.params += n;
    layer_.params_total += n;
  }
  Layer& layer_;
  int64_t B_, e_;
};

}  // namespace sextant::models
