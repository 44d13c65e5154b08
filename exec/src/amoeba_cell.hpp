// One AmoebaNet-D cell on CPU ranks (Real et al. 2019; the cell GPipe pipelines, Huang et al.
// 2019): the two previous cells' outputs reduced to `filters` channels, five nodes each summing
// two edges' operations on earlier states, and the join of some states along the channels, as
// spec/amoeba_cell.hpp's genotype and torchgpipe's operations define them. Every op is traced
// under the name models::add_amoeba_cell gives it (the trace and the lowering agree by name, and
// Context::op refuses an op the lowering lacks).
//
// The cell is built once as a tape of steps over numbered values (the two inputs, then every
// intermediate map); forward runs the tape, backward runs it in reverse and sums the gradients of
// values read more than once. Its 1x7 and 7x1 windows, count-excluding average pools, shifted
// reductions and channel joins are host kernels (conv_kernels.hpp), so cells run on CPU ranks
// (make_cnn_stage refuses them on other backends).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sextant/exec/context.hpp"
#include "sextant/exec/parameters.hpp"
#include "sextant/models/op_id.hpp"
#include "sextant/spec/amoeba_cell.hpp"

namespace sextant::exec {

// A 2D map's channels, rows and columns.
struct CellMap {
  int64_t c = 0, h = 0, w = 0;
};

class AmoebaCell {
 public:
  // Cell `name` ("layerN", lowered layer `layer`) reading the previous cell's output `prev` and
  // the one before, `prev_prev` (the same map for the first cell of a chain; halved in size when
  // `reduction_prev`), on micro-batches of `batch` samples.
  AmoebaCell(std::string name, int32_t layer, CellMap prev, CellMap prev_prev, bool reduction_prev,
             int64_t filters, bool reduction, int64_t batch);

  const CellMap& output() const { return out_; }
  // The cell's parameters, in the order the tape creates them: convolution weights He-initialised
  // (std = sqrt(2 / fan_in)) from each element's index, batch norms' gamma 1 and beta 0.
  void add_params(std::vector<ParamSpec>& specs, uint64_t seed) const;

  // What backward needs of one micro-batch's forward.
  struct Cache {
    std::vector<Tensor> values;  // every value of the tape
    std::vector<Tensor> saved;   // per step: a convolution's or max pool's window input
    std::vector<Tensor> stats;   // per step: a batch norm's statistics
  };
  Tensor forward(Context& ctx, ParamStore& params, const Tensor& prev, const Tensor& prev_prev,
                 int64_t micro_batch, Cache& cache) const;
  // The gradients of prev and of prev_prev (the tape's two inputs, summed by the caller when
  // they are one map); the parameters' gradients are added to theirs.
  std::pair<Tensor, Tensor> backward(Context& ctx, ParamStore& params, const Tensor& dout,
                                     int64_t micro_batch, Cache& cache) const;

 private:
  enum class Kind { kRelu, kConv, kBatchNorm, kMaxPool, kAvgPool, kShift, kConcat, kAdd };
  struct Step {
    Kind kind = Kind::kRelu;
    std::optional<models::OpName> op;  // traced as (none: the reduction's shift, a view)
    std::vector<int> in;
    int out = 0;
    std::string param;       // a convolution's weight, a batch norm's prefix
    int64_t kh = 1, kw = 1;  // window (a pool's k x k)
    int64_t sh = 1, sw = 1;  // strides
    int64_t ph = 0, pw = 0;  // padding (the shift: its offset)
  };

  // Tape building, in models::add_amoeba_cell's order and names; each returns the value made.
  int add_value(CellMap m);
  int relu(const std::string& name, int in);
  int conv(const std::string& op_scope, const std::string& weight, int in, int64_t out_c,
           int64_t kh, int64_t kw, int64_t sh, int64_t sw);
  int batch_norm(const std::string& name, int in);
  int relu_conv_bn(const std::string& name, int in, int64_t out_c, int64_t kh, int64_t kw,
                   int64_t sh, int64_t sw);
  int factorized_reduce(const std::string& name, int in, int64_t out_c);
  int pool(const std::string& name, Kind kind, int in, int64_t k, int64_t s, int64_t p);
  // The steps of an edge's operation or of the second input's reduction (spec::AmoebaStep).
  int steps(const std::string& name, const std::vector<spec::AmoebaStep>& list, int in);

  std::vector<int64_t> shape(int value) const;
  Tensor run(Context& ctx, ParamStore& params, const Step& step, size_t index, int64_t mb,
             Cache& cache) const;
  void run_backward(Context& ctx, ParamStore& params, const Step& step, size_t index, int64_t mb,
                    Cache& cache, std::vector<Tensor>& grads) const;

  // A parameter the tape reads: a convolution weight (He-initialised, std_dev > 0) or a batch
  // norm's gamma or beta (the constant `value`, no weight decay).
  struct ParamDef {
    std::string name;
    std::vector<int64_t> shape;
    float std_dev = 0.0f, value = 0.0f;
  };

  std::string name_;
  int32_t layer_;
  std::vector<ParamDef> params_;
  int64_t batch_;
  std::vector<CellMap> maps_;  // each value's map
  std::vector<Step> steps_;
  CellMap out_;
};

}  // namespace sextant::exec
