// A rank's checkpoint of its parameters and optimizer states, written and restored.
#include "trainer_loop.hpp"

namespace sextant::exec {

void Trainer::checkpoint(int64_t steps_done) {
  if (nvme_) states_from_nvme();  // the moments (and masters) live in the file between steps
  Shard s;
  s.step = steps_done;
  // (With the parameters offloaded the device holds stale shards between fetches.)
  ctx_.backend->to_host(
      plan_.offload.params != spec::OffloadTarget::kNone ? host_values_ : stage_->params().values(),
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

void Trainer::check_checkpoint_dir() {
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

int64_t Trainer::restore() {
  std::vector<std::string> skipped;
  std::optional<Shard> s = load_checkpoint(o_.checkpoint_dir, checkpoint_layout(),
                                           stage_->params().total(), *ctx_.groups->world, &skipped);
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

}  // namespace sextant::exec
