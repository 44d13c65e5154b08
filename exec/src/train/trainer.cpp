// The training loop of one rank.
#include "sextant/exec/trainer.hpp"

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

namespace {

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
  void parameters_to_nvme() {
    std::vector<std::span<const float>> pieces;
    for (auto [b, e] : sync_->owned())
      pieces.emplace_back(host_values_.data() + b, static_cast<size_t>(e - b));
    param_file_->write(pieces);
  }
  // A layer's shard [b, e), which lies in one owned range, read from its place in the file into
  // the host buffer and copied to the device (DeepSpeed stages NVMe reads through pinned host
  // buffers).
  void fetch_from_nvme(int64_t b, int64_t e, Tensor& to) {
    int64_t offset = 0;
    for (auto [ob, oe] : sync_->owned()) {
      if (b >= ob && e <= oe) {
        Tensor staged = fetch_buffer_.rows(0, e - b);
        param_file_->read_at(offset + (b - ob), {staged.data(), static_cast<size_t>(e - b)});
        ctx_.backend->copy(staged, to);
        return;
      }
      offset += oe - ob;
    }
    throw std::logic_error(
        fmt::format("a parameter fetch of [{}, {}) outside the rank's owned ranges", b, e));
  }

  // ZeRO-Infinity's optimizer states on NVMe (nvme_file.hpp): the rank's shard of the master
  // weights and moments, in that order. Once written, the copies in memory are poisoned (NaN): a
  // step that did not read them back could not train.
  std::vector<std::span<float>> nvme_pieces() {
    std::vector<std::span<float>> out;
    for (Tensor* t : {&host_values_, &m_, &v_})
      for (auto [b, e] : sync_->owned())
        out.emplace_back(t->data() + b, static_cast<size_t>(e - b));
    return out;
  }
  void write_states() {
    const std::vector<std::span<float>> pieces = nvme_pieces();
    nvme_->write(std::vector<std::span<const float>>(pieces.begin(), pieces.end()));
  }
  void poison_states() {
    const std::vector<std::span<float>> pieces = nvme_pieces();
    // ZeRO-Infinity's parameters on the host are the masters the layers fetch: they stay (on
    // NVMe the layers fetch from the parameters' file).
    const bool keep_values = plan_.offload.params == spec::OffloadTarget::kHost;
    const size_t per_array = pieces.size() / 3;
    for (size_t i = keep_values ? per_array : 0; i < pieces.size(); ++i)
      std::fill(pieces[i].begin(), pieces[i].end(), std::numeric_limits<float>::quiet_NaN());
  }
  void states_to_nvme() {
    write_states();
    poison_states();
  }
  void states_from_nvme() { nvme_->read(nvme_pieces()); }

  TrainResult run(const std::function<void(const StepLog&)>& on_step) {
    if (plan_.schedule == spec::Schedule::kPipeDream2BW) return run_pipedream_2bw(on_step);
    if (plan_.schedule == spec::Schedule::kPipeDream) return run_pipedream(on_step);
    if (plan_.parameter_server.enabled) return run_parameter_server(on_step);
    if (!o_.layer_staleness.empty()) {
      SEXTANT_CHECK(plan_.world_size() == 1 && o_.checkpoint_dir.empty(),
                    "layer staleness defines an asynchronous pipeline on one rank without "
                    "checkpoints (plan {})",
                    plan_.name());
      stale_ = std::make_unique<WeightVersions>(*ctx_.backend, stage_->params());
    }
    TrainResult result;
    int64_t first = 0;
    if (!o_.checkpoint_dir.empty() && o_.checkpoint_every > 0) check_checkpoint_dir();
    if (o_.resume && !o_.checkpoint_dir.empty()) first = restore();
    for (int64_t step = first; step < o_.steps; ++step) {
      mark_progress(step);
      ctx_.recorder->set_step(step);
      prefetch(step);
      auto t0 = std::chrono::steady_clock::now();
      StepLog log = one_step(step);
      log.step_time_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double items = static_cast<double>(plan_.global_batch) *
                           static_cast<double>(model_.is_transformer() ? seq_ : 1);
      log.tokens_per_s = items / log.step_time_s;
      mark_step_time(log.step_time_s);
      result.steps.push_back(log);
      if (on_step) on_step(log);
      if (!std::isfinite(log.loss)) {
        throw std::runtime_error(
            fmt::format("the loss is {} at step {}: stopping", log.loss, step));
      }
      if (!o_.checkpoint_dir.empty() && o_.checkpoint_every > 0 &&
          (step + 1) % o_.checkpoint_every == 0) {
        checkpoint(step + 1);
        mark_progress(step);  // a checkpoint written is progress too
      }
    }
    result.events = ctx_.recorder->events();
    return result;
  }

 private:
  // The step's micro-batches drawn before its clock starts, as a data loader has them ready:
  // drawing synthetic samples is the host's work, not the step's (a step of 32 ResNet-50 images
  // drew them for ~0.3 s against 85 ms of GPU work: bench/results/gpu_h200_cnn.md). Bounded: past
  // kPrefetchBytes of samples the rest are drawn as the schedule reaches them.
  static constexpr int64_t kPrefetchBytes = int64_t{256} << 20;
  void prefetch(int64_t step) {
    prefetched_.clear();
    int64_t bytes = 0;
    for (int64_t m = 0; m < micro_batches_ && bytes <= kPrefetchBytes; ++m) {
      MicroBatch mb = micro_batch(step, m);
      bytes += static_cast<int64_t>(mb.features.size() * sizeof(float) +
                                    (mb.tokens.size() + mb.targets.size()) * sizeof(int32_t));
      prefetched_.emplace(m, std::move(mb));
    }
  }

