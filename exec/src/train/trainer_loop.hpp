// The training loop of one rank (exec::train), declared for the files that define it: the
// synchronous step (trainer.cpp), the asynchronous schedules and parameter servers
// (trainer_async.cpp), the host optimizer and NVMe states (trainer_host.cpp) and checkpoints
// (trainer_checkpoint.cpp).
#pragma once

#include <fmt/format.h>

#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <list>
#include <map>
#include <optional>
#include <span>
#include <string_view>

#include "checkpoint.hpp"
#include "comm/activation_comm.hpp"
#include "data.hpp"
#include "gradient_sync.hpp"
#include "parameter_servers.hpp"
#include "sextant/exec/nvme_file.hpp"
#include "sextant/exec/trainer.hpp"
#include "sextant/exec/watchdog.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/optimizer_step.hpp"
#include "sextant/models/per_op_head.hpp"
#include "sextant/models/step_program.hpp"
#include "sextant/spec/context_parallel.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/parameter_server.hpp"
#include "sextant/spec/pipeline_schedule.hpp"
#include "stage_model.hpp"
#include "weight_versions.hpp"

namespace sextant::exec {

using models::OpId;

using spec::OpClass;
using spec::Phase;
using spec::Stream;

class Trainer {
 public:
  Trainer(const spec::ModelSpec& model, Context& ctx, const TrainOptions& o)
      : model_(model), ctx_(ctx), o_(o), plan_(*ctx.plan) {
    seq_ = model.is_transformer() ? plan_.seq_len.value_or(model.transformer().seq_len) : 0;
    micro_batches_ = plan_.micro_batches();
    if (model.is_transformer())
      positions_ = spec::context_positions(seq_, plan_.cp, ctx.groups->cp_rank);
    stage_ = make_stage_model(model, ctx, StageOptions{o.seed, plan_.micro_batch, seq_});
    sync_ = std::make_unique<GradientSync>(ctx, *stage_, micro_batches_);
    stage_->set_hooks(sync_.get());
    if (model.is_transformer()) {
      tokens_ = o.data == "synthetic" ? make_synthetic_tokens(model.transformer().vocab, o.seed)
                                      : make_text_tokens(o.data, seq_);
    }
    const int64_t n = stage_->params().total();
    m_ = ctx.backend->zeros({n});
    v_ = ctx.backend->zeros({n});
    if (plan_.offload.optimizer != spec::OffloadTarget::kNone) {
      // The host pool: fp32 master weights and the gradients handed to them, besides the moments
      // (m_ and v_ live there too). Copies between it and the parameters are explicit and traced.
      host_values_ = ctx.backend->zeros({n});
      host_grads_ = ctx.backend->zeros({n});
      ctx.backend->copy(stage_->params().values(), host_values_);
      sync_->offload_gradients_to(host_grads_);
      if (plan_.offload.params == spec::OffloadTarget::kHost)
        sync_->offload_parameters([this](int64_t b, int64_t e, Tensor& to) {
          ctx_.backend->copy(host_values_.rows(b, e - b), to);
        });
      if (plan_.offload.params == spec::OffloadTarget::kNvme) {
        param_file_ =
            std::make_unique<NvmeFile>(o.nvme_dir, ctx.groups->world->rank(), "parameters");
        int64_t largest = 0;
        for (auto [b, e] : sync_->owned()) largest = std::max(largest, e - b);
        fetch_buffer_ = ctx.backend->zeros({std::max<int64_t>(largest, 1)});
        parameters_to_nvme();
        sync_->offload_parameters(
            [this](int64_t b, int64_t e, Tensor& to) { fetch_from_nvme(b, e, to); });
      }
      if (plan_.offload.optimizer == spec::OffloadTarget::kNvme) {
        nvme_ =
            std::make_unique<NvmeFile>(o.nvme_dir, ctx.groups->world->rank(), "optimizer-states");
        states_to_nvme();
      }
    }
  }

  // ZeRO-Infinity's parameters on NVMe (nvme_file.hpp): the rank's shard of every layer, its
  // owned ranges one after another, written from the host pool's masters.
  void parameters_to_nvme();
  // A layer's shard [b, e), which lies in one owned range, read from its place in the file into
  // the host buffer and copied to the device (DeepSpeed stages NVMe reads through pinned host
  // buffers).
  void fetch_from_nvme(int64_t b, int64_t e, Tensor& to);

  // ZeRO-Infinity's optimizer states on NVMe (nvme_file.hpp): the rank's shard of the master
  // weights and moments, in that order. Once written, the copies in memory are poisoned (NaN): a
  // step that did not read them back could not train.
  std::vector<std::span<float>> nvme_pieces();
  void write_states() {
    const std::vector<std::span<float>> pieces = nvme_pieces();
    nvme_->write(std::vector<std::span<const float>>(pieces.begin(), pieces.end()));
  }
  void poison_states();
  void states_to_nvme() {
    write_states();
    poison_states();
  }
  void states_from_nvme() { nvme_->read(nvme_pieces()); }

  TrainResult run(const std::function<void(const StepLog&)>& on_step);

