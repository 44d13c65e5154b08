// Runs training steps of a plan on this rank: the pipeline schedule over micro-batches with
// activations and gradients sent between stages, gradient synchronisation (DDP or ZeRO), global
// gradient-norm clipping, AdamW, per-step logging, traces and checkpoints.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sextant/exec/context.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/trace.hpp"

namespace sextant::exec {

struct TrainOptions {
  int64_t steps = 10;
  uint64_t seed = 1234;
  std::string data = "synthetic";  // or a path to a text file (byte-level)
  float lr = 1e-3f;
  float weight_decay = 0.1f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float clip = 1.0f;  // global gradient-norm clipping; 0 disables
  std::string checkpoint_dir;
  // Offload of the optimizer states or the parameters to NVMe: the directory of each rank's
  // files (DeepSpeed's nvme_path; empty: the system's temporary directory).
  std::string nvme_dir;
  int64_t checkpoint_every = 0;
  bool resume = false;
  // With resume: a directory without a checkpoint starts from step 0 instead of being an error
  // (a mistyped --checkpoint once started over silently).
  bool resume_if_exists = false;
  // The sequential definition of an asynchronous pipeline, on one rank without a pipeline (the
  // single-process reference PipeDream's weight stashing equals): step t computes the layer with
  // index l with the weights after max(0, t - layer_staleness[l]) updates and updates the newest.
  // Empty: every layer fresh. PipeDream's stage s is pp - 1 - s steps stale.
  std::vector<int64_t> layer_staleness;
};

struct StepLog {
  int64_t step = 0;
  double loss = 0;
  double step_time_s = 0;
  double tokens_per_s = 0;
  double grad_norm = 0;
};

struct TrainResult {
  std::vector<StepLog> steps;            // identical on every rank
  std::vector<spec::TraceEvent> events;  // this rank's, when recording
};

// Trains on this rank; every rank of the job calls it, the plan and model checked first against
// what the executor runs (exec::check_job, spec::executor_problems). `on_step` runs after each
// step (rank 0 logs). Throws InputError for a checkpoint it cannot resume (every rank throws the
// same), and std::runtime_error when the loss becomes NaN (naming the step).
TrainResult train(const spec::ModelSpec& model, Context& ctx, const TrainOptions& options,
                  const std::function<void(const StepLog&)>& on_step);

}  // namespace sextant::exec
