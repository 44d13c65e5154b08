// Closed-form plan estimates.
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

namespace {

struct OffloadWaits {
  double forward = 0, backward = 0;  // s per micro-batch
};

// What a chunk's pass waits for its offloaded activations (the simulator's program_builder
// rules, priced layer by layer): in forward, the layer after an offloaded one waits for the copy
// of the offloaded layer before it (the double buffer), exposed where that copy outlasts the
// layer's own forward. In backward the reloads run one after another on the copy stream, each
// issued when the backward of a layer up to `window` above it is ready to start
// (spec::Offload::prefetch_layers), and a layer waits for its own; the pass's top layer, when
// offloaded, also waits for its copy out, which ends as the pass begins. Exact for a chain of
// alike layers (tests/planner).
OffloadWaits activation_offload_waits(const sim::OffloadCost& offload,
                                      const models::LoweredModel& lowered,
                                      const std::vector<spec::Recompute>& modes,
                                      const std::vector<bool>& offloaded, size_t begin, size_t end,
                                      const std::vector<double>& forward,
                                      const std::vector<double>& backward, int64_t window) {
  OffloadWaits w;
  auto copy = [&](size_t i) {
    return ps_to_seconds(offload.device_host_copy(lowered.layers[i].saved_bytes_for(modes[i])));
  };
  for (size_t i = begin + 1; i < end; ++i)
    if (offloaded[i] && offloaded[i - 1]) w.forward += std::max(0.0, copy(i - 1) - forward[i]);
  double compute = 0, copies = 0;             // when the backward and the copy stream are free
  std::vector<double> back(end - begin, -1);  // when each layer's reload ends
  auto reload = [&](size_t i, double issue) {
    if (!offloaded[i] || back[i - begin] >= 0) return;
    const double out = i + 1 == end ? copy(i) : 0;  // the top layer's copy out, still running
    copies = std::max({copies, issue, out}) + copy(i);
    back[i - begin] = copies;
  };
  for (size_t i = end; i-- > begin;) {
    const double issue = compute;
    reload(i, issue);
    for (size_t k = 1; k <= static_cast<size_t>(window) && i >= begin + k; ++k)
      reload(i - k, issue);
    const double start = offloaded[i] ? std::max(issue, back[i - begin]) : issue;
    w.backward += start - issue;
    compute = start + backward[i];
  }
  return w;
}

// Compute alone in the first `x` seconds of a pass that begins with `head`'s layers.
double alone_within(const std::array<const std::vector<sim::PassSegment>*, 2>& head, double x) {
  double alone = 0;
  for (const std::vector<sim::PassSegment>* layer : head) {
    if (layer == nullptr || x <= 0) break;
    alone += sim::alone_within(*layer, x);
    for (const sim::PassSegment& segment : *layer) x -= segment.seconds;
  }
  return alone;
}

}  // namespace

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

const std::vector<Estimator::TransferTerm>& Estimator::transfer_terms(const spec::Plan& plan,
                                                                      Lowering& l,
                                                                      const Stages& stages,
                                                                      const MakespanKey& key) {
  auto it = l.transfer_terms.find(key);
  if (it != l.transfer_terms.end()) return it->second;
  // A stage sends after each pass whose chunk has a neighbour that way and receives before each
  // whose chunk has one the other way. A send starts as the stage's next pass begins (overlapped
  // transfers; a blocking one holds the stage instead), so it runs beside that pass's first
  // stretches: on average over the stage's passes. A receive lands while the stage runs some
  // pass of its own: beside compute alone in the share of the pass that is.
  const double m = static_cast<double>(key.micro_batches);
  const int64_t chunks = plan.chunks();
  std::vector<TransferTerm> terms;
  for (int64_t s = 0; s < plan.pp; ++s) {
    const StageEntry& e = stages.entries[static_cast<size_t>(s)];
    const size_t local = e.chunk_forward.size();
    double head = 0, received = 0;
    int64_t sends = 0;
    auto alone_share = [&](double alone, double all) {
      return all > 0 ? sim::wall_alone_share(alone / all, cluster_->device.overlap_slowdown) : 0.0;
    };
    for (size_t c = 0; c < local; ++c) {
      head += alone_within(e.chunk_forward_head[c], key.p2p) +
              alone_within(e.chunk_backward_head[c], key.p2p);
      const int64_t g = static_cast<int64_t>(c) * plan.pp + s;
      if (g > 0) {  // receives its forward input, sends its input's gradient
        ++sends;
        received += alone_share(e.chunk_forward_alone[c], e.chunk_forward[c]);
      }
      if (g + 1 < chunks) {  // sends its output, receives its output's gradient
        ++sends;
        received += alone_share(e.chunk_backward_alone[c], e.chunk_backward[c]);
      }
    }
    head /= 2 * static_cast<double>(std::max<size_t>(local, 1));
    TransferTerm t;
    t.sent = key.blocking ? 0 : m * static_cast<double>(sends) * head;
    t.received = m * key.p2p * received;
    t.compute = m * e.time;
    terms.push_back(t);
  }
  return l.transfer_terms.emplace(key, std::move(terms)).first->second;
}

