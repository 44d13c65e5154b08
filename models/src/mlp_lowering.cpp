// The lowering of an MLP: one linear layer and its activation (or the loss) per layer.
#include <fmt/format.h>

#include "lowering_ops.hpp"
#include "model_lowerings.hpp"
#include "sextant/models/cnn_fc_graph.hpp"

namespace sextant::models {

LoweredModel lower_mlp(const spec::ModelSpec& model, const LoweringOptions& o) {
  const spec::MlpSpec& m = model.mlp();
  const int64_t B = o.micro_batch;
  const int64_t e = spec::dtype_bytes(o.dtype);
  LoweredModel out;
  out.dtype = o.dtype;
  out.tokens_per_micro_batch = B;
  out.samples_per_micro_batch = B;
  const size_t n = m.widths.size() - 1;
  for (size_t i = 0; i < n; ++i) {
    Layer layer;
    layer.name = fmt::format("fc{}", i);
    layer.kind = LayerKind::kMlpLinear;
    const int64_t in = m.widths[i];
    const int64_t outw = m.widths[i + 1];
    Op fc = gemm(OpName(layer.name, OpId::kUnitProduct), B, outw, in, e, TpSplit::kReplicated);
    layer.forward.push_back(fc);
    const bool last = i + 1 == n;
    Op post = last ? memory_op(OpId::kLoss, OpClass::kLoss, B * outw * (e + 4),
                               TpSplit::kReplicated, {B, outw})
                   : memory_op(OpName(layer.name, OpId::kUnitAct), OpClass::kElementwise,
                               2 * B * outw * e, TpSplit::kReplicated, {B, outw});
    layer.forward.push_back(post);
    layer.backward.push_back(memory_backward(post, last ? 1.0 : 1.5));
    layer.backward.push_back(gemm_backward(fc));
    layer.params_total = layer.params = in * outw + (m.bias ? outw : 0);
    layer.matrices = {{in, outw}};  // exec/src/per_op/mlp_stage.cpp's [in, out]
    layer.saved_bytes = (B * in + B * outw) * e;
    layer.saved_bytes_selective = layer.saved_bytes;
    layer.saved_bytes_full = B * in * e;
    layer.output_bytes = B * outw * e;
    out.layers.push_back(std::move(layer));
  }
  out.split_begin = 0;
  out.split_end = out.layers.size();
  apply_fc_splits(out, o);  // per-op splits of its layers (cnn_fc_graph.hpp)
  return out;
}

}  // namespace sextant::models