  MicroBatch micro_batch(int64_t step, int64_t index) const {
    MicroBatch mb;
    mb.index = index;
    const int64_t per_replica = plan_.global_batch / plan_.dp;
    int64_t first =
        step * plan_.global_batch + ctx_.groups->dp_rank * per_replica + index * plan_.micro_batch;
    if (model_.is_transformer()) {
      // On a 3D tensor grid each z slice takes micro_batch / z whole sequences
      // (spec/tensor_grid.hpp); under context parallelism, the rank's chunks of each sequence
      // (spec::context_positions).
      const GridAxis& z = ctx_.groups->grid[2];
      const int64_t sequences = plan_.micro_batch / z.size;
      first += z.rank * sequences;
      std::vector<int32_t> seq;
      for (int64_t i = 0; i < sequences; ++i) {
        tokens_->sequence(first + i, seq_, seq);
        for (int32_t p : positions_) {
          mb.tokens.push_back(seq[static_cast<size_t>(p)]);
          mb.targets.push_back(seq[static_cast<size_t>(p) + 1]);
        }
      }
      mb.rows = sequences * static_cast<int64_t>(positions_.size());
      if (plan_.per_op.contains(models::kLogitsOp)) {
        // Each replica's same micro-batch, as the data is addressed (models/per_op_head.hpp).
        for (int64_t r = 0; r < plan_.dp; ++r) {
          const int64_t at =
              step * plan_.global_batch + r * per_replica + index * plan_.micro_batch;
          for (int64_t i = 0; i < plan_.micro_batch; ++i) {
            tokens_->sequence(at + i, seq_, seq);
            mb.replica_targets.insert(mb.replica_targets.end(), seq.begin() + 1, seq.end());
          }
        }
      }
    } else {
      // Whole samples (an MLP's features, a CNN's images): the spatial ranks of a replica train
      // the same ones, each on its block. A CNN ending in a conv labels every pixel of its last
      // map (segmentation).
      std::vector<float> x;
      if (model_.kind() == spec::ModelKind::kCnn &&
          model_.cnn().layers.back().kind == spec::CnnLayerKind::kConv) {
        std::vector<int32_t> labels;
        for (int64_t i = 0; i < plan_.micro_batch; ++i) {
          segmentation_sample(o_.seed, first + i, model_.cnn(), x, labels);
          mb.features.insert(mb.features.end(), x.begin(), x.end());
          mb.targets.insert(mb.targets.end(), labels.begin(), labels.end());
        }
      } else {
        const auto [inputs, classes] = classifier_shape(model_);
        for (int64_t i = 0; i < plan_.micro_batch; ++i) {
          int32_t label = 0;
          classification_sample(o_.seed, first + i, inputs, classes, x, label);
          mb.features.insert(mb.features.end(), x.begin(), x.end());
          mb.targets.push_back(label);
        }
      }
      mb.rows = plan_.micro_batch;
    }
    return mb;
  }

  // Stage-to-stage transfers (models::stage_transfer, what the simulator prices). Where every tp
  // rank holds the whole tensor, each sends only its 1/tp part and the receivers all-gather the
  // parts.
  models::StepOp transfer(const Tensor& t, Phase phase, bool sending) const {
    return models::stage_transfer(plan_, *ctx_.lowered, phase, sending, t.numel(),
                                  activation_wire_bytes(ctx_.backend->activation_dtype(), 1));
  }

  std::pair<std::unique_ptr<CommRequest>, Tensor> transmit(const Tensor& t, Phase phase, int64_t mb,
                                                           int peer, int tag) {
    Groups& g = *ctx_.groups;
    const models::StepOp part = transfer(t, phase, true);
    const int64_t n = part.elements;
    Tensor piece = t.view({t.numel()}).rows(n < t.numel() ? g.tp_rank * n : 0, n);
    auto s = ctx_.recorder->scope(ctx_.comm(part, 2, phase, std::nullopt, mb));
    return send(*g.world, piece, peer, tag);
  }

  void receive(Tensor& t, Phase phase, int64_t mb, int peer, int tag) {
    Groups& g = *ctx_.groups;
    Backend& be = *ctx_.backend;
    const models::StepOp part = transfer(t, phase, false);
    const std::optional<models::StepOp> gather = models::transfer_gather(
        plan_, *ctx_.lowered, t.numel(), activation_wire_bytes(t.dtype(), 1));
    if (!gather) {
      auto s = ctx_.recorder->scope(ctx_.comm(part, 2, phase, std::nullopt, mb));
      recv(*g.world, t, peer, tag);
      return;
    }
    Tensor piece = be.empty({part.elements}, be.activation_dtype());
    {
      auto s = ctx_.recorder->scope(ctx_.comm(part, 2, phase, std::nullopt, mb));
      recv(*g.world, piece, peer, tag);
    }
    Tensor whole = t.view({t.numel()});
    auto s = ctx_.recorder->scope(ctx_.comm(*gather, g.tp_size, phase, std::nullopt, mb));
    all_gather(*g.tp, piece, whole);
  }