const Estimator::Zero3Times& Estimator::zero3_times(const spec::Plan& plan,
                                                    const spec::Stack& stack, Lowering& l,
                                                    const Stages& stages) {
  const models::LoweredModel& lowered = l.lowered;
  const int64_t e = spec::dtype_bytes(lowered.dtype);
  const int64_t g = spec::dtype_bytes(spec::gradient_dtype(stack, lowered.dtype));
  const Zero3Key key{&stages,
                     plan.dp,
                     plan.tp,
                     plan.pp,
                     plan.cp,
                     plan.ep,
                     static_cast<int>(stack.zero3),
                     stack.zero3_prefetch,
                     stack.dp_overlap,
                     e,
                     g,
                     static_cast<int>(plan.offload.params)};
  auto it = l.zero3_times.find(key);
  if (it != l.zero3_times.end()) return it->second;
  const Shapes& shape = shapes(plan);
  const int64_t n = plan.replicas();
  const bool offloaded = plan.offload.params != spec::OffloadTarget::kNone;
  // The largest stage (ZeRO-3 runs without pipelining but for a check of the rule).
  size_t largest = 0;
  for (size_t s = 0; s < stages.entries.size(); ++s)
    if (stages.entries[s].footprint.params > stages.entries[largest].footprint.params) largest = s;
  const sim::StageLayers layers = sim::stage_layers(plan, lowered, static_cast<int64_t>(largest));
  // Each layer's fetch (from the host, on the copy stream) and gather and scatter (on the
  // data-parallel stream), priced once.
  std::vector<size_t> order;
  for (size_t c = 0; c < layers.chunk_begin.size(); ++c)
    for (size_t i = layers.chunk_begin[c]; i < layers.chunk_end[c]; ++i) order.push_back(i);
  std::vector<double> fetch(order.size(), 0), gather(order.size(), 0), scatter(order.size(), 0);
  Zero3Times z;
  for (size_t k = 0; k < order.size(); ++k) {
    const models::Layer& layer = lowered.layers[order[k]];
    if (k > 0 && layer.same_work_as(lowered.layers[order[k - 1]])) {
      fetch[k] = fetch[k - 1];
      gather[k] = gather[k - 1];
      scatter[k] = scatter[k - 1];
    } else {
      const int64_t experts = plan.ep > 1 ? layer.expert_params : 0;
      const int64_t dense = (layer.params - experts) * e;
      if (offloaded)
        fetch[k] = ps_to_seconds(
            offload_.params_fetch((layer.params + n - 1) / n * e, plan.offload.params));
      if (n > 1 && layer.params > 0) {
        // FSDP gathers the layer as one flat parameter, DeepSpeed one module at a time (a layer
        // without parameters, none: program_builder's pass).
        const int64_t parts =
            stack.zero3 == spec::Zero3Impl::kDeepspeed ? layer.parameter_modules() : 1;
        for (int64_t p = 0; p < parts; ++p)
          gather[k] += collective_s(plan, spec::CollectiveKind::kAllGather,
                                    dense / parts + (p < dense % parts ? 1 : 0), shape.dp);
        scatter[k] = collective_s(plan, spec::CollectiveKind::kReduceScatter,
                                  (layer.params - experts) * g, shape.dp);
      }
      if (experts > 0 && plan.expert_replicas() > 1) {
        gather[k] +=
            collective_s(plan, spec::CollectiveKind::kAllGather, experts * e, shape.expert_dp);
        scatter[k] +=
            collective_s(plan, spec::CollectiveKind::kReduceScatter, experts * g, shape.expert_dp);
      }
    }
  }
  // Offloaded activations on one stage: each layer's reload runs on the copy stream in order
  // with the parameter fetches (the simulator's offload-in stream), issued when the backward of
  // the layer above it starts, once that layer has its parameters and activations (the
  // program's issue point holds those waits), and once its copy out has ended; a layer the pass
  // reaches unprefetched reloads its own there. `reload`: each layer's copy, either way.
  std::vector<double> reload(order.size(), 0);
  z.reloads = plan.pp == 1 && plan.offload.activations != spec::OffloadTarget::kNone;
  if (z.reloads) {
    const std::vector<spec::Recompute> modes = models::layer_recompute(plan, lowered);
    const std::vector<bool> kept_on_host = models::layer_activation_offload(plan, lowered);
    for (size_t k = 0; k < order.size(); ++k)
      if (kept_on_host[order[k]])
        reload[k] = ps_to_seconds(
            offload_.device_host_copy(lowered.layers[order[k]].saved_bytes_for(modes[order[k]])));
  }
  // One micro-batch's passes as the simulator's program runs them (program_builder's pass):
  // at each layer's start the gathers of it and the next `prefetch` layers are issued, each
  // after its fetch (the copy stream in order) and on the data-parallel stream in order; the
  // layer computes once its gather is done, slowed while the stream runs beside it (the
  // engine's overlap model, where it computes alone); in backward its scatter follows its
  // compute on the same stream (and the next layer waits for it without dp_overlap). What the
  // compute waits and how much longer it runs are the passes' costs; the scatters still running
  // after the last backward, the step's tail.
  const size_t ahead = static_cast<size_t>(std::max<int64_t>(0, stack.zero3_prefetch));
  const auto window = static_cast<size_t>(plan.offload.prefetch_layers);
  const StageEntry& entry = stages.entries[largest];
  struct PassCost {
    double waited = 0, slowed = 0, tail = 0;
  };
  // With offloaded activations (z.reloads) the forward copies each offloaded layer's activations
  // to the host once it is done, on a stream of their own in order, and the layer after the next
  // waits for that copy (the double buffer; the program's issue point holds that wait, so the
  // fetches issued there follow it). In backward a reload also waits for its copy out (times
  // counted from the forward's end: one stage's backward follows its forward).
  std::vector<double> copied_out(order.size(), 0);
  auto run_pass = [&](bool forward) {
    const double f =
        slowdown_beside(forward ? entry.forward_alone_share : entry.backward_alone_share);
    PassCost cost;
    double compute = 0, copies = 0, stream = 0, to_host = 0, hold = 0;
    double last_out = -1;  // when the pass's latest copy to the host ends (-1: none yet)
    std::vector<double> gathered(order.size(), -1), reloaded(order.size(), -1);
    for (size_t step = 0; step < order.size(); ++step) {
      const size_t k = forward ? step : order.size() - 1 - step;
      const double issue = std::max(compute, hold);
      hold = 0;
      for (size_t a = step; a <= step + ahead && a < order.size(); ++a) {
        const size_t j = forward ? a : order.size() - 1 - a;
        if (gathered[j] >= 0) continue;
        if (!forward && lowered.layers[order[j]].kept_for_backward) {
          gathered[j] = 0;  // kept whole from its forward: gathered for nothing
          continue;
        }
        copies = std::max(copies, issue) + fetch[j];
        stream = std::max({stream, issue, copies}) + gather[j];
        gathered[j] = stream;
      }
      double start = std::max(issue, gathered[k]);
      if (!forward && reload[k] > 0) {
        if (reloaded[k] < 0) {
          copies = std::max({copies, start, copied_out[k]}) + reload[k];
          reloaded[k] = copies;
        }
        start = std::max(start, reloaded[k]);
      }
      for (size_t d = 1; !forward && d <= window && k >= d; ++d) {
        if (reload[k - d] <= 0 || reloaded[k - d] >= 0) continue;
        copies = std::max({copies, start, copied_out[k - d]}) + reload[k - d];
        reloaded[k - d] = copies;
      }
      cost.waited += start - compute;
      const size_t i = order[k];
      const double work = forward ? stages.layer_forward[i] : stages.layer_backward[i];
      // Slowed by 1 + f while the stream is busy, at full speed after.
      const double busy = std::max(0.0, stream - start);
      const double wall = work * (1 + f) <= busy ? work * (1 + f) : work + busy * f / (1 + f);
      cost.slowed += wall - work;
      compute = start + wall;
      if (!forward) {
        stream = std::max(stream, compute) + scatter[k];
        if (!stack.dp_overlap) {  // the backward waits for each scatter
          cost.waited += stream - compute;
          compute = stream;
        }
      }
      if (forward && reload[k] > 0) {
        if (last_out >= 0 && step + 1 < order.size()) hold = last_out;
        to_host = std::max(to_host, compute) + reload[k];
        copied_out[k] = to_host;
        last_out = to_host;
      }
    }
    if (forward)
      for (double& t : copied_out) t = std::max(0.0, t - compute);
    cost.tail = std::max(0.0, stream - compute);
    return cost;
  };
  const PassCost forward = run_pass(true), backward = run_pass(false);
  z.waits = forward.waited + backward.waited;
  z.forward_slowed = forward.slowed;
  z.backward_slowed = backward.slowed;
  z.tail = backward.tail;
  return l.zero3_times.emplace(key, z).first->second;
}

