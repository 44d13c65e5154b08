// The part of a model one pipeline stage runs, on one tensor-parallel (or spatial) rank: forward
// and backward of a micro-batch, with its parameters. GPT, MLP and CNN implement it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "sextant/exec/context.hpp"
#include "sextant/exec/parameters.hpp"
#include "sextant/spec/model_spec.hpp"

namespace sextant::exec {

// One micro-batch of this data-parallel replica.
struct MicroBatch {
  int64_t index = 0;             // within the step
  std::vector<int32_t> tokens;   // transformer: batch*seq input tokens
  std::vector<int32_t> targets;  // next tokens (transformer) or classes (MLP)
  // Under a per-op split of a decoder's logits: the targets of every replica's same micro-batch,
  // replica after replica (a rank may compute the logits of every replica's tokens).
  std::vector<int32_t> replica_targets;
  std::vector<float> features;  // MLP: batch*inputs; CNN: batch*channels*height*width
  int64_t rows = 0;             // tokens (transformer) or samples (MLP)
};

// Called around each layer: ZeRO-3 gathers parameters before, reduce-scatters gradients after;
// data parallelism launches gradient buckets after the last micro-batch's backward.
class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  virtual void before_forward(int32_t layer, int64_t micro_batch) = 0;
  virtual void before_backward(int32_t layer, int64_t micro_batch) = 0;
  virtual void after_backward(int32_t layer, int64_t micro_batch) = 0;
};

class StageModel {
 public:
  virtual ~StageModel() = default;
  // Model chunks this stage holds: 1, or the virtual stages of the interleaved schedule (local
  // chunk c is the model's chunk c * pp + stage).
  virtual int64_t chunks() const { return 1; }
  // Forward of micro-batch `mb` through local chunk `chunk`. The model's first chunk reads the
  // batch; the others get `input`. Returns the activation for the next chunk (empty for the last,
  // which accumulates the loss).
  virtual Tensor forward(const MicroBatch& mb, const Tensor* input, int64_t chunk) = 0;
  // Backward of micro-batch `mb` through `chunk` (the last chunk starts from its loss). Returns the
  // gradient for the previous chunk (empty for the first).
  virtual Tensor backward(const MicroBatch& mb, const Tensor* grad_output, int64_t chunk) = 0;
  virtual ParamStore& params() = 0;
  // Shape of the activation crossing into this stage (and of its gradient).
  virtual std::vector<int64_t> input_shape() const = 0;
  // Shape of the activation this stage sends on (and of the gradient it receives): the next
  // stage's input_shape.
  virtual std::vector<int64_t> output_shape() const { return input_shape(); }
  // Sum of the per-token (per-sample) losses since the last call (last stage; 0 elsewhere): this
  // rank's share of its replica's, which the spatial ranks of a CNN split between them.
  virtual double take_loss_sum() = 0;
  virtual void set_hooks(LayerHooks* hooks) = 0;
  // Sum of squared gradients this rank owns for the global norm (replicated tensors counted on
  // tensor-parallel rank 0 only, tied copies not at all); [begin, end) of the flat buffer only.
  virtual double grad_square_sum(int64_t begin, int64_t end) = 0;
};

struct StageOptions {
  uint64_t seed = 1234;
  int64_t micro_batch = 1;  // sequences or samples
  int64_t seq_len = 0;      // transformers
};

// Builds the stage of this rank (ctx.groups gives tp/pp position). Throws InputError for models
// the executor cannot run (naming what is unsupported).
std::unique_ptr<StageModel> make_stage_model(const spec::ModelSpec& model, Context& ctx,
                                             const StageOptions& options);

}  // namespace sextant::exec