  // A test aid: SEXTANT_FAULT_RANK=r SEXTANT_FAULT_STEP=s makes world rank r fail at step s, to
  // check that a failing rank ends the job instead of leaving the others waiting; with
  // SEXTANT_FAULT_KIND=stop the rank stops itself (SIGSTOP) instead, for the watchdog.
  void maybe_inject_fault(int64_t step) const {
    const char* rank = std::getenv("SEXTANT_FAULT_RANK");
    const char* at = std::getenv("SEXTANT_FAULT_STEP");
    if (rank == nullptr || at == nullptr) return;
    if (std::atoi(rank) != ctx_.groups->world->rank() || std::atoll(at) != step) return;
    const char* kind = std::getenv("SEXTANT_FAULT_KIND");
    if (kind != nullptr && std::string_view(kind) == "stop") {
      std::raise(SIGSTOP);
      return;
    }
    throw std::runtime_error(fmt::format("fault injected at step {} (SEXTANT_FAULT_RANK)", step));
  }

  // The step's pipeline schedule on this stage: every micro-batch's forward and backward, with
  // the transfers to and from the neighbouring stages, which have completed when it returns.
  void run_units(int64_t step) {
    Groups& g = *ctx_.groups;
    Backend& be = *ctx_.backend;
    const int64_t model_chunks = spec::model_chunks(plan_);
    SEXTANT_CHECK(stage_->chunks() == spec::local_chunks(plan_),
                  "stage {} holds {} chunks, the plan gives it {}", g.pp_rank, stage_->chunks(),
                  spec::local_chunks(plan_));
    // Transfer tags: the activation entering model chunk c for micro-batch m, and its gradient.
    auto tag = [&](int64_t m, int64_t c, bool gradient) {
      return static_cast<int>(2 * (m * model_chunks + c) + (gradient ? 1 : 0));
    };
    std::map<int64_t, MicroBatch> batches = std::move(prefetched_);
    prefetched_.clear();
    std::vector<std::pair<std::unique_ptr<CommRequest>, Tensor>> sends;
    const std::vector<int64_t> shape = stage_->input_shape();
    for (const models::PassStep& p : models::pass_steps(plan_, g.pp_rank, micro_batches_, 1)) {
      mark_progress(step);
      const spec::ScheduleUnit& u = p.unit;
      const int64_t c = p.model_chunk;
      // Where the chunk's input comes from and its output goes: GEMS' second replica runs up.
      const int upstream = p.runs_up ? g.next : g.prev, downstream = p.runs_up ? g.prev : g.next;
      if (u.forward) {
        auto it = batches.find(u.micro_batch);
        if (it == batches.end())
          it = batches.emplace(u.micro_batch, micro_batch(step, u.micro_batch)).first;
        Tensor input;
        if (p.receives) {
          input = be.empty(shape, be.activation_dtype());
          receive(input, Phase::kFwd, u.micro_batch, upstream, tag(u.micro_batch, c, false));
        }
        Tensor out = stage_->forward(it->second, p.receives ? &input : nullptr, u.chunk);
        if (p.sends) {
          sends.push_back(transmit(out, Phase::kFwd, u.micro_batch, downstream,
                                   tag(u.micro_batch, c + 1, false)));
        }
      } else {
        Tensor grad;
        if (p.receives) {
          grad = be.empty(stage_->output_shape(), be.activation_dtype());
          receive(grad, Phase::kBwd, u.micro_batch, downstream, tag(u.micro_batch, c + 1, true));
        }
        Tensor dx =
            stage_->backward(batches.at(u.micro_batch), p.receives ? &grad : nullptr, u.chunk);
        // This rank's last use of it (under GEMS a micro-batch passes one chunk of a rank).
        if (u.chunk == 0 || plan_.schedule == spec::Schedule::kGems) batches.erase(u.micro_batch);
        if (p.sends) {
          sends.push_back(
              transmit(dx, Phase::kBwd, u.micro_batch, upstream, tag(u.micro_batch, c, true)));
        }
      }
    }
    for (auto& [request, tensor] : sends) request->wait();
  }