const std::shared_ptr<const spec::PipelineSweep::StageUnits>& Estimator::stage_units(
    const spec::Plan& plan, int64_t micro_batches) {
  auto key =
      std::make_tuple(static_cast<int>(plan.schedule), plan.pp, plan.virtual_stages, micro_batches);
  auto it = stage_units_.find(key);
  if (it != stage_units_.end()) return it->second;
  return stage_units_
      .emplace(key, spec::PipelineSweep::units(plan.schedule, plan.pp, plan.virtual_stages,
                                               micro_batches))
      .first->second;
}

double Estimator::slowest_speed(int64_t world) {
  auto it = slowest_speed_.find(world);
  if (it != slowest_speed_.end()) return it->second;
  double slowest = 1.0;
  for (int64_t r = 0; r < world; ++r) slowest = std::min(slowest, cluster_->speed_factor(r));
  return slowest_speed_.emplace(world, slowest).first->second;
}

const std::vector<Estimator::LayerCost>& Estimator::layer_costs(const spec::Plan& plan,
                                                                const spec::Stack& stack,
                                                                spec::Recompute mode, Lowering& l) {
  auto key = std::make_tuple(mode, static_cast<int>(stack.tp_overlap));
  auto it = l.costs.find(key);
  if (it != l.costs.end()) return it->second;
  const Shapes& shape = shapes(plan);
  const sim::LayerGroups groups{shape.tp,
                                shape.cp,
                                shape.ep,
                                shape.grid_x,
                                shape.grid_y,
                                shape.grid_z,
                                shape.spatial,
                                shape.filter_reduce,
                                shape.channel_gather,
                                shape.dp};
  std::vector<LayerCost> costs;
  const std::vector<models::Layer>& layers = l.lowered.layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    const models::Layer& layer = layers[i];
    // A run of alike blocks is priced once (the GEMM model was a fifth of the estimate phase).
    if (i > 0 && layer.same_work_as(layers[i - 1])) {
      costs.push_back(costs.back());
      continue;
    }
    sim::LayerTimes t =
        sim::layer_times(layer, plan, stack, *l.compute, collectives(plan), groups, mode);
    LayerCost cost{t.forward,
                   t.backward,
                   t.recompute,
                   std::move(t.forward_profile),
                   std::move(t.recompute_profile),
                   0,
                   0,
                   t.forward_issue,
                   t.backward_issue,
                   {},
                   {}};
    for (const models::LoweredModel& own : l.rank_lowered) {
      // A rank's host issues its own kernels; each unit's GPU time is the most loaded rank's.
      const sim::LayerTimes mine =
          sim::layer_times(own.layers[i], plan, stack, *l.compute, collectives(plan), groups, mode);
      cost.rank_forward_issue.push_back(
          {t.forward_issue.gpu_s, mine.forward_issue.host_s, mine.forward_issue.critical_s});
      cost.rank_backward_issue.push_back(
          {t.backward_issue.gpu_s, mine.backward_issue.host_s, mine.backward_issue.critical_s});
    }
    for (const sim::PassSegment& segment : t.backward_profile)
      sim::append_segment(cost.backward_profile, segment.seconds, segment.alone);
    for (const sim::PassSegment& segment : cost.forward_profile)
      cost.forward_alone += segment.alone ? segment.seconds : 0;
    for (const sim::PassSegment& segment : cost.backward_profile)
      cost.backward_alone += segment.alone ? segment.seconds : 0;
    costs.push_back(std::move(cost));
  }
  return l.costs.emplace(key, std::move(costs)).first->second;
}

