// Whole-model figures: parameters, FLOPs per training step, activation memory per layer. Computed
// from the lowering, so that the simulator and these totals cannot disagree.
#pragma once

#include <cstdint>

#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::models {

// Unique trainable parameters (tied embeddings counted once).
int64_t parameter_count(const spec::ModelSpec& model);
// The parameters one token's forward pass uses: all but the routed experts it is not sent to
// (top_k of experts in each mixture-of-experts block); parameter_count for dense models.
int64_t active_parameter_count(const spec::ModelSpec& model);

struct StepFlops {
  double model = 0;     // forward + backward, no recompute (what MFU counts)
  double hardware = 0;  // including recomputed forward work (what HFU counts)
};
// Training FLOPs of one optimizer step over `global_batch` sequences/samples.
StepFlops step_flops(const spec::ModelSpec& model, int64_t global_batch, int64_t seq_len,
                     spec::Recompute recompute);
// The same for a plan's global batch and recompute (a full recompute of some layers of each
// chunk recomputes only those: layer_recompute).
StepFlops step_flops(const spec::ModelSpec& model, const spec::Plan& plan, int64_t seq_len);
// Forward FLOPs per token (transformers) or per sample.
double forward_flops_per_token(const spec::ModelSpec& model, int64_t seq_len);

// Activation bytes kept for backward by one transformer block on one tp rank, per micro-batch.
int64_t block_activation_bytes(const spec::ModelSpec& model, int64_t micro_batch, int64_t seq_len,
                               int64_t tp, bool sequence_parallel, spec::Recompute recompute,
                               spec::Dtype dtype);

}  // namespace sextant::models