 private:
  // The step's micro-batches drawn before its clock starts, as a data loader has them ready:
  // drawing synthetic samples is the host's work, not the step's (a step of 32 ResNet-50 images
  // drew them for ~0.3 s against 85 ms of GPU work: bench/results/gpu_h200_cnn.md). Bounded: past
  // kPrefetchBytes of samples the rest are drawn as the schedule reaches them.
  static constexpr int64_t kPrefetchBytes = int64_t{256} << 20;
  void prefetch(int64_t step);

  MicroBatch micro_batch(int64_t step, int64_t index) const;

  // Stage-to-stage transfers (models::stage_transfer, what the simulator prices). Where every tp
  // rank holds the whole tensor, each sends only its 1/tp part and the receivers all-gather the
  // parts.
  models::StepOp transfer(const Tensor& t, Phase phase, bool sending) const {
    return models::stage_transfer(plan_, *ctx_.lowered, phase, sending, t.numel(),
                                  activation_wire_bytes(ctx_.backend->activation_dtype(), 1));
  }

  std::pair<std::unique_ptr<CommRequest>, Tensor> transmit(const Tensor& t, Phase phase, int64_t mb,
                                                           int peer, int tag);

  void receive(Tensor& t, Phase phase, int64_t mb, int peer, int tag);

  // A test aid: SEXTANT_FAULT_RANK=r SEXTANT_FAULT_STEP=s makes world rank r fail at step s, to
  // check that a failing rank ends the job instead of leaving the others waiting; with
  // SEXTANT_FAULT_KIND=stop the rank stops itself (SIGSTOP) instead, for the watchdog.
  void maybe_inject_fault(int64_t step) const;

  // The step's pipeline schedule on this stage: every micro-batch's forward and backward, with
  // the transfers to and from the neighbouring stages, which have completed when it returns.
  void run_units(int64_t step);

  StepLog one_step(int64_t step);

  // Whether the rank runs the model's last chunk (the loss): the last stage, or under GEMS both
  // end ranks (each holds the last stage of one replica).
  bool holds_last_chunk() const;

  // The traced optimizer step over `updated` parameters, its bytes as
  // models::optimizer_bytes_per_param counts them (what the simulator prices): fp32 gradients, no
  // loss scale, and the 16-bit compute copy refreshed from the masters.
  Recorder::Event optimizer_event(int64_t updated) const;
  spec::Dtype model_params_dtype() const {
    return ctx_.backend->activation_dtype() == DType::kBF16 ? spec::Dtype::kBf16
                                                            : spec::Dtype::kFp32;
  }

  // An asynchronous pipeline's steps (PipeDream, PipeDream-2BW): each step's loss and squared
  // gradient norm summed over the world without blocking (the stages end a step at different
  // times), and logged in order once summed.
  class AsyncSteps {
   public:
    AsyncSteps(Trainer& t, const std::function<void(const StepLog&)>& on_step)
        : t_(t), on_step_(on_step), start_(std::chrono::steady_clock::now()) {}
    // This rank's part of step `step`, ended now: its loss sum (the last stage's) and squares.
    // The step took the time since the last post, or `seconds` when given (a step whose sums
    // come later than its compute).
    void post(int64_t step, double loss, double squares,
              std::optional<double> seconds = std::nullopt) {
      const auto now = std::chrono::steady_clock::now();
      Sums& sums = pending_.emplace_back();
      sums.step = step;
      sums.seconds = seconds.value_or(std::chrono::duration<double>(now - start_).count());
      sums.values = {loss, squares};
      sums.request = t_.ctx_.groups->world->all_reduce_host_async(sums.values.data(), 2);
      start_ = now;
    }
    size_t pending() const { return pending_.size(); }
    void log_oldest() {
      Sums& s = pending_.front();
      s.request->wait();
      const double items = static_cast<double>(t_.plan_.global_batch) *
                           static_cast<double>(t_.model_.is_transformer() ? t_.seq_ : 1);
      StepLog log;
      log.step = s.step;
      log.loss = s.values[0] / items;
      log.grad_norm = std::sqrt(s.values[1]);
      log.step_time_s = s.seconds;
      log.tokens_per_s = items / s.seconds;
      mark_step_time(s.seconds);
      pending_.pop_front();
      result.steps.push_back(log);
      if (on_step_) on_step_(log);
      if (!std::isfinite(log.loss))
        throw std::runtime_error(
            fmt::format("the loss is {} at step {}: stopping", log.loss, log.step));
    }
    TrainResult finish() {
      while (!pending_.empty()) log_oldest();
      result.events = t_.ctx_.recorder->events();
      return std::move(result);
    }
    TrainResult result;

   private:
    struct Sums {  // a step's [loss, squared gradient norm], being summed over the world
      int64_t step;
      double seconds;
      std::array<double, 2> values;
      std::unique_ptr<CommRequest> request;
    };
    Trainer& t_;
    const std::function<void(const StepLog&)>& on_step_;
    std::chrono::steady_clock::time_point start_;
    std::list<Sums> pending_;  // stable addresses: MPI writes into `values`
  };