  StepLog one_step(int64_t step) {
    maybe_inject_fault(step);
    Groups& g = *ctx_.groups;
    sync_->begin_step(step);
    if (stale_) load_stale_layers(step);
    run_units(step);
    if (stale_) stale_->restore();  // the update applies to the newest weights
    sync_->finish_backward();

    StepLog log;
    log.step = step;
    // Global gradient norm over every parameter once (see StageModel::grad_square_sum).
    double squares = 0;
    for (auto [b, e] : sync_->norm_ranges()) squares += stage_->grad_square_sum(b, e);
    g.world->all_reduce(&squares, 1);
    log.grad_norm = std::sqrt(squares);
    const float scale = o_.clip > 0 && log.grad_norm > o_.clip
                            ? static_cast<float>(o_.clip / (log.grad_norm + 1e-6))
                            : 1.0f;
    {
      const int64_t updated = sync_->updated_params();
      // Bytes as models::optimizer_bytes_per_param counts the step (what the simulator prices):
      // fp32 gradients, no loss scale, and the 16-bit compute copy refreshed from the masters.
      if (!host_values_.empty()) {
        host_update(step + 1, scale, updated);
      } else {
        auto s = ctx_.recorder->scope(optimizer_event(updated));
        update(step + 1, scale);
      }
      // Without ZeRO nothing is gathered first, so the copy is timed with the step; ZeRO-1/2
      // refresh after gathering the updated shards (ZeRO-3's copy is made by each gather).
      if (plan_.zero == 0) stage_->params().refresh_compute();
    }
    sync_->after_update();
    if (plan_.zero != 0) stage_->params().refresh_compute();
    // The loss: the last stage's sum over its tokens, once per data-parallel replica (tp rank 0:
    // the others hold the same sums) and by every cp rank and every z slice of a tensor grid (each
    // its own chunks or sequences; tp_rank is the rank's place in its slice), summed; a CNN's
    // spatial ranks each give their share (StageModel::take_loss_sum).
    double loss = 0;
    const double mine = stage_->take_loss_sum();
    if (holds_last_chunk() && g.tp_rank == 0) loss = mine;
    g.world->all_reduce(&loss, 1);
    const double items = static_cast<double>(plan_.global_batch) *
                         static_cast<double>(model_.is_transformer() ? seq_ : 1);
    log.loss = loss / items;
    return log;
  }

  // Whether the rank runs the model's last chunk (the loss): the last stage, or under GEMS both
  // end ranks (each holds the last stage of one replica).
  bool holds_last_chunk() const {
    for (int64_t v = 0; v < stage_->chunks(); ++v)
      if (spec::chunk_stage(plan_, ctx_.groups->pp_rank, v) == spec::model_chunks(plan_) - 1)
        return true;
    return false;
  }

  // The traced optimizer step over `updated` parameters, its bytes as
  // models::optimizer_bytes_per_param counts them (what the simulator prices): fp32 gradients, no
  // loss scale, and the 16-bit compute copy refreshed from the masters.
  Recorder::Event optimizer_event(int64_t updated) const {
    models::OptimizerPrecision precision;
    precision.model_params = model_params_dtype();
    precision.params_sharded = plan_.zero == 3;
    const models::StepOp op = models::optimizer_update(precision, updated);
    return Recorder::Event{models::op_name(op.id),
                           op.op_class,
                           op.stream,
                           Phase::kOpt,
                           std::nullopt,
                           std::nullopt,
                           0,
                           op.bytes,
                           {},
                           0,
                           ""};
  }
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
  TrainResult run_pipedream_2bw(const std::function<void(const StepLog&)>& on_step) {
    Groups& g = *ctx_.groups;
    Backend& be = *ctx_.backend;
    ParamStore& store = stage_->params();
    const int64_t m = micro_batches_;
    const bool first = g.pp_rank == 0, last = g.pp_rank == g.pp_size - 1;
    store.add_version();
    int64_t viewed = 0, other = 0;  // the version each buffer holds (updates applied)
    // Resumed after batch K - 1: the buffers hold versions K (the parameters) and K - 1, and the
    // stream starts with batch K; the batches in flight at the checkpoint run again from there
    // (each batch's result depends only on its data and the version it reads).
    int64_t resumed_at = 0;
    if (!o_.checkpoint_dir.empty() && o_.checkpoint_every > 0) check_checkpoint_dir();
    if (o_.resume && !o_.checkpoint_dir.empty()) resumed_at = restore();
    if (resumed_at > 0) {
      viewed = resumed_at;
      other = resumed_at - 1;
    }
    // MPI keeps the order of one sender's messages with one tag, and both ends run the
    // micro-batches in order: the index modulo two batches names them apart enough.
    auto tag = [&](int64_t mb, bool gradient) {
      return static_cast<int>(2 * (mb % (2 * m)) + (gradient ? 1 : 0));
    };
    struct Send {
      int64_t batch;
      std::pair<std::unique_ptr<CommRequest>, Tensor> request;
    };
    std::vector<Send> sends;
    std::map<int64_t, MicroBatch> batches;
    AsyncSteps steps(*this, on_step);
    const std::vector<int64_t> shape = stage_->input_shape();
    for (spec::ScheduleUnit u : spec::pipedream_2bw_units(
             plan_.pp, m, std::max<int64_t>(0, o_.steps - resumed_at), g.pp_rank)) {
      u.micro_batch += resumed_at * m;
      const int64_t batch = u.micro_batch / m, index = u.micro_batch % m;
      mark_progress(batch);
      ctx_.recorder->set_step(batch);
      if (const int64_t want = spec::pipedream_2bw_version(batch); viewed != want) {
        SEXTANT_CHECK(other == want, "batch {} reads version {}, the buffers hold {} and {}", batch,
                      want, viewed, other);
        store.swap_versions();
        std::swap(viewed, other);
      }
      if (u.forward) {
        if (index == 0) maybe_inject_fault(batch);
        auto it = batches.emplace(u.micro_batch, micro_batch(batch, index)).first;
        Tensor input;
        if (!first) {
          input = be.empty(shape, be.activation_dtype());
          receive(input, Phase::kFwd, index, g.prev, tag(u.micro_batch, false));
        }
        Tensor out = stage_->forward(it->second, first ? nullptr : &input, 0);
        if (!last)
          sends.push_back(
              {batch, transmit(out, Phase::kFwd, index, g.next, tag(u.micro_batch, false))});
        continue;
      }
      // The batch's first backward here: the previous batch's gradients are spent.
      if (index == 0) sync_->begin_step(batch);
      Tensor grad;
      if (!last) {
        grad = be.empty(stage_->output_shape(), be.activation_dtype());
        receive(grad, Phase::kBwd, index, g.next, tag(u.micro_batch, true));
      }
      Tensor dx = stage_->backward(batches.at(u.micro_batch), last ? nullptr : &grad, 0);
      batches.erase(u.micro_batch);
      if (!first)
        sends.push_back(
            {batch, transmit(dx, Phase::kBwd, index, g.prev, tag(u.micro_batch, true))});
      if (index != m - 1) continue;
      // The stage's part of the batch is done. Its transfers of this batch complete (every
      // receiver has reached them); the next batch's activations may still be on their way.
      for (Send& send : sends)
        if (send.batch <= batch) send.request.first->wait();
      std::erase_if(sends, [&](const Send& send) { return send.batch <= batch; });
      sync_->finish_backward();
      double squares = 0;
      for (auto [b, e] : sync_->norm_ranges()) squares += stage_->grad_square_sum(b, e);
      const double loss = stage_->take_loss_sum();
      steps.post(batch, last && g.tp_rank == 0 ? loss : 0.0, squares);
      stash_and_update(batch);
      viewed = batch + 1;
      // A checkpoint of this stage after the update (collective: every stage reaches its own
      // after the same batch; the others' units in flight wait on nothing it holds back).
      if (!o_.checkpoint_dir.empty() && o_.checkpoint_every > 0 &&
          (batch + 1) % o_.checkpoint_every == 0)
        checkpoint(batch + 1);
      // Every stage has posted the previous batch's sums by now (m >= pp: the first stage ended
      // that batch before it started the micro-batch this one's last backward came from).
      if (steps.pending() > 1) steps.log_oldest();
    }
    for (Send& send : sends) send.request.first->wait();
    return steps.finish();
  }

