// The asynchronous schedules' steps: PipeDream-2BW (two weight versions, no flush), PipeDream
// (weight stashing) and parameter servers (bounded staleness).
#include "trainer_loop.hpp"

namespace sextant::exec {

TrainResult Trainer::run_pipedream_2bw(const std::function<void(const StepLog&)>& on_step) {
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
      sends.push_back({batch, transmit(dx, Phase::kBwd, index, g.prev, tag(u.micro_batch, true))});
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

TrainResult Trainer::run_pipedream(const std::function<void(const StepLog&)>& on_step) {
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
    if (!first) sends.push_back({step, transmit(dx, Phase::kBwd, index, g.prev, tag(step, true))});
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

TrainResult Trainer::run_parameter_server(const std::function<void(const StepLog&)>& on_step) {
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

Recorder::Event Trainer::stash_event(int64_t n) const {
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

void Trainer::load_stale_layers(int64_t step) {
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

void Trainer::stash_and_update(int64_t batch) {
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

}  // namespace sextant::exec