double Estimator::host_issue_delay(const Stages& stages, int64_t micro_batches) {
  // A stage's m micro-batches, each its forward then its backward (X), issued by the host one
  // after another: X^m ends at most M + (m - 1) max(g, h) after the host starts (by induction
  // from HostChain::then: the bound of X^k's j-th copy, (j - 1) h + M + (k - j) g, is linear in
  // j), against m g for the GPU work back to back. The slowest stage's delay holds the step.
  // (Under SUPER's branch split, each tp rank's own issue: the latest holds the step.)
  double delay = 0;
  const double m = static_cast<double>(micro_batches);
  for (const StageEntry& entry : stages.entries) {
    std::vector<sim::HostChain> chains = entry.rank_issues;
    if (chains.empty()) chains.push_back(entry.issue);
    for (const sim::HostChain& x : chains) {
      if (x.host_s <= 0) continue;
      delay = std::max(delay, x.critical_s - x.gpu_s + (m - 1) * std::max(0.0, x.host_s - x.gpu_s));
    }
  }
  return delay;
}

double Estimator::overlap_cost(double overlapped) const {
  // Compute beside `overlapped` seconds of communication runs 1 + f times slower (the engine's
  // overlap model): it costs overlapped * f / (1 + f) more.
  const double f = cluster_->device.overlap_slowdown;
  return std::max(0.0, overlapped) * f / (1 + f);
}

double Estimator::slowdown_beside(double alone_share) const {
  // A transfer of time t costs t f / (1 + f) beside compute alone, so a share a of it there
  // costs a t f / (1 + f): the slowdown f' with f' / (1 + f') = a f / (1 + f).
  const double f = cluster_->device.overlap_slowdown;
  const double r = sim::wall_alone_share(alone_share, f) * f / (1 + f);
  return r / (1 - r);
}

const Estimator::Stages& Estimator::stage_entries(const spec::Plan& plan, const spec::Stack& stack,
                                                  Lowering& l) {
  const int64_t offloaded_layers =
      plan.offload.activations == spec::OffloadTarget::kNone ? -1 : plan.offload.activation_layers;
  // (GEMS holds two stages a rank: its own key, as its schedule's local chunks.)
  auto key = std::make_tuple(
      plan.pp, plan.schedule == spec::Schedule::kGems ? -1 : plan.virtual_stages, plan.stage_layers,
      plan.recompute, plan.recompute_layers, static_cast<int>(stack.tp_overlap), offloaded_layers,
      plan.offload.prefetch_layers);
  auto it = l.stages.find(key);
  if (it != l.stages.end()) return it->second;
  // Each layer priced in its own recompute mode (all in the plan's, unless only some layers of
  // each chunk are recomputed).
  const std::vector<spec::Recompute> modes = models::layer_recompute(plan, l.lowered);
  const std::vector<bool> offloaded = models::layer_activation_offload(plan, l.lowered);
  const std::vector<LayerCost>& planned = layer_costs(plan, stack, plan.recompute, l);
  const std::vector<LayerCost>& kept =
      plan.recompute_layers > 0 ? layer_costs(plan, stack, spec::Recompute::kNone, l) : planned;
  std::vector<StageEntry> stages;
  std::vector<double> layer_backward(l.lowered.layers.size(), 0.0);
  std::vector<double> layer_forward(l.lowered.layers.size(), 0.0);
  for (int64_t s = 0; s < plan.pp; ++s) {
    StageEntry entry;
    const sim::StageLayers layers = sim::stage_layers(plan, l.lowered, s);
    const size_t chunks = layers.chunk_begin.size();
    entry.chunk_forward.assign(chunks, 0);
    entry.chunk_backward.assign(chunks, 0);
    entry.chunk_forward_alone.assign(chunks, 0);
    entry.chunk_backward_alone.assign(chunks, 0);
    entry.chunk_forward_head.assign(chunks, {nullptr, nullptr});
    entry.chunk_backward_head.assign(chunks, {nullptr, nullptr});
    sim::HostChain forward_issue, backward_issue;
    std::vector<sim::HostChain> rank_forward(l.rank_lowered.size()),
        rank_backward(l.rank_lowered.size());
    for (size_t c = 0; c < chunks; ++c) {
      const size_t begin = layers.chunk_begin[c], end = layers.chunk_end[c];
      for (size_t i = begin; i < end; ++i) {
        const std::vector<LayerCost>& costs = modes[i] == plan.recompute ? planned : kept;
        // (Wall times: the GEMMs beside overlapped tensor-parallel collectives already slowed.)
        const double all = costs[i].forward + costs[i].backward + costs[i].recompute;
        entry.time += all;
        layer_backward[i] = costs[i].backward + costs[i].recompute;
        layer_forward[i] = costs[i].forward;
        entry.chunk_forward[c] += costs[i].forward;
        entry.chunk_backward[c] += all - costs[i].forward;
        entry.chunk_forward_alone[c] += costs[i].forward_alone;
        entry.chunk_backward_alone[c] += costs[i].backward_alone;
        // The passes' beginnings: the forward's first layers, the backward's last ones (the
        // costs live as long as the stages, in the same lowering).
        if (i < begin + 2) entry.chunk_forward_head[c][i - begin] = &costs[i].forward_profile;
        if (i + 2 >= end) entry.chunk_backward_head[c][end - 1 - i] = &costs[i].backward_profile;
        // The backward runs the layers the other way.
        forward_issue = forward_issue.then(costs[i].forward_issue);
        backward_issue = costs[i].backward_issue.then(backward_issue);
        for (size_t r = 0; r < rank_forward.size(); ++r) {
          rank_forward[r] = rank_forward[r].then(costs[i].rank_forward_issue[r]);
          rank_backward[r] = costs[i].rank_backward_issue[r].then(rank_backward[r]);
        }
      }
      const OffloadWaits waits =
          activation_offload_waits(offload_, l.lowered, modes, offloaded, begin, end, layer_forward,
                                   layer_backward, plan.offload.prefetch_layers);
      entry.offload_forward_wait += waits.forward;
      entry.offload_backward_wait += waits.backward;
      entry.chunk_forward[c] += waits.forward;
      entry.chunk_backward[c] += waits.backward;
      entry.time += waits.forward + waits.backward;
    }
    auto share = [](const std::vector<double>& alone, const std::vector<double>& all) {
      const double sum = std::accumulate(all.begin(), all.end(), 0.0);
      return sum > 0 ? std::accumulate(alone.begin(), alone.end(), 0.0) / sum : 1.0;
    };
    entry.forward_alone_share = share(entry.chunk_forward_alone, entry.chunk_forward);
    entry.backward_alone_share = share(entry.chunk_backward_alone, entry.chunk_backward);
    entry.footprint = sim::stage_footprint(plan, l.lowered, s);
    entry.issue = forward_issue.then(backward_issue);
    for (size_t r = 0; r < rank_forward.size(); ++r)
      entry.rank_issues.push_back(rank_forward[r].then(rank_backward[r]));
    if (auto sum = models::partial_gradient_sum(plan, l.lowered, s, 1))
      entry.partial_params = sum->elements;
    stages.push_back(std::move(entry));
  }
  Stages out;
  for (const StageEntry& stage : stages)
    out.summary.slowest = std::max(out.summary.slowest, stage.time);
  out.entries = std::move(stages);
  out.layer_backward = std::move(layer_backward);
  out.layer_forward = std::move(layer_forward);
  return l.stages.emplace(key, std::move(out)).first->second;
}