  // PipeDream (spec::pipedream_version): the steps, one micro-batch each, as one 1F1B stream.
  // Stage s reads step t's forward with the version after max(0, t - (pp - 1 - s)) updates, and
  // its backward with the same version, loaded from the ones it keeps (weight stashing); after
  // each backward it reduces the gradients and updates the newest version, keeping a copy of the
  // result while an earlier stage may still run a forward that a later backward here reads.
  TrainResult run_pipedream(const std::function<void(const StepLog&)>& on_step) {
    Groups& g = *ctx_.groups;
    Backend& be = *ctx_.backend;
    const bool first = g.pp_rank == 0, last = g.pp_rank == g.pp_size - 1;
    const int64_t stale = g.pp_size - 1 - g.pp_rank;
    WeightVersions versions(be, stage_->params());
    if (stale > 0) versions.keep(0);
    int64_t applied = 0;              // updates applied to the newest version
    std::map<int64_t, int64_t> read;  // step -> the version its forward read
    struct Send {
      int64_t step;
      std::pair<std::unique_ptr<CommRequest>, Tensor> request;
    };
    std::vector<Send> sends;
    std::map<int64_t, MicroBatch> batches;
    AsyncSteps steps(*this, on_step);
    const std::vector<int64_t> shape = stage_->input_shape();
    auto tag = [&](int64_t step, bool gradient) {
      return static_cast<int>(2 * (step % (2 * g.pp_size)) + (gradient ? 1 : 0));
    };
    for (const spec::ScheduleUnit& u :
         spec::pipeline_schedule(spec::Schedule::k1F1B, plan_.pp, 1, o_.steps, g.pp_rank)) {
      const int64_t step = u.micro_batch;
      mark_progress(step);
      ctx_.recorder->set_step(step);
      if (u.forward) {
        maybe_inject_fault(step);
        SEXTANT_CHECK(applied == spec::pipedream_version(step, plan_.pp, g.pp_rank),
                      "stage {}: step {} reads version {}, the newest is {}", g.pp_rank, step,
                      spec::pipedream_version(step, plan_.pp, g.pp_rank), applied);
        read[step] = applied;
        // Its data is the step's one micro-batch; the stage's caches are kept by index, and up
        // to pp steps are in flight: each its own index, which traces name (0 for the first).
        MicroBatch mb = micro_batch(step, 0);
        mb.index = step % (2 * g.pp_size);
        auto it = batches.emplace(step, std::move(mb)).first;
        Tensor input;
        if (!first) {
          input = be.empty(shape, be.activation_dtype());
          receive(input, Phase::kFwd, it->second.index, g.prev, tag(step, false));
        }
        Tensor out = stage_->forward(it->second, first ? nullptr : &input, 0);
        if (!last)
          sends.push_back(
              {step, transmit(out, Phase::kFwd, it->second.index, g.next, tag(step, false))});
        continue;
      }
      sync_->begin_step(step);
      Tensor grad;
      if (!last) {
        grad = be.empty(stage_->output_shape(), be.activation_dtype());
        receive(grad, Phase::kBwd, batches.at(step).index, g.next, tag(step, true));
      }
      const int64_t version = read.at(step);
      if (version != applied) versions.load(version);
      const int64_t index = batches.at(step).index;
      Tensor dx = stage_->backward(batches.at(step), last ? nullptr : &grad, 0);
      versions.restore();
      batches.erase(step);
      read.erase(step);
      if (!first)
        sends.push_back({step, transmit(dx, Phase::kBwd, index, g.prev, tag(step, true))});
      // This step's transfers complete (every receiver has reached them); later steps'
      // activations may still be on their way.
      for (Send& send : sends)
        if (send.step <= step) send.request.first->wait();
      std::erase_if(sends, [&](const Send& send) { return send.step <= step; });
      sync_->finish_backward();
      double squares = 0;
      for (auto [b, e] : sync_->norm_ranges()) squares += stage_->grad_square_sum(b, e);
      const double loss = stage_->take_loss_sum();
      steps.post(step, last && g.tp_rank == 0 ? loss : 0.0, squares);
      {
        auto s = ctx_.recorder->scope(optimizer_event(sync_->updated_params()));
        update(step + 1, 1.0f);
      }
      sync_->after_update();
      ++applied;
      // The new version, kept while a forward here may read it before a later backward does.
      if (stale > 0) {
        auto s = ctx_.recorder->scope(stash_event(sync_->updated_params()));
        versions.keep(applied);
      }
      versions.drop_before(read.empty() ? applied : read.begin()->second);
      // Every stage has posted step - pp by now: the first stage's backward of it came before
      // the forwards this stage's backward of `step` waited for.
      if (steps.pending() > static_cast<size_t>(g.pp_size)) steps.log_oldest();
    }
    for (Send& send : sends) send.request.first->wait();
    return steps.finish();
  }