  // PipeDream-2BW (spec/pipeline_schedule.hpp): the steps' micro-batches as one 1F1B stream with
  // no flush between steps. The stage reads batch t's micro-batches with weight version t - 1
  // (spec::pipedream_2bw_version), switching its parameters between the two buffers as its units
  // alternate between batches; when its part of batch t is done it reduces the gradients and
  // writes version t + 1 into the buffer batch t read, while batch t + 1 goes on with version t.
  // The step's loss and gradient norm are summed over the world without blocking (the stages end
  // a batch at different times) and logged when the stage ends the next batch, or at the end.
  TrainResult run_pipedream_2bw(const std::function<void(const StepLog&)>& on_step);

  // PipeDream (spec::pipedream_version): the steps, one micro-batch each, as one 1F1B stream.
  // Stage s reads step t's forward with the version after max(0, t - (pp - 1 - s)) updates, and
  // its backward with the same version, loaded from the ones it keeps (weight stashing); after
  // each backward it reduces the gradients and updates the newest version, keeping a copy of the
  // result while an earlier stage may still run a forward that a later backward here reads.
  TrainResult run_pipedream(const std::function<void(const StepLog&)>& on_step);

  // Through co-located parameter servers (spec/parameter_server.hpp, parameter_servers.hpp):
  // step t runs with the version after max(0, t - s) updates. After it the rank pushes its
  // gradients and, as a server, sums step t - s's pushes, updates its range of the masters and
  // publishes the new version, which every worker pulls before the step that reads it. A step's
  // loss and gradient norm are summed over the world without blocking once its update is made.
  TrainResult run_parameter_server(const std::function<void(const StepLog&)>& on_step);

  // The traced copy of a weight version over `n` parameters (the simulator's pp.weight_stash).
  Recorder::Event stash_event(int64_t n) const;

  // TrainOptions::layer_staleness at `step`: each layer's parameters of the version it reads,
  // the newest set aside until the backward is done (one_step restores them).
  void load_stale_layers(int64_t step);

  // PipeDream-2BW's update after batch `batch` (run_pipedream_2bw): version batch + 1 written
  // into the buffer the finished batch read. In fp32 the masters are that buffer, so the newest
  // version of what this rank updates is copied there first (models::weight_stash_copy_bytes_
  // per_param; under ZeRO-1/2 only its shard: the gather after the update brings the others'
  // shards of the new version); in mixed precision the one master is the newest and the
  // update's compute copy lands there. The ZeRO gather writes into the buffer just updated, which
  // no batch in flight reads (batch + 1 reads the other one).
  void stash_and_update(int64_t batch);

  // This rank's part of every parameter (all of it, or its ZeRO shard), with its weight decay.
  std::vector<Backend::AdamwSpan> owned_spans();

  void update(int64_t step, float grad_scale);

  // ZeRO-Offload's step (the simulator's offload.adamw and offload.params_to_device): AdamW over
  // the host pool's shard of master weights, gradients and moments, then the updated shard copied
  // to the parameters the kernels read.
  void host_update(int64_t step, float grad_scale, int64_t updated);

  // The host pool's parameters: fp32, the CPU executor's (checked in the constructor).
  static constexpr spec::Dtype kHostParamDtype = spec::Dtype::kFp32;

  void update_parameters_from_host(int64_t updated);

  void checkpoint(int64_t steps_done);

  // Before the first step, not after K of them: every rank can write the checkpoint directory.
  void check_checkpoint_dir();

  // What a checkpoint's shards mean: the plan, and for ZeRO-1/2 that each rank's optimizer state
  // covers its blocks of the gradient buckets (per layer before; such a checkpoint is refused as
  // another layout rather than resumed with moments at the wrong places).
  std::string checkpoint_layout() const {
    if ((plan_.zero == 1 || plan_.zero == 2) && plan_.dp > 1)
      return plan_.name() + " (ZeRO shards by gradient bucket)";
    return plan_.name();
  }

  int64_t restore();

  const spec::ModelSpec& model_;
  Context& ctx_;
  TrainOptions o_;
  const spec::Plan& plan_;
  int64_t seq_ = 0;
  int64_t micro_batches_ = 1;
  std::map<int64_t, MicroBatch> prefetched_;  // the next step's micro-batches (prefetch)
  std::unique_ptr<StageModel> stage_;
  std::unique_ptr<GradientSync> sync_;
  std::unique_ptr<TokenSource> tokens_;
  std::vector<int32_t> positions_;  // of the rank's tokens in each sequence (context parallelism)
  Tensor m_, v_;
  Tensor host_values_, host_grads_;        // ZeRO-Offload's host pool (with m_ and v_), or empty
  std::unique_ptr<NvmeFile> nvme_;         // the optimizer offloaded to NVMe: the states' file
  std::unique_ptr<NvmeFile> param_file_;   // the parameters offloaded to NVMe: their file
  Tensor fetch_buffer_;                    // host staging of a layer's shard read from it
  std::unique_ptr<WeightVersions> stale_;  // TrainOptions::layer_staleness's versions
};

}  // namespace sextant::exec
