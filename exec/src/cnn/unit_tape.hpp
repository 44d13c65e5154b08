// A multi-branch unit of a CNN on CPU ranks (an AmoebaNet cell, an Inception module) as a tape of
// steps over numbered values: the unit's inputs first, then every map a step makes. Forward runs
// the tape; backward runs it in reverse and sums the gradients of values read more than once.
// Every traced step runs under the op name the lowering gives it (models/src/unit_builder.hpp),
// so the trace and the lowering agree by name and Context::op refuses an op the lowering lacks.
// Its asymmetric windows, shifted maps, pools and channel joins are host kernels
// (conv_kernels.hpp): units run on CPU ranks (make_cnn_stage refuses them on other backends).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sextant/exec/context.hpp"
#include "sextant/exec/parameters.hpp"
#include "sextant/models/op_id.hpp"

namespace sextant::exec {

// A 2D map's channels, rows and columns.
struct CellMap {
  int64_t c = 0, h = 0, w = 0;
};

class UnitTape {
 public:
  // Unit `name` ("layerN", lowered layer `layer`) on micro-batches of `batch` samples.
  UnitTape(std::string name, int32_t layer, int64_t batch);

  // Building, in the lowering's order and names; each returns the value made. Inputs come first.
  int input(CellMap m);
  int relu(const std::string& name, int in);
  // A kh x kw convolution without bias of strides sh x sw, padded by ph x pw, traced as
  // `op_scope`'s product; its weight `weight` He-initialised.
  int conv(const std::string& op_scope, const std::string& weight, int in, int64_t out_c,
           int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw);
  // Batch norm over the channels; its gamma and beta are `name`.bn.weight and .bias.
  int batch_norm(const std::string& name, int in);
  enum class Pool { kMax, kAvgExcludingPadding, kAvgIncludingPadding };
  int pool(const std::string& name, Pool kind, int in, int64_t k, int64_t s, int64_t p);
  // The map shifted up and left by `by` pixels, zeros past the edge (a view: not traced).
  int shift(int in, int64_t by);
  int concat(const std::string& name, const std::vector<int>& in);
  int add(const std::string& name, int a, int b);
  // SUPER's join of a module whose branches the tp ranks split (spec/branch_parallel.hpp): this
  // rank's branch outputs `mine` (in branch order) all-gathered over the tp group with the other
  // ranks' into the whole join of `parts` (every branch's channels and owner, in branch order), a
  // map of `joined`'s rows and columns. Traced as `name`'s branch_all_gather and its concat.
  struct BranchPart {
    int64_t channels = 0;
    int64_t owner = 0;
  };
  int branch_gather(const std::string& name, const std::vector<int>& mine,
                    const std::vector<BranchPart>& parts, int64_t rank, int64_t ranks,
                    CellMap joined);
  // SUPER's sum of the gradients of `values`, which every tp rank holds and its branches read:
  // in backward, once every later step has added its part, one all-reduce over the tp group
  // (traced as the unit's branch_all_reduce). Nothing in forward.
  void branch_sum(const std::vector<int>& values);
  // Whether the parameters created from now on are whole on every tp rank (a split unit's shared
  // steps), which the gradient norm counts once.
  void set_replicated(bool replicated) { replicated_ = replicated; }
  // Checks that every value made is read by a later step or is the output (the last step's), so
  // backward reaches each step with its output's gradient.
  void finish() const;

  const CellMap& map(int value) const { return maps_[static_cast<size_t>(value)]; }
  const std::string& name() const { return name_; }
  const CellMap& output() const { return maps_[static_cast<size_t>(steps_.back().out)]; }

  // The unit's parameters, in the order the tape creates them: convolution weights He-initialised
  // (std = sqrt(2 / fan_in)) from each element's index, batch norms' gamma 1 and beta 0.
  void add_params(std::vector<ParamSpec>& specs, uint64_t seed) const;

  // What backward needs of one micro-batch's forward.
  struct Cache {
    std::vector<Tensor> values;  // every value of the tape
    std::vector<Tensor> saved;   // per step: a convolution's or max pool's window input
    std::vector<Tensor> stats;   // per step: a batch norm's statistics
  };
  Tensor forward(Context& ctx, ParamStore& params, const std::vector<Tensor>& inputs,
                 int64_t micro_batch, Cache& cache) const;
  // The gradients of the inputs (summed by the caller where two are one map); the parameters'
  // gradients are added to theirs.
  std::vector<Tensor> backward(Context& ctx, ParamStore& params, const Tensor& dout,
                               int64_t micro_batch, Cache& cache) const;

 private:
  enum class Kind {
    kRelu,
    kConv,
    kBatchNorm,
    kMaxPool,
    kAvgPool,
    kAvgPoolPadded,
    kShift,
    kConcat,
    kAdd,
    kBranchGather,
    kBranchSum
  };
  struct Step {
    Kind kind = Kind::kRelu;
    std::optional<models::OpName> op;  // traced as (none: a shift, a view)
    std::vector<int> in;
    int out = 0;
    std::string param;              // a convolution's weight, a batch norm's prefix
    int64_t kh = 1, kw = 1;         // window (a pool's k x k)
    int64_t sh = 1, sw = 1;         // strides
    int64_t ph = 0, pw = 0;         // padding (the shift: its offset)
    std::vector<BranchPart> parts;  // a branch gather's branches
    int64_t rank = 0, ranks = 1;    // ... and this rank in the tp group
  };
  // A parameter the tape reads: a convolution weight (He-initialised, std_dev > 0) or a batch
  // norm's gamma or beta (the constant `value`, no weight decay).
  struct ParamDef {
    std::string name;
    std::vector<int64_t> shape;
    float std_dev = 0.0f, value = 0.0f;
    bool replicated = false;  // ParamSpec::tp_replicated
  };

  int add_value(CellMap m);
  int push(Step step, CellMap made);
  std::vector<int64_t> shape(int value) const;
  Tensor run(Context& ctx, ParamStore& params, const Step& step, size_t index, Cache& cache) const;
  void run_backward(Context& ctx, ParamStore& params, const Step& step, size_t index, Cache& cache,
                    std::vector<Tensor>& grads) const;
  Tensor gather_branches(Context& ctx, const Step& step, Cache& cache, int64_t micro_batch) const;
  // The gradient of each of this rank's branch outputs: its channels of the join's gradient.
  void scatter_branch_gradient(Context& ctx, const Step& step, std::vector<Tensor>& grads) const;
  void sum_branch_gradients(Context& ctx, const Step& step, std::vector<Tensor>& grads,
                            int64_t micro_batch) const;

  std::string name_;
  int32_t layer_;
  int64_t batch_;
  int inputs_ = 0;
  bool replicated_ = false;
  std::vector<ParamDef> params_;
  std::vector<CellMap> maps_;  // each value's map
  std::vector<Step> steps_;
};

}  // namespace sextant::exec