  // Through co-located parameter servers (spec/parameter_server.hpp, parameter_servers.hpp):
  // step t runs with the version after max(0, t - s) updates. After it the rank pushes its
  // gradients and, as a server, sums step t - s's pushes, updates its range of the masters and
  // publishes the new version, which every worker pulls before the step that reads it. A step's
  // loss and gradient norm are summed over the world without blocking once its update is made.
  TrainResult run_parameter_server(const std::function<void(const StepLog&)>& on_step) {
    Groups& g = *ctx_.groups;
    ParamStore& store = stage_->params();
    const int64_t staleness = plan_.parameter_server.staleness;
    ParameterServers servers(ctx_, store);
    const auto [begin, end] = servers.range();
    Tensor masters = ctx_.backend->zeros({store.total()});  // this server's range of them
    ctx_.backend->copy(store.values(), masters);
    std::vector<Backend::AdamwSpan> spans;
    for (Backend::AdamwSpan span : owned_spans()) {
      const int64_t lo = std::max(span.offset, begin);
      const int64_t hi = std::min(span.offset + span.count, end);
      if (lo < hi) spans.push_back({lo, hi - lo, span.weight_decay});
    }
    std::vector<std::pair<int64_t, int64_t>> norm;  // the server's part of the global norm
    for (auto [b, e] : sync_->norm_ranges())
      if (std::max(b, begin) < std::min(e, end))
        norm.emplace_back(std::max(b, begin), std::min(e, end));
    struct Pushed {  // a step pushed and not yet served: its loss sum and its time
      double loss = 0, seconds = 0;
    };
    std::map<int64_t, Pushed> pushed;
    auto last_push = std::chrono::steady_clock::now();
    AsyncSteps steps(*this, on_step);
    int64_t served = 0, pulled = 0;  // steps this rank's server updated; versions it pulled
    auto serve = [&] {
      const int64_t step = served++;
      servers.sum();
      double squares = 0;
      for (auto [b, e] : norm) squares += stage_->grad_square_sum(b, e);
      {
        auto s = ctx_.recorder->scope(optimizer_event(servers.shard()));
        ctx_.backend->adamw_spans(masters, store.grads(), m_, v_, spans, step + 1, o_.lr, o_.beta1,
                                  o_.beta2, o_.eps, 1.0f);
      }
      servers.publish(masters);
      const Pushed done = pushed.at(step);
      steps.post(step, done.loss, squares, done.seconds);
      pushed.erase(step);
    };
    for (int64_t step = 0; step < o_.steps; ++step) {
      mark_progress(step);
      ctx_.recorder->set_step(step);
      maybe_inject_fault(step);
      // The version the step reads, published by the servers after step - s - 1's update.
      for (; pulled < spec::parameter_server_version(step, staleness); ++pulled) servers.pull();
      prefetch(step);
      sync_->begin_step(step);
      run_units(step);
      sync_->finish_backward();  // the tied table's and partial sums; no replica's
      const double loss = stage_->take_loss_sum();
      servers.push();
      // The worker's pace: from one push to the next (the serving between them included).
      const auto now = std::chrono::steady_clock::now();
      pushed[step] = {holds_last_chunk() && g.tp_rank == 0 ? loss : 0.0,
                      std::chrono::duration<double>(now - last_push).count()};
      last_push = now;
      if (step >= staleness) serve();
      if (steps.pending() > 1) steps.log_oldest();
    }
    while (served < o_.steps) serve();
    // The parameters end as the newest version, as one process's would.
    for (; pulled < o_.steps; ++pulled) servers.pull();
    return steps.finish();
  }

