// Closed-form plan estimates: the caches a search shares, and a plan's step (the pipeline over
// its stages, the data-parallel end, peak memory).
#include "sextant/planner/estimator.hpp"

#include <algorithm>
#include <array>
#include <numeric>
#include <span>

#include "sextant/models/gradient_compression.hpp"
#include "sextant/models/optimizer_step.hpp"
#include "sextant/models/parameter_server.hpp"
#include "sextant/models/step_ops.hpp"
#include "sextant/models/step_program.hpp"
#include "sextant/sim/layer_cost.hpp"
#include "sextant/sim/memory_model.hpp"
#include "sextant/sim/program_builder.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/sim/step_setup.hpp"
#include "sextant/spec/pipeline_schedule.hpp"
#include "sextant/spec/rank_layout.hpp"
#include "sextant/spec/stack_on_cluster.hpp"

namespace sextant::planner {

Estimator::Estimator(const spec::ModelSpec& model, const spec::ClusterSpec& cluster)
    : model_(&model), cluster_(&cluster), offload_(cluster) {}

Estimator::Lowering& Estimator::lowering(const spec::Plan& plan, const spec::Stack& stack) {
  // Everything the lowering and the compute model depend on (step_setup's inputs), found without
  // building a setup; the other stack knobs are read from each plan's stack.
  const sim::StepPrecision precision = sim::step_precision(*cluster_, plan, stack);
  const int64_t seq_len =
      model_->is_transformer() ? plan.seq_len.value_or(model_->transformer().seq_len) : 0;
  const LoweringKey key{
      plan.micro_batch, plan.tp, plan.sequence_parallel, static_cast<int>(precision.gemm_dtype),
      static_cast<int>(precision.dtype), seq_len, static_cast<int>(stack.attention),
      static_cast<int>(stack.fusion), static_cast<int>(stack.cross_entropy), stack.autocast,
      stack.fused_rms_norm, stack.bias_grad_kernel, stack.dropout,
      static_cast<int>(stack.selective_recompute), stack.vocab_multiple,
      sim::copies_gradients_in(plan, stack), plan.spatial.h, plan.spatial.w, plan.spatial.d,
      plan.cp, static_cast<int>(plan.cp_algorithm), plan.ep, plan.tp_grid.x, plan.tp_grid.y,
      plan.tp_grid.z,
      // The compute model's co-run slowdown (step_setup's busy devices).
      cluster_->device.co_run ? sim::busy_devices_per_node(*cluster_, plan.world_size()) : 1,
      // The layer costs' host issue.
      stack.host_launch_us.forward_us, stack.host_launch_us.backward_us,
      // ZeRO-3's units (step_setup's lowering.zero3 and what follows it).
      plan.zero == 3, static_cast<int>(stack.reshard_after_forward), plan.pp > 1,
      sim::param_copy_bytes(plan, stack, precision.dtype),
      // Per-op splits (on the dp x tp mesh).
      plan.per_op.empty() ? 0 : plan.dp, spec::op_splits_text(plan.per_op), plan.branch_parallel,
      // How the stack's model code writes a block.
      stack.code.key()};
  for (size_t i = 0; i < lowerings_.size(); ++i) {
    if (lowerings_[i].first != key) continue;
    std::rotate(lowerings_.begin(), lowerings_.begin() + static_cast<std::ptrdiff_t>(i),
                lowerings_.begin() + static_cast<std::ptrdiff_t>(i) + 1);  // most recent first
    return *lowerings_.front().second;
  }
  if (lowerings_.size() == kKeptLowerings) lowerings_.pop_back();  // the least recently used
  last_memory_key_ = MemoryKey{};
  auto l = std::make_unique<Lowering>();
  l->setup = sim::step_setup(*model_, *cluster_, plan, stack);
  l->lowered = models::lower(*model_, l->setup.lowering);
  if (plan.branch_parallel)
    for (int64_t r = 0; r < plan.tp; ++r) {
      models::LoweringOptions own = l->setup.lowering;
      own.branch_rank = r;
      l->rank_lowered.push_back(models::lower(*model_, own));
    }
  l->compute = sim::make_compute_model(*cluster_, l->setup, l->lowered);
  lowerings_.emplace(lowerings_.begin(), key, std::move(l));
  return *lowerings_.front().second;
}

const sim::CollectiveModel& Estimator::collectives(const spec::Plan& plan) {
  if (!collectives_ || collectives_overrides_ != plan.collective_algorithms) {
    collectives_.emplace(*cluster_, plan.collective_algorithms);
    collectives_overrides_ = plan.collective_algorithms;
    collective_seconds_.clear();
  }
  return *collectives_;
}

double Estimator::collective_s(const spec::Plan& plan, spec::CollectiveKind kind, int64_t bytes,
                               const sim::GroupShape& shape) {
  const sim::CollectiveModel& model = collectives(plan);
  auto key =
      std::make_tuple(static_cast<int>(kind), bytes, shape.size, shape.nodes, shape.per_node);
  auto it = collective_seconds_.find(key);
  if (it != collective_seconds_.end()) return it->second;
  const double s = model.cost(kind, bytes, shape).seconds();
  collective_seconds_.emplace(key, s);
  return s;
}

double Estimator::bucket_seconds(const spec::Plan& plan, const Lowering& l,
                                 spec::CollectiveKind kind, const models::GradientBucket& bucket,
                                 int64_t grad_bytes, const sim::GroupShape& shape) {
  const spec::GradientCompression& c = plan.compression;
  if (!c.any()) return collective_s(plan, kind, bucket.params * grad_bytes, shape);
  const sim::ComputeModel& compute = *l.compute;
  double seconds = 0;
  for (const models::Op& op :
       models::compressed_exchange_ops(c, bucket, plan.replicas(), grad_bytes))
    seconds += op.is_comm() ? collective_s(plan, op.collective, op.bytes, shape)
                            : ps_to_seconds(compute.op_time(op, spec::Phase::kBwd));
  return seconds;
}

const Estimator::Shapes& Estimator::shapes(const spec::Plan& plan) {
  auto key = std::make_tuple(plan.dp, plan.tp, plan.pp, plan.spatial.ranks(), plan.cp, plan.ep,
                             plan.tp_grid.x, plan.tp_grid.y, plan.tp_grid.z);
  auto it = shapes_.find(key);
  if (it != shapes_.end()) return it->second;
  spec::RankLayout layout(plan);
  Shapes s;
  s.tp = sim::group_shape(layout.layer_group(0), cluster_->devices_per_node);
  s.dp = sim::group_shape(layout.replica_group(0), cluster_->devices_per_node);
  s.cp = sim::group_shape(layout.cp_group(0), cluster_->devices_per_node);
  s.spatial = sim::group_shape(layout.spatial_group(0), cluster_->devices_per_node);
  s.ep = sim::group_shape(layout.ep_group(0), cluster_->devices_per_node);
  s.expert_dp = sim::group_shape(layout.expert_replica_group(0), cluster_->devices_per_node);
  s.grid_x = sim::group_shape(layout.grid_group(0, 0), cluster_->devices_per_node);
  s.grid_y = sim::group_shape(layout.grid_group(0, 1), cluster_->devices_per_node);
  s.grid_z = sim::group_shape(layout.grid_group(0, 2), cluster_->devices_per_node);
  s.filter_reduce = sim::group_shape(layout.channel_filter_group(0, 0), cluster_->devices_per_node);
  s.channel_gather =
      sim::group_shape(layout.channel_filter_group(0, 1), cluster_->devices_per_node);
  int64_t pair[2] = {0, layout.pp_next(0)};
  s.pp_pair = sim::group_shape(pair, cluster_->devices_per_node);
  int64_t ends[2] = {0, layout.pp_prev(0)};
  s.embedding = sim::group_shape(ends, cluster_->devices_per_node);
  return shapes_.emplace(key, s).first->second;
}

const std::vector<spec::LiveProfile>& Estimator::live_profiles(const spec::Plan& plan) {
  auto key = std::make_tuple(static_cast<int>(plan.schedule), plan.pp, plan.virtual_stages,
                             plan.micro_batches());
  auto it = profiles_.find(key);
  if (it != profiles_.end()) return it->second;
  std::vector<spec::LiveProfile> profiles;
  for (int64_t s = 0; s < plan.pp; ++s)
    profiles.push_back(spec::live_profile(plan.schedule, plan.pp, spec::local_chunks(plan),
                                          plan.micro_batches(), s));
  return profiles_.emplace(key, std::move(profiles)).first->second;
}

const std::vector<std::pair<int64_t, bool>>& Estimator::drain_passes(const spec::Plan& plan,
                                                                     int64_t stage) {
  const int64_t m = plan.micro_batches();
  auto key =
      std::make_tuple(static_cast<int>(plan.schedule), plan.pp, plan.virtual_stages, m, stage);
  auto it = drain_passes_.find(key);
  if (it != drain_passes_.end()) return it->second;
  std::vector<std::pair<int64_t, bool>> passes;
  bool draining = false;
  for (const spec::ScheduleUnit& u :
       (*stage_units(plan, plan.micro_batches()))[static_cast<size_t>(stage)]) {
    if (u.forward) continue;
    draining = draining || u.micro_batch == m - 1;
    if (draining) passes.emplace_back(u.chunk, u.micro_batch == m - 1);
  }
  return drain_passes_.emplace(key, std::move(passes)).first->second;
}

Estimator::PeakMemory Estimator::peak_memory(const spec::Plan& plan, const spec::Stack& stack,
                                             const Lowering& l, const Stages& stages) {
  const MemoryKey key{&stages,
                      plan.replicas(),
                      plan.micro_batches(),
                      plan.zero,
                      static_cast<int>(plan.schedule),
                      static_cast<int>(spec::gradient_dtype(stack, l.lowered.dtype)),
                      static_cast<int>(spec::parameter_dtype(stack, l.lowered.dtype)),
                      stack.dp_bucket_bytes,
                      stack.zero3_prefetch,
                      stack.autocast,
                      stack.allocator_reserve,
                      plan.offload,
                      plan.compression};
  if (key == last_memory_key_) return last_memory_;
  PeakMemory peak;
  const std::vector<spec::LiveProfile>& profiles = live_profiles(plan);
  for (int64_t s = 0; s < plan.pp; ++s) {
    spec::MemoryBreakdown mem = sim::stage_memory(plan, stack, l.lowered, s,
                                                  stages.entries[static_cast<size_t>(s)].footprint,
                                                  cluster_, &profiles[static_cast<size_t>(s)]);
    peak.device = std::max(peak.device, mem.peak_bytes);
    peak.host_fits = peak.host_fits && mem.host_bytes <= mem.host_capacity_bytes;
  }
  last_memory_key_ = key;
  last_memory_ = peak;
  return peak;
}

Estimate Estimator::estimate(const spec::Plan& plan) {
  return estimate(plan, spec::plan_stack(plan, cluster_->device.kind == spec::DeviceKind::kGpu,
                                         model_->kind()));
}

Estimator::PipelineStep Estimator::pipeline_step(const spec::Plan& plan, const spec::Stack& stack,
                                                 Lowering& l, const Stages& stages,
                                                 const DpTimes* dp) {
  const models::LoweredModel& lowered = l.lowered;
  const Shapes& shape = shapes(plan);
  const int64_t m = plan.micro_batches();
  const int64_t g = spec::dtype_bytes(spec::gradient_dtype(stack, lowered.dtype));
  PipelineStep out;
  double& step = out.step;
  int64_t boundary = stages.entries.front().footprint.boundary;
  // Megatron's scatter/gather: the parts the transfer travels in (the simulator's rule).
  boundary /=
      models::pipeline_transfer_parts(plan, lowered, boundary / spec::dtype_bytes(lowered.dtype));
  double p2p = collective_s(plan, spec::CollectiveKind::kSendRecv, boundary, shape.pp_pair);
  const spec::PipelineDrain* drain = dp ? &dp->drain : nullptr;
  // The makespan of `micro_batches` micro-batches under the schedule, with the drain or none.
  auto makespan = [&](int64_t micro_batches, const spec::PipelineDrain* with) {
    const MakespanKey key{&stages, micro_batches, static_cast<int>(plan.schedule), p2p,
                          !stack.pp_overlap};
    auto sweep = l.sweeps.find(key);
    if (sweep == l.sweeps.end()) {
      std::vector<std::vector<double>> forward, backward;
      for (const StageEntry& entry : stages.entries) {
        forward.push_back(entry.chunk_forward);
        backward.push_back(entry.chunk_backward);
      }
      sweep =
          l.sweeps
              .emplace(std::piecewise_construct, std::forward_as_tuple(key),
                       std::forward_as_tuple(stage_units(plan, micro_batches), plan.pp,
                                             plan.virtual_stages, micro_batches, std::move(forward),
                                             std::move(backward), p2p, !stack.pp_overlap))
              .first;
    }
    const std::pair<const void*, const void*> at{&sweep->second, with};
    auto it = l.makespans.find(at);
    if (it == l.makespans.end()) {
      const size_t offset = l.stage_ends.size();
      l.stage_ends.resize(offset + static_cast<size_t>(plan.pp));
      sweep->second.makespan(with, std::span(l.stage_ends).subspan(offset));
      it = l.makespans.emplace(at, offset).first;
    }
    const auto ends = l.stage_ends.begin() + static_cast<std::ptrdiff_t>(it->second);
    return std::make_pair(*std::max_element(ends, ends + plan.pp), it->second);
  };
  std::tie(step, out.stage_ends_at) = makespan(m, drain);
  out.pipeline_end = step;
  double transfers_beside = 0;  // pipeline transfers beside compute alone, s
  {
    // The stages' transfers beside their compute alone slow it (the engine's overlap model),
    // each stage in the share of the step it computes; every stage's delay reaches the others
    // through the schedule, so the step pays their mean.
    const MakespanKey key{&stages, m, static_cast<int>(plan.schedule), p2p, !stack.pp_overlap};
    double beside = 0;
    for (const TransferTerm& t : transfer_terms(plan, l, stages, key))
      beside += (t.sent + t.received) * std::min(1.0, t.compute / step);
    transfers_beside = beside / static_cast<double>(plan.pp);
  }
  const std::optional<models::StepOp> tied = models::tied_table_sum(plan, lowered, 0, g);
  if (!dp && tied) {
    // The end stages' all-reduce of the tied table's gradients after the last backward (sim's
    // program builder); with a data-parallel exchange the drain holds it, before its buckets.
    step += collective_s(plan, spec::CollectiveKind::kAllReduce, tied->bytes, shape.embedding);
  }
  if (spec::asynchronous(plan.schedule)) {
    // No flush (the simulator's window of W = spec::asynchronous_window batches): a batch in
    // steady state costs what each later batch of the window adds, the fill and drain that the
    // batches share saved: S(m) - (S(W m) - S(m)) / (W - 1) of the makespans without the
    // gradient reduction (2 S(m) - S(2m) for PipeDream-2BW's two).
    const int64_t w = spec::asynchronous_window(plan);
    const auto [one, undrained_at] = makespan(m, nullptr);
    // Per-stage periods where the stages pace themselves; with a tied table the end stages wait
    // for each other every batch (below), and the latest update after that wait sets the pace.
    if (plan.schedule == spec::Schedule::kPipeDream && lowered.tied_table_params == 0) {
      out.undrained_ends_at = undrained_at;
      out.undrained_end = one;
    }
    step -= one - (makespan(w * m, nullptr).first - one) / static_cast<double>(w - 1);
    if (lowered.tied_table_params > 0) {
      // The end stages sum the tied table's gradient when each has ended its part of a batch:
      // the last stage, first to end, waits for the last backward to reach the first stage
      // before it can update (and go on with the next batch).
      for (int64_t s = 0; s + 1 < plan.pp; ++s)
        step += stages.entries[static_cast<size_t>(s)].chunk_backward.front() + p2p;
    }
  }
  step += overlap_cost(transfers_beside);
  return out;
}

Estimate Estimator::estimate(const spec::Plan& asked, const spec::Stack& asked_stack) {
  // Priced as the stack runs it (spec::as_run), as the simulator does.
  const spec::PlanAsRun ran = spec::as_run(asked, asked_stack);
  if (spec::collectives_block(*cluster_))
    return estimate_as_run(ran.plan, spec::stack_on(*cluster_, ran.stack));
  return estimate_as_run(ran.plan, ran.stack);
}

Estimate Estimator::estimate_as_run(const spec::Plan& plan, const spec::Stack& stack) {
  Lowering& l = lowering(plan, stack);
  const int64_t m = plan.micro_batches();

  Estimate out;
  const Stages& stages = stage_entries(plan, stack, l);
  const double slowest_stage = stages.summary.slowest;
  const PeakMemory memory = peak_memory(plan, stack, l, stages);
  out.peak_memory_bytes = memory.device;
  out.host_fits = memory.host_fits;
  out.fits = out.host_fits && out.peak_memory_bytes <= cluster_->device.memory_capacity_bytes;

  if (plan.schedule == spec::Schedule::kGems) {
    // GEMS' two replicas run opposite ways over the ranks, which the closed-form makespan
    // (spec::PipelineSweep, one direction) does not hold: the engine's step instead (a search
    // tries it only on request).
    spec::Plan run = plan;
    run.stack = stack;
    out.step_time_s = sim::simulate(*model_, *cluster_, run, {}).report.step_time_s;
    return out;
  }
  // The data-parallel gradient exchange in buckets (models::layer_gradients: not ZeRO-3, not
  // through parameter servers) at the end of the step: each stage's last backward passes slowed
  // beside it, and its tail (from the stages' real buckets). On one replica only ZeRO-Offload's
  // copies remain (update_seconds).
  const bool bucketed =
      plan.replicas() > 1 && models::bucketed(models::layer_gradients(plan, stack.dp_overlap));
  const DpTimes* dp = bucketed ? &dp_times(plan, stack, l, stages) : nullptr;
  // Pipeline: without stages, m micro-batches one after another; with them, the makespan of the
  // schedule over the stages' per-chunk times with a transfer on each stage boundary (cached per
  // stages, micro-batches, schedule, transfer time and drain: stack variants of a layout that
  // reduce gradients alike share it).
  double step = static_cast<double>(m) * slowest_stage;
  // With pipeline stages, when each stage's last pass and its drain end (from l.stage_ends[at];
  // the latest, the makespan): each then updates its own parameters (the simulator's program,
  // one per rank).
  size_t stage_ends_at = 0;
  double pipeline_end = 0;
  PipelineStep pipeline;
  if (plan.pp == 1 && dp) {
    step += dp->single_stage_extra;
  }
  if (plan.pp > 1) {
    pipeline = pipeline_step(plan, stack, l, stages, dp);
    step = pipeline.step;
    stage_ends_at = pipeline.stage_ends_at;
    pipeline_end = pipeline.pipeline_end;
  }
  if (models::layer_parameters(plan) == models::LayerParameters::kGatheredEachPass) {
    // Per micro-batch, layer by layer (zero3_times): what the layers wait for their gathers
    // and how much longer they compute beside the collectives; once, the scatters left after
    // the last backward.
    const Zero3Times& z = zero3_times(plan, stack, l, stages);
    const StageEntry& largest =
        *std::max_element(stages.entries.begin(), stages.entries.end(),
                          [](const StageEntry& a, const StageEntry& b) { return a.time < b.time; });
    step += static_cast<double>(m) * (z.waits + z.forward_slowed + z.backward_slowed + z.tail);
    if (z.reloads) {
      // The offloaded activations' waits are in the passes' (zero3_times: the reloads queue with
      // the fetches, and the copies out hold the issue of the fetches after them), not beside.
      step -=
          static_cast<double>(m) * (largest.offload_forward_wait + largest.offload_backward_wait);
    }
  }
  if (models::layer_parameters(plan) == models::LayerParameters::kGatheredAfterUpdate &&
      stack.param_gather_overlap) {
    // ZeRO-1/2 with Megatron's --overlap-param-gather: the updated parameters, gathered in the
    // same buckets, all dispatched at the start of the next step, each layer's first forward
    // waiting for its bucket: what the first stage's forwards take longer
    // (first_stage_gather_delay). Without it each stage gathers after its update (below).
    step += dp->gather_delay;
  }
  if (plan.parameter_server.enabled) {
    step = servers_step(plan, stack, l, stages, stage_ends_at, plan.pp > 1 ? pipeline_end : step,
                        step);
  } else {
    step += latest_update_end(plan, stack, l, stages, dp, stage_ends_at,
                              pipeline.undrained_ends_at ? &pipeline : nullptr) -
            (plan.pp > 1 ? pipeline_end : 0.0);
  }
  step += host_issue_delay(stages, m);
  // A straggler slows every group it is in: scale by the slowest rank used.
  out.step_time_s = step / slowest_speed(plan.world_size());
  return out;
}

}  // namespace sextant::planner
