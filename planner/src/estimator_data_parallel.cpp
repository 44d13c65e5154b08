// The estimator's data-parallel side: ZeRO gathers replayed per layer, the gradient drain and
// bucket times, the partial gradients' sum, parameter servers' steps.
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

double Estimator::each_pass_extra(const spec::Plan& plan, const spec::Stack& stack,
                                  const Stages& stages, const spec::StageDrain& last) const {
  // ZeRO-2 over micro-batches (models::LayerGradients::kBucketsEachPass, one stage): every
  // micro-batch's backward completes and reduces the buckets, the reductions going on beside the
  // rest of that backward and the next micro-batch's forward (the engine's stream, one reduction
  // after another, compute slowed beside them); without overlap each backward waits for its own.
  const int64_t m = plan.micro_batches();
  if (!stack.dp_overlap) {
    double reductions = 0;
    for (double b : last.bucket_seconds) reductions += b;
    return static_cast<double>(m) * reductions;
  }
  double backward = 0, forward = 0;
  for (double w : last.layer_backward) backward += w;
  for (double w : stages.layer_forward) forward += w;
  // The step's passes from the first backward on, back to back: backward, then (forward,
  // backward) for each later micro-batch, the buckets ready after their layers in every backward.
  std::vector<double> layers;
  std::vector<size_t> ends;
  std::vector<int64_t> ready;
  std::vector<double> seconds;
  layers.reserve(static_cast<size_t>(m) * (last.layer_backward.size() + 1));
  for (int64_t k = 0; k < m; ++k) {
    if (k > 0) {
      layers.push_back(forward);
      ends.push_back(layers.size());
    }
    const auto base = static_cast<int64_t>(layers.size());
    layers.insert(layers.end(), last.layer_backward.begin(), last.layer_backward.end());
    ends.push_back(layers.size());
    for (int64_t r : last.bucket_ready_after) ready.push_back(base + r);
    seconds.insert(seconds.end(), last.bucket_seconds.begin(), last.bucket_seconds.end());
  }
  spec::StageDrain all = last;
  all.layer_backward = layers;
  all.pass_end = ends;
  all.bucket_ready_after = ready;
  all.bucket_seconds = seconds;
  const double work = static_cast<double>(m) * backward + static_cast<double>(m - 1) * forward;
  return spec::drain_back_to_back(all).end - work;
}

const Estimator::DpTimes& Estimator::dp_times(const spec::Plan& plan, const spec::Stack& stack,
                                              Lowering& l, const Stages& stages) {
  const models::LoweredModel& lowered = l.lowered;
  const int64_t g = spec::dtype_bytes(spec::gradient_dtype(stack, lowered.dtype));
  const int64_t e = spec::dtype_bytes(lowered.dtype);
  const spec::GradientCompression& comp = plan.compression;
  const DpKey key{&stages,
                  plan.replicas(),
                  plan.micro_batches(),
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
  const bool each_pass =
      models::layer_gradients(plan, stack.dp_overlap) == models::LayerGradients::kBucketsEachPass;
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
    if (plan.pp == 1 && each_pass) {
      out.single_stage_extra = each_pass_extra(plan, stack, stages, in);
    } else if (plan.pp == 1) {
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

}  // namespace sextant::planner