  // The traced copy of a weight version over `n` parameters (the simulator's pp.weight_stash).
  Recorder::Event stash_event(int64_t n) const {
    return Recorder::Event{models::op_name(OpId::kPpWeightStash),
                           OpClass::kMemcpy,
                           Stream::kCompute,
                           Phase::kOpt,
                           std::nullopt,
                           std::nullopt,
                           0,
                           n * models::weight_stash_copy_bytes_per_param(model_params_dtype()),
                           {},
                           0,
                           ""};
  }

  // TrainOptions::layer_staleness at `step`: each layer's parameters of the version it reads,
  // the newest set aside until the backward is done (one_step restores them).
  void load_stale_layers(int64_t step) {
    ParamStore& store = stage_->params();
    stale_->keep(step);
    std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> by_version;
    int64_t oldest = step;
    for (int32_t layer : store.layers()) {
      SEXTANT_CHECK(static_cast<size_t>(layer) < o_.layer_staleness.size(),
                    "no staleness for layer {} ({} given)", layer, o_.layer_staleness.size());
      const int64_t version =
          std::max<int64_t>(0, step - o_.layer_staleness[static_cast<size_t>(layer)]);
      oldest = std::min(oldest, version);
      if (version == step) continue;
      for (bool experts : {false, true})
        by_version[version].push_back(store.layer_range(layer, experts));
    }
    SEXTANT_CHECK(store.replica_whole_begin() == store.total(),
                  "layer staleness with replica-whole parameters");
    for (const auto& [version, ranges] : by_version) stale_->load(version, ranges);
    // Later steps read no version before the oldest one read now (staleness is per layer).
    stale_->drop_before(oldest);
  }

  // PipeDream-2BW's update after batch `batch` (run_pipedream_2bw): version batch + 1 written
  // into the buffer the finished batch read. In fp32 the masters are that buffer, so the newest
  // version of what this rank updates is copied there first (models::weight_stash_copy_bytes_
  // per_param; under ZeRO-1/2 only its shard: the gather after the update brings the others'
  // shards of the new version); in mixed precision the one master is the newest and the
  // update's compute copy lands there. The ZeRO gather writes into the buffer just updated, which
  // no batch in flight reads (batch + 1 reads the other one).
  void stash_and_update(int64_t batch) {
    ParamStore& store = stage_->params();
    const int64_t n = sync_->updated_params();
    if (store.masters_versioned()) {
      auto s = ctx_.recorder->scope(stash_event(n));
      for (auto [b, e] : sync_->owned()) {
        Tensor to = store.values().rows(b, e - b);
        ctx_.backend->copy(store.other_version().rows(b, e - b), to);
      }
    }
    {
      auto s = ctx_.recorder->scope(optimizer_event(n));
      update(batch + 1, 1.0f);
      if (plan_.zero == 0) store.refresh_compute();
    }
    sync_->after_update();
    if (plan_.zero != 0) store.refresh_compute();
  }

