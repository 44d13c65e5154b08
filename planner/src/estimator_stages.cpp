// The estimator's stages: a layer's passes and a stage's per-micro-batch times, their transfers,
// host issue and the engine's overlap slowdown, activation offload waits.
#include <algorithm>
#include <array>
#include <numeric>
#include <span>

#include "sextant/models/gradient_compression.hpp"
#include "sextant/models/optimizer_step.hpp"
#include "sextant/models/parameter_server.hpp"
#include "sextant/models/step_ops.hpp"
#include "sextant/models/step_program.hpp"
#include "sextant/planner/estimator.hpp"
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

}  // namespace sextant::planner
