// The layers of a CNN stage (cnn_stage.cpp): each lowered unit's forward and backward on this
// rank, by kind (a convolution with its batch norm and ReLU, an up-convolution, a cropped concat,
// the pools, an fc, a bottleneck block), with what each keeps for backward per micro-batch.
// AmoebaNet's cells run through amoeba_cell.hpp. The maps' geometry and the traced exchanges and
// collectives are CnnMaps'; the parameters and where their gradients accumulate, CnnParams'.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "amoeba_cell.hpp"
#include "cnn_maps.hpp"
#include "cnn_units.hpp"
#include "inception_module.hpp"
#include "per_op/split_fc_chain.hpp"
#include "sextant/exec/parameters.hpp"
#include "train/stage_model.hpp"

namespace sextant::exec::cnn {

struct ConvCache {
  Tensor window, z, y;             // window input, convolution output, normalised output (pre-ReLU)
  std::vector<double> mean, rstd;  // batch statistics of maps split over ranks (on the host)
  Tensor stats;                    // those of whole maps (with the backend: batch_norm_whole)
};
struct UnitCache {
  std::vector<ConvCache> convs;
  Tensor x, pre, window;  // layer input, pre-activation (fc, residual sum), pool window input
  Tensor pooled;          // a max pool's output (its backward finds each window's maximum again)
  // A kept output (U-Net's skip), and its gradient from the concat that joined it (backward
  // reaches the concat first; the unit's own backward adds it to the gradient of its output).
  Tensor kept, kept_grad;
  UnitTape::Cache cell;  // an AmoebaNet cell's or Inception module's
};
// A micro-batch's caches of the stage's units [begin, begin + size).
struct StageCaches {
  int32_t begin = 0;
  std::vector<UnitCache> units;
  UnitCache& of(int32_t layer) { return units.at(static_cast<size_t>(layer - begin)); }
};

// The parameters of a stage's units [begin, end) on this rank, from each element's index in the
// whole tensor so that every layout starts alike, and where each gradient accumulates.
class CnnParams {
 public:
  // `split_fc`: the fc layers under per-op splits (nullptr: none), whose blocks it holds.
  CnnParams(const std::vector<Unit>& units, int32_t begin, int32_t end, const CnnMaps& maps,
            uint64_t seed, std::map<int32_t, std::unique_ptr<UnitTape>>& cells,
            SplitFcChain* split_fc);
  ParamStore& store() { return *store_; }
  Param& get(const std::string& name) { return store_->get(name); }
  // Where a parameter's gradient accumulates: its own, or the scratch of a spatial rank other
  // than the first for the layers behind the split.
  Tensor grad_of(Param& p, const Unit& u);

 private:
  std::unique_ptr<ParamStore> store_;
  Tensor scratch_;
  std::map<std::string, int64_t> scratch_offset_;
};

class CnnLayers {
 public:
  // `split_fc`: the fc layers under per-op splits (nullptr: none), which run them.
  CnnLayers(CnnMaps& maps, CnnParams& params, const std::vector<Unit>& units,
            SplitFcChain* split_fc)
      : maps_(maps), params_(params), units_(units), split_fc_(split_fc) {}
  // A unit's forward (the classifier adds to the loss); a kept output is also held for its
  // concat.
  Tensor forward(const Unit& u, const Tensor& x, const MicroBatch& mb, StageCaches& caches);
  // A unit's backward; a kept output's gradient is the sum of its two uses'.
  Tensor backward(const Unit& u, const Tensor& dout, const MicroBatch& mb, StageCaches& caches);
  // The loss summed since the last call.
  double take_loss();
  // Drops what a micro-batch's loss kept for its backward.
  void forget(int64_t mb);

 private:
  Tensor forward_pass(const Unit& u, const Tensor& x, const MicroBatch& mb, StageCaches& caches);
  Tensor backward_pass(const Unit& u, const Tensor& dout, const MicroBatch& mb,
                       StageCaches& caches);
  // cnn_conv.cpp: a convolution with its batch norm and ReLU, and its channel collectives.
  Tensor forward_conv(const ConvUnit& c, const Tensor& x, bool split, int32_t layer, int64_t mb,
                      ConvCache& cache);
  // Returns the input gradient (empty without `input_gradient`).
  Tensor backward_conv(const ConvUnit& c, const Tensor& dout, bool split, bool input_gradient,
                       const Unit& u, int64_t mb, ConvCache& cache);
  Tensor forward_conv_unit(const Unit& u, const Tensor& x, const MicroBatch& mb, UnitCache& cache);
  Tensor backward_conv_unit(const Unit& u, const Tensor& dout, const MicroBatch& mb,
                            UnitCache& cache);
  Tensor forward_bottleneck(const Unit& u, const Tensor& x, int64_t mb, UnitCache& cache);
  Tensor backward_bottleneck(const Unit& u, const Tensor& dout, int64_t mb, UnitCache& cache);
  // cnn_layers.cpp: the other kinds.
  Tensor forward_up_conv(const Unit& u, const Tensor& x, int64_t mb, UnitCache& cache);
  Tensor backward_up_conv(const Unit& u, const Tensor& dout, int64_t mb, UnitCache& cache);
  Tensor forward_concat(const Unit& u, const Tensor& x, int64_t mb, StageCaches& caches);
  Tensor backward_concat(const Unit& u, const Tensor& dout, int64_t mb, StageCaches& caches);
  Tensor forward_pool(const Unit& u, const Tensor& x, int64_t mb, UnitCache& cache);
  Tensor backward_pool(const Unit& u, const Tensor& dout, int64_t mb, UnitCache& cache);
  Tensor forward_adaptive_pool(const Unit& u, const Tensor& x, int64_t mb);
  Tensor backward_adaptive_pool(const Unit& u, const Tensor& dout, int64_t mb);
  Tensor forward_fc(const Unit& u, const Tensor& x, const MicroBatch& mb, UnitCache& cache);
  Tensor backward_fc(const Unit& u, const Tensor& dout, const MicroBatch& mb, UnitCache& cache);
  // The classifier's softmax loss over this replica's logits [micro-batch, classes] (kept), and
  // its gradient.
  void add_loss(const Unit& u, const Tensor& logits, const MicroBatch& mb, UnitCache& cache);
  Tensor loss_gradient(const Unit& u, const MicroBatch& mb, UnitCache& cache);

  CnnMaps& maps_;
  CnnParams& params_;
  const std::vector<Unit>& units_;
  SplitFcChain* split_fc_;
  std::map<int64_t, std::vector<float>> max_, sum_;  // the classifier's softmax statistics
  double loss_ = 0;
};

}  // namespace sextant::exec::cnn
