// The training loop of one rank: steps of the synchronous schedules, their micro-batches and
// boundary transfers, the optimizer step.
#include "sextant/exec/trainer.hpp"

#include "trainer_loop.hpp"

namespace sextant::exec {

TrainResult Trainer::run(const std::function<void(const StepLog&)>& on_step) {
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
    log.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double items = static_cast<double>(plan_.global_batch) *
                         static_cast<double>(model_.is_transformer() ? seq_ : 1);
    log.tokens_per_s = items / log.step_time_s;
    mark_step_time(log.step_time_s);
    result.steps.push_back(log);
    if (on_step) on_step(log);
    if (!std::isfinite(log.loss)) {
      throw std::runtime_error(fmt::format("the loss is {} at step {}: stopping", log.loss, step));
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

void Trainer::prefetch(int64_t step) {
  prefetched_.clear();
  int64_t bytes = 0;
  for (int64_t m = 0; m < micro_batches_ && bytes <= kPrefetchBytes; ++m) {
    MicroBatch mb = micro_batch(step, m);
    bytes += static_cast<int64_t>(mb.features.size() * sizeof(float) +
                                  (mb.tokens.size() + mb.targets.size()) * sizeof(int32_t));
    prefetched_.emplace(m, std::move(mb));
  }
}

MicroBatch Trainer::micro_batch(int64_t step, int64_t index) const {
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
        const int64_t at = step * plan_.global_batch + r * per_replica + index * plan_.micro_batch;
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

std::pair<std::unique_ptr<CommRequest>, Tensor> Trainer::transmit(const Tensor& t, Phase phase,
                                                                  int64_t mb, int peer, int tag) {
  Groups& g = *ctx_.groups;
  const models::StepOp part = transfer(t, phase, true);
  const int64_t n = part.elements;
  Tensor piece = t.view({t.numel()}).rows(n < t.numel() ? g.tp_rank * n : 0, n);
  auto s = ctx_.recorder->scope(ctx_.comm(part, 2, phase, std::nullopt, mb));
  return send(*g.world, piece, peer, tag);
}

void Trainer::receive(Tensor& t, Phase phase, int64_t mb, int peer, int tag) {
  Groups& g = *ctx_.groups;
  Backend& be = *ctx_.backend;
  const models::StepOp part = transfer(t, phase, false);
  const std::optional<models::StepOp> gather =
      models::transfer_gather(plan_, *ctx_.lowered, t.numel(), activation_wire_bytes(t.dtype(), 1));
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

void Trainer::maybe_inject_fault(int64_t step) const {
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

void Trainer::run_units(int64_t step) {
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

StepLog Trainer::one_step(int64_t step) {
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

bool Trainer::holds_last_chunk() const {
  for (int64_t v = 0; v < stage_->chunks(); ++v)
    if (spec::chunk_stage(plan_, ctx_.groups->pp_rank, v) == spec::model_chunks(plan_) - 1)
      return true;
  return false;
}

Recorder::Event Trainer::optimizer_event(int64_t updated) const {
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

std::vector<Backend::AdamwSpan> Trainer::owned_spans() {
  std::vector<Backend::AdamwSpan> spans;
  for (const Param& p : stage_->params().params()) {
    for (auto [b, e] : sync_->owned()) {
      int64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.value.numel());
      if (lo < hi) spans.push_back({lo, hi - lo, p.decay ? o_.weight_decay : 0.0f});
    }
  }
  return spans;
}

void Trainer::update(int64_t step, float grad_scale) {
  // In one multi-tensor call.
  ParamStore& store = stage_->params();
  ctx_.backend->adamw_spans(store.values(), store.grads(), m_, v_, owned_spans(), step, o_.lr,
                            o_.beta1, o_.beta2, o_.eps, grad_scale);
}

TrainResult train(const spec::ModelSpec& model, Context& ctx, const TrainOptions& options,
                  const std::function<void(const StepLog&)>& on_step) {
  Trainer trainer(model, ctx, options);
  return trainer.run(on_step);
}

}  // namespace sextant::exec