const Estimator::DrainLayout& Estimator::drain_layout(const spec::Plan& plan, Lowering& l,
                                                      const Stages& stages, int64_t bucket_bytes,
                                                      int64_t grad_bytes) {
  const auto key = std::make_tuple(static_cast<const void*>(&stages), bucket_bytes, grad_bytes);
  auto it = l.drain_layouts.find(key);
  if (it != l.drain_layouts.end()) return it->second;
  const models::LoweredModel& lowered = l.lowered;
  DrainLayout out;
  std::vector<int64_t> position(lowered.layers.size(), -1);
  for (int64_t st = 0; st < plan.pp; ++st) {
    std::vector<models::GradientBucket> buckets =
        models::gradient_buckets(plan, lowered, st, bucket_bytes, grad_bytes);
    DrainLayout::Stage stage;
    stage.layers = out.layer_backward.size();
    stage.passes = out.pass_end.size();
    stage.buckets = out.bucket_ready_after.size();
    stage.slowdown = slowdown_beside(stages.entries[static_cast<size_t>(st)].backward_alone_share);
    // The stage's backward passes from the first that ends a chunk's last micro-batch (when its
    // buckets can start reducing) to the end of the step: the last one alone under GPipe and
    // 1F1B; with interleaving, every chunk's last micro-batch with the other micro-batches'
    // backwards between them. A layer's buckets are complete after its last micro-batch.
    const sim::StageLayers layers = sim::stage_layers(plan, lowered, st);
    for (size_t c = 0; c < layers.chunk_begin.size(); ++c)
      std::fill(position.begin() + static_cast<std::ptrdiff_t>(layers.chunk_begin[c]),
                position.begin() + static_cast<std::ptrdiff_t>(layers.chunk_end[c]), -1);
    for (const auto& [chunk, last] : drain_passes(plan, st)) {
      const auto c = static_cast<size_t>(chunk);
      for (size_t i = layers.chunk_end[c]; i-- > layers.chunk_begin[c];) {
        if (last) position[i] = static_cast<int64_t>(out.layer_backward.size() - stage.layers);
        out.layer_backward.push_back(stages.layer_backward[i]);
      }
      out.pass_end.push_back(out.layer_backward.size() - stage.layers);
    }
    for (const models::GradientBucket& b : buckets) {
      // Buckets alike in size, kind and matrices (most are) are priced once.
      size_t c = 0;
      while (c < out.classes.size() &&
             (out.classes[c].params != b.params || out.classes[c].experts != b.experts ||
              out.classes[c].matrices != b.matrices))
        ++c;
      if (c == out.classes.size()) {
        out.classes.push_back(b);
        out.classes.back().layers.clear();
      }
      if (b.after_tied_sum) {
        stage.tied_class = static_cast<int64_t>(c);
        stage.last_params = b.params;
        continue;
      }
      if (stage.tied_class < 0) stage.last_params = b.params;
      out.bucket_ready_after.push_back(position[b.layers.back()]);
      out.bucket_class.push_back(c);
    }
    stage.layer_count = out.layer_backward.size() - stage.layers;
    stage.pass_count = out.pass_end.size() - stage.passes;
    stage.bucket_count = out.bucket_ready_after.size() - stage.buckets;
    if (st == 0) out.first_stage_buckets = std::move(buckets);
    out.stages.push_back(stage);
  }
  return l.drain_layouts.emplace(key, std::move(out)).first->second;
}