  // This rank's part of every parameter (all of it, or its ZeRO shard), with its weight decay.
  std::vector<Backend::AdamwSpan> owned_spans() {
    std::vector<Backend::AdamwSpan> spans;
    for (const Param& p : stage_->params().params()) {
      for (auto [b, e] : sync_->owned()) {
        int64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.value.numel());
        if (lo < hi) spans.push_back({lo, hi - lo, p.decay ? o_.weight_decay : 0.0f});
      }
    }
    return spans;
  }

  void update(int64_t step, float grad_scale) {
    // In one multi-tensor call.
    ParamStore& store = stage_->params();
    ctx_.backend->adamw_spans(store.values(), store.grads(), m_, v_, owned_spans(), step, o_.lr,
                              o_.beta1, o_.beta2, o_.eps, grad_scale);
  }

  // ZeRO-Offload's step (the simulator's offload.adamw and offload.params_to_device): AdamW over
  // the host pool's shard of master weights, gradients and moments, then the updated shard copied
  // to the parameters the kernels read.
  void host_update(int64_t step, float grad_scale, int64_t updated) {
    const std::vector<Backend::AdamwSpan> spans = owned_spans();
    {
      auto s = ctx_.recorder->scope(ctx_.offload(models::host_update(updated, kHostParamDtype),
                                                 Phase::kOpt, std::nullopt, std::nullopt));
      // NVMe: the states read before the update and written back after it, within the step
      // (the simulator prices both transfers in offload.adamw).
      if (nvme_) states_from_nvme();
      ctx_.backend->adamw_spans(host_values_, host_grads_, m_, v_, spans, step, o_.lr, o_.beta1,
                                o_.beta2, o_.eps, grad_scale);
      if (nvme_) write_states();
    }
    update_parameters_from_host(updated);
    // The updated masters have reached the parameters: the file's copy is the only one now.
    if (nvme_) poison_states();
  }

  // The host pool's parameters: fp32, the CPU executor's (checked in the constructor).
  static constexpr spec::Dtype kHostParamDtype = spec::Dtype::kFp32;

  void update_parameters_from_host(int64_t updated) {
    // ZeRO-Infinity: the updated masters stay on the host, where each layer's next fetch reads
    // them, or go to the parameters' file on NVMe, where it reads them then.
    const std::optional<models::StepOp> back =
        models::updated_parameters_return(plan_, updated, kHostParamDtype);
    if (!back) return;
    auto s = ctx_.recorder->scope(ctx_.offload(*back, Phase::kOpt, std::nullopt, std::nullopt));
    if (plan_.offload.params == spec::OffloadTarget::kNvme) {
      parameters_to_nvme();
      return;
    }
    for (auto [b, e] : sync_->owned()) {
      Tensor to = stage_->params().values().rows(b, e - b);
      ctx_.backend->copy(host_values_.rows(b, e - b), to);
    }
  }

  void checkpoint(int64_t steps_done) {
    if (nvme_) states_from_nvme();  // the moments (and masters) live in the file between steps
    Shard s;
    s.step = steps_done;
    // (With the parameters offloaded the device holds stale shards between fetches.)
    ctx_.backend->to_host(plan_.offload.params != spec::OffloadTarget::kNone
                              ? host_values_
                              : stage_->params().values(),
                          s.values);
    ctx_.backend->to_host(m_, s.m);
    ctx_.backend->to_host(v_, s.v);
    s.exchange = sync_->save_state();
    // PipeDream-2BW: the older weight version (the next batch reads it) after the exchange's.
    if (plan_.schedule == spec::Schedule::kPipeDream2BW)
      ctx_.backend->to_host(stage_->params().other_version(), s.exchange.emplace_back());
    if (nvme_) poison_states();
    save_checkpoint(o_.checkpoint_dir, checkpoint_layout(), s, *ctx_.groups->world);
  }

  // Before the first step, not after K of them: every rank can write the checkpoint directory.
  void check_checkpoint_dir() {
    Communicator& world = *ctx_.groups->world;
    std::string problem;
    try {
      if (world.rank() == 0) std::filesystem::create_directories(o_.checkpoint_dir);
    } catch (const std::exception& e) {
      problem = e.what();
    }
    world.barrier();
    if (problem.empty())
      problem = spec::unwritable_reason(std::filesystem::path(o_.checkpoint_dir) / "probe");
    double failed = problem.empty() ? 0 : 1;
    world.all_reduce(&failed, 1);
    if (failed > 0)
      throw InputError("--checkpoint", "", o_.checkpoint_dir,
                       problem.empty() ? "another rank cannot write this directory" : problem);
  }

  // What a checkpoint's shards mean: the plan, and for ZeRO-1/2 that each rank's optimizer state
  // covers its blocks of the gradient buckets (per layer before; such a checkpoint is refused as
  // another layout rather than resumed with moments at the wrong places).
  std::string checkpoint_layout() const {
    if ((plan_.zero == 1 || plan_.zero == 2) && plan_.dp > 1)
      return plan_.name() + " (ZeRO shards by gradient bucket)";
    return plan_.name();
  }

  int64_t restore() {
    std::vector<std::string> skipped;
    std::optional<Shard> s =
        load_checkpoint(o_.checkpoint_dir, checkpoint_layout(), stage_->params().total(),
                        *ctx_.groups->world, &skipped);
    for (const std::string& line : skipped)
      fmt::print(stderr, "warning: checkpoint {}; resuming from step {}\n", line, s ? s->step : 0);
    if (!s && !o_.resume_if_exists)
      throw InputError("--resume", "", o_.checkpoint_dir,
                       "no checkpoint in this directory (a mistyped path?); "
                       "--resume-if-exists starts from step 0 when there is none");
    if (!s) return 0;
    // --steps counts from step 0: a checkpoint at or past it leaves nothing to train, which once
    // ended the run at once with exit 0.
    if (s->step >= o_.steps)
      throw InputError("command line", "--steps", std::to_string(o_.steps),
                       fmt::format("the checkpoint resumed is at step {}: nothing left to train "
                                   "(--steps counts from step 0; give more than {})",
                                   s->step, s->step));
    ctx_.backend->from_host(s->values, stage_->params().values());
    stage_->params().refresh_compute();
    if (!host_values_.empty()) ctx_.backend->copy(stage_->params().values(), host_values_);
    if (param_file_) parameters_to_nvme();
    ctx_.backend->from_host(s->m, m_);
    ctx_.backend->from_host(s->v, v_);
    const bool two_versions = plan_.schedule == spec::Schedule::kPipeDream2BW;
    const size_t expected = sync_->state_arrays() + (two_versions ? 1 : 0);
    if (s->exchange.size() != expected)
      throw InputError(o_.checkpoint_dir, "", plan_.name(),
                       fmt::format("the checkpoint holds {} arrays beyond the moments, the plan "
                                   "keeps {} (gradient-compression state{})",
                                   s->exchange.size(), expected,
                                   two_versions ? ", then PipeDream-2BW's older weights" : ""));
    if (two_versions) {
      ctx_.backend->from_host(s->exchange.back(), stage_->params().other_version());
      s->exchange.pop_back();
    }
    sync_->load_state(s->exchange);
    if (nvme_) states_to_nvme();
    return s->step;
  }

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

}  // namespace

TrainResult train(const spec::ModelSpec& model, Context& ctx, const TrainOptions& options,
                  const std::function<void(const StepLog&)>& on_step) {
  Trainer trainer(model, ctx, options);
  return trainer.run(on_step);
}

}  // namespace sextant::exec