const Estimator::DpTimes& Estimator::dp_times(const spec::Plan& plan, const spec::Stack& stack,
                                              Lowering& l, const Stages& stages) {
  const models::LoweredModel& lowered = l.lowered;
  const int64_t g = spec::dtype_bytes(spec::gradient_dtype(stack, lowered.dtype));
  const int64_t e = spec::dtype_bytes(lowered.dtype);
  const spec::GradientCompression& comp = plan.compression;
  const DpKey key{&stages,
                  plan.replicas(),
                  stack.dp_bucket_bytes,
                  g,
                  e,
                  plan.zero,
                  stack.dp_overlap,
                  static_cast<int>(comp.kind),
                  comp.bits,
                  comp.bucket,
                  comp.rank,
                  comp.ratio,
                  comp.error_feedback,
                  static_cast<int>(comp.sparse_algorithm)};
  auto it = l.dp_times.find(key);
  if (it != l.dp_times.end()) return it->second;
  const DrainLayout& layout = drain_layout(plan, l, stages, stack.dp_bucket_bytes, g);
  const Shapes& shape = shapes(plan);
  const spec::CollectiveKind kind =
      plan.zero >= 1 ? spec::CollectiveKind::kReduceScatter : spec::CollectiveKind::kAllReduce;
  // The routed experts' buckets under expert parallelism are summed over the expert replicas
  // (none to sum with when that is one rank).
  auto bucket_shape = [&](const models::GradientBucket& b) -> const sim::GroupShape& {
    return b.experts ? shape.expert_dp : shape.dp;
  };
  auto reduced = [&](const models::GradientBucket& b) {
    return !b.experts || plan.expert_replicas() > 1;
  };
  std::array<double, 8> few{};  // (most layouts have a class or two: no allocation for them)
  std::vector<double> many;
  double* class_seconds = few.data();
  if (layout.classes.size() > few.size()) {
    many.resize(layout.classes.size());
    class_seconds = many.data();
  }
  for (size_t c = 0; c < layout.classes.size(); ++c) {
    const models::GradientBucket& b = layout.classes[c];
    class_seconds[c] =
        b.params > 0 && reduced(b) ? bucket_seconds(plan, l, kind, b, g, bucket_shape(b)) : 0;
  }
  DpTimes out;
  out.bucket_seconds.reserve(layout.bucket_class.size());
  for (size_t c : layout.bucket_class) out.bucket_seconds.push_back(class_seconds[c]);
  out.drain.stages.reserve(layout.stages.size());
  for (const DrainLayout::Stage& stage : layout.stages) {
    spec::StageDrain in;
    in.layer_backward = std::span(layout.layer_backward).subspan(stage.layers, stage.layer_count);
    in.pass_end = std::span(layout.pass_end).subspan(stage.passes, stage.pass_count);
    in.bucket_ready_after =
        std::span(layout.bucket_ready_after).subspan(stage.buckets, stage.bucket_count);
    // (The vector's storage moves with it into the cache.)
    in.bucket_seconds = std::span(out.bucket_seconds).subspan(stage.buckets, stage.bucket_count);
    in.slowdown = stage.slowdown;
    in.overlap = stack.dp_overlap;
    if (stage.tied_class >= 0) {
      // After the end stages' embedding-group all-reduce of the tied table (sim: one stream;
      // models::backward_tail: the other buckets, the tied sum, then its buckets).
      const int64_t tied = models::tied_table_sum(plan, lowered, 0, g)->bytes;
      in.after += collective_s(plan, spec::CollectiveKind::kAllReduce, tied, shape.embedding) +
                  class_seconds[static_cast<size_t>(stage.tied_class)];
    }
    if (plan.pp == 1) {
      // No schedule to wait on: the last backward runs at once, slowed, then the tail.
      double work = 0;
      for (double w : in.layer_backward) work += w;
      out.single_stage_extra = spec::drain_back_to_back(in).end - work;
    }
    out.drain.stages.push_back(in);
  }
  if (plan.zero >= 1) {
    // Each stage's buckets (its tied table's too) all-gathered one after another.
    for (size_t c = 0; c < layout.classes.size(); ++c) {
      const models::GradientBucket& b = layout.classes[c];
      class_seconds[c] = reduced(b) ? collective_s(plan, spec::CollectiveKind::kAllGather,
                                                   b.params * e, bucket_shape(b))
                                    : 0;
    }
    out.stage_gather.reserve(layout.stages.size());
    for (const DrainLayout::Stage& stage : layout.stages) {
      double gathered = 0;
      for (size_t k = stage.buckets; k < stage.buckets + stage.bucket_count; ++k)
        gathered += class_seconds[layout.bucket_class[k]];
      if (stage.tied_class >= 0) gathered += class_seconds[static_cast<size_t>(stage.tied_class)];
      out.stage_gather.push_back(gathered);
    }
    // Megatron gathers the buckets the first forward needs first (the last ones reduced), one
    // after another; a layer's first forward waits for every bucket holding some of it.
    const std::vector<models::GradientBucket>& buckets = layout.first_stage_buckets;
    std::vector<double> ready(lowered.layers.size(), 0.0);
    for (size_t b = buckets.size(); b-- > 0;) {
      if (!reduced(buckets[b])) continue;
      out.gather_total += collective_s(plan, spec::CollectiveKind::kAllGather,
                                       buckets[b].params * e, bucket_shape(buckets[b]));
      for (size_t layer : buckets[b].layers) ready[layer] = out.gather_total;
    }
    out.gather_delay = first_stage_gather_delay(plan, lowered, stages, ready, out.gather_total);
  }
  return l.dp_times.emplace(key, std::move(out)).first->second;
}

double Estimator::first_stage_gather_delay(const spec::Plan& plan,
                                           const models::LoweredModel& lowered,
                                           const Stages& stages, const std::vector<double>& ready,
                                           double gathered) const {
  // The first stage starts at once (the others start later, after transfers, and wait less):
  // its forwards in the schedule's order, chunk c's first after c * pp forwards of the chunks
  // before it (the interleaved schedule runs pp micro-batches per chunk in turn; one chunk
  // without interleaving). A chunk's first forward runs layer by layer, each waiting for its
  // buckets; every forward runs slowed while the gather goes on beside it (the engine's overlap
  // model, where it computes alone), and what still runs of the gather after them slows what
  // follows. The delay is what these forwards took beyond their work.
  const StageEntry& first = stages.entries.front();
  const double f = slowdown_beside(first.forward_alone_share);
  const sim::StageLayers layers = sim::stage_layers(plan, lowered, 0);
  double t = 0, work = 0;
  auto run = [&](double start, double seconds) {
    const double busy = std::max(0.0, gathered - start);
    work += seconds;
    return start + (seconds * (1 + f) <= busy ? seconds * (1 + f) : seconds + busy * f / (1 + f));
  };
  const int64_t turns = plan.virtual_stages > 1 ? std::min(plan.pp, plan.micro_batches()) : 1;
  for (size_t c = 0; c < layers.chunk_begin.size(); ++c) {
    for (int64_t j = 0; j < turns; ++j) {
      if (j > 0) {
        t = run(t, first.chunk_forward[c]);
        continue;
      }
      for (size_t i = layers.chunk_begin[c]; i < layers.chunk_end[c]; ++i)
        t = run(std::max(t, ready[i]), stages.layer_forward[i]);
    }
  }
  // What compute runs beside the rest of the gather: slowed in the wall share that is alone.
  return t - work +
         overlap_cost(std::max(0.0, gathered - t)) *
             sim::wall_alone_share(first.forward_alone_share, cluster_->device.overlap_slowdown);
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

// The partial gradients' sum (models::partial_gradient_sum) ahead of each stage's update:
// over tp under sequence parallelism, over z on a tensor grid, over tp for the weights a per-op
// plan holds whole on the tp ranks. It starts once the last backward is done, on its own stream
// (the simulator's program): with a data-parallel exchange beside the drain's last buckets, so
// only what outlasts them (the drain's time past the stage's backward, run back to back) is
// exposed. Norms and biases take a thousandth of the buckets' time and never outlast them; a
// per-op plan's whole weights may.
double Estimator::partial_sum_seconds(const spec::Plan& plan, const StageEntry& entry,
                                      int64_t grad_bytes, const DpTimes* dp, size_t stage) {
  if (entry.partial_params == 0) return 0.0;
  const Shapes& shape = shapes(plan);
  const double sum =
      collective_s(plan, spec::CollectiveKind::kAllReduce, entry.partial_params * grad_bytes,
                   plan.tp_grid.any() ? shape.grid_z : shape.tp);
  if (!dp) return sum;
  const spec::StageDrain& drain = dp->drain.stages[stage];
  double work = 0;
  for (double w : drain.layer_backward) work += w;
  return std::max(0.0, sum - (spec::drain_back_to_back(drain).end - work));
}

// Through parameter servers (the simulator's program): each stage's compute ends with its
// partial sums and the host's step work; then on the data-parallel stream the push, the server's
// sum and update and the pull (models/parameter_server.hpp). Synchronous workers wait for the
// pull; stale ones go on, so a step costs the longer of the compute and the exchange, the
// exchange's transfers slowing the compute beside them. Returns the step from the pipeline's
// `step` (its last pass at `pipeline_end`).
double Estimator::servers_step(const spec::Plan& plan, const spec::Stack& stack, Lowering& l,
                               const Stages& stages, size_t stage_ends_at, double pipeline_end,
                               double step) {
  const models::LoweredModel& lowered = l.lowered;
  const sim::ComputeModel& compute = *l.compute;
  const int64_t g = spec::dtype_bytes(spec::gradient_dtype(stack, lowered.dtype));
  const int64_t w = spec::dtype_bytes(lowered.dtype);
  const models::OptimizerPrecision precision =
      models::optimizer_precision(stack, lowered.dtype, plan.zero);
  const Shapes& shape = shapes(plan);
  // The end stages' sum of the tied table runs first on the data-parallel stream: the pipeline's
  // step holds it, and a stale worker's compute does not wait for it.
  double tied = 0;
  if (const std::optional<models::StepOp> sum = models::tied_table_sum(plan, lowered, 0, g))
    tied = collective_s(plan, spec::CollectiveKind::kAllReduce, sum->bytes, shape.embedding);
  double compute_end = 0, exchanged = 0, transfers = 0, exchange = 0;
  for (size_t s = 0; s < stages.entries.size(); ++s) {
    const StageEntry& entry = stages.entries[s];
    const int64_t params = entry.footprint.params;
    const bool end_stage = s == 0 || s + 1 == stages.entries.size();
    const models::StepOp push = models::ps_push(params, g);
    const models::StepOp sum = models::ps_sum(params, plan.dp, g);
    const models::StepOp update = models::ps_update(precision, params, plan.dp);
    const models::StepOp pull = models::ps_pull(params, w);
    const double moved = collective_s(plan, *push.collective, push.bytes, shape.dp) +
                         collective_s(plan, *pull.collective, pull.bytes, shape.dp);
    const double here =
        moved + ps_to_seconds(compute.optimizer_time(sum.elements, sum.bytes / sum.elements) +
                              compute.optimizer_time(update.elements,
                                                     models::optimizer_bytes_per_param(precision)));
    const double end = (plan.pp > 1 ? l.stage_ends[stage_ends_at + s] : pipeline_end) +
                       partial_sum_seconds(plan, entry, g, nullptr, s) +
                       ps_to_seconds(compute.step_overhead());
    compute_end = std::max(compute_end, end);
    exchanged = std::max(exchanged, end + here);
    if (here + (end_stage ? tied : 0) > exchange) {
      exchange = here + (end_stage ? tied : 0);
      transfers = moved;
    }
  }
  const double before = step - pipeline_end;  // the step's compute before its pipeline
  if (plan.parameter_server.staleness == 0) return before + exchanged;
  // Stale: the exchanges run back to back while the compute goes on, slowed beside them.
  const double computed = before - tied + compute_end;
  return std::max(computed + overlap_cost(std::min(transfers, computed)), exchange);
}

double Estimator::latest_update_end(const spec::Plan& plan, const spec::Stack& stack, Lowering& l,
                                    const Stages& stages, const DpTimes* dp, size_t stage_ends_at,
                                    const PipelineStep* pipedream) {
  const models::LoweredModel& lowered = l.lowered;
  const sim::ComputeModel& compute = *l.compute;
  const int64_t g = spec::dtype_bytes(spec::gradient_dtype(stack, lowered.dtype));
  const spec::Dtype param_dtype = spec::parameter_dtype(stack, lowered.dtype);
  // Each stage's update once its last pass and drain are done (sim's program builder): the
  // optimizer step over what the rank updates, on the device or (ZeRO-Offload) on the host, and
  // ZeRO-1/2's gather of its buckets after it when not overlapped. The step ends with the
  // latest stage's: the stage with the most to update (an end stage, holding the embedding or
  // the head) is not always the last to finish its backward.
  const int64_t n = plan.replicas(), ne = plan.expert_replicas();
  const int64_t per_param = models::optimizer_bytes_per_param(
      models::optimizer_precision(stack, lowered.dtype, plan.zero));
  const int64_t stash =
      spec::asynchronous(plan.schedule)
          ? models::weight_stash_copy_bytes_per_param(
                models::optimizer_precision(stack, lowered.dtype, plan.zero).model_params)
          : 0;
  // ZeRO-Offload copies each reduced gradient shard to the host: a bucket's under ZeRO-1/2 (the
  // tied table's last), a layer's under ZeRO-3 (the stage's first layer last).
  const bool offloaded = plan.offload.optimizer != spec::OffloadTarget::kNone;
  const DrainLayout* buckets = offloaded && plan.zero < 3
                                   ? &drain_layout(plan, l, stages, stack.dp_bucket_bytes, g)
                                   : nullptr;
  auto last_copied = [&](size_t s) -> int64_t {
    if (buckets) return buckets->stages[s].last_params;
    return lowered.layers[sim::stage_layers(plan, lowered, static_cast<int64_t>(s)).chunk_begin[0]]
        .params;
  };
  auto update_seconds = [&](const StageEntry& entry, int64_t last_params) {
    const int64_t params = entry.footprint.params;
    const int64_t stage_shard = (params + n - 1) / n;
    if (offloaded) {
      // ZeRO-Offload: the last gradients' copy to the host, the host step, and the updated
      // shard's way back.
      const int64_t last = (last_params + n - 1) / n * g;
      return ps_to_seconds(offload_.device_host_copy(last) +
                           offload_.host_step(stage_shard, param_dtype, plan.offload.optimizer) +
                           offload_.params_return(stage_shard * spec::dtype_bytes(param_dtype),
                                                  plan.offload.params) +
                           compute.step_overhead());
    }
    int64_t updated = plan.zero >= 1 ? stage_shard : params;
    if (plan.zero >= 1 && plan.ep > 1) {
      // The routed experts' state is sharded over the expert replicas.
      const int64_t experts = entry.footprint.expert_params;
      updated = (params - experts + n - 1) / n + (experts + ne - 1) / ne;
    }
    // PipeDream-2BW in fp32: the newest version of what the rank updates copied to the free
    // buffer first.
    return ps_to_seconds(compute.optimizer_time(updated, per_param) + compute.step_overhead() +
                         (stash > 0 ? compute.optimizer_time(updated, stash) : 0));
  };
  const bool gathered =
      models::layer_parameters(plan) == models::LayerParameters::kGatheredAfterUpdate;
  const bool gather_after = gathered && !stack.param_gather_overlap;
  double latest = 0, period = 0, slowest = 0;
  int64_t priced_params = -1, priced_experts = -1, priced_last = -1;
  double priced = 0;
  for (size_t s = 0; s < stages.entries.size(); ++s) {
    const StageEntry& entry = stages.entries[s];
    const int64_t last = offloaded ? last_copied(s) : 0;
    if (entry.footprint.params != priced_params ||
        entry.footprint.expert_params != priced_experts || last != priced_last) {
      priced_params = entry.footprint.params;
      priced_experts = entry.footprint.expert_params;
      priced_last = last;
      priced = update_seconds(entry, last);
    }
    const double end = plan.pp > 1 ? l.stage_ends[stage_ends_at + s] : 0.0;
    const double updated = end + partial_sum_seconds(plan, entry, g, dp, s) + priced +
                           (gather_after ? dp->stage_gather[s] : 0.0);
    latest = std::max(latest, updated);
    if (pipedream) {
      // The stage's passes, then its drain past its last backward and its update.
      const double undrained = l.stage_ends[*pipedream->undrained_ends_at + s];
      period = std::max(period, entry.time + updated - undrained);
      slowest = std::max(slowest, entry.time);
    }
  }
  // PipeDream (pipeline_step): the batch is the steady makespan's period, the slowest passes,
  // with the slowest stage's whole period in their place; returned as an end after the batch.
  if (pipedream) return pipedream->undrained_end + period - slowest;
  return latest;
}

Estimate Estimator::estimate(const spec::Plan& plan, const spec::Stack& stack) {
  if (spec::collectives_block(*cluster_))
    return estimate_as_run(plan, spec::stack_on(*cluster_, stack));
  return estimate_as_run(plan, stack);
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
