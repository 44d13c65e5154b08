// A cheap closed-form estimate of a plan's step time and memory, used to rank the candidates of a
// search before the leaders are simulated event by event. It composes the same compute and
// collective models as the simulator: per-stage forward and backward time per micro-batch with
// the tensor-parallel collectives, the pipeline's makespan over those times under its schedule
// (spec::pipeline_makespan), exposed gradient reduction and parameter gather, and the optimizer.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "sextant/models/lowering.hpp"
#include "sextant/sim/collective_model.hpp"
#include "sextant/sim/compute_model.hpp"
#include "sextant/sim/layer_cost.hpp"
#include "sextant/sim/memory_model.hpp"
#include "sextant/sim/offload_cost.hpp"
#include "sextant/sim/step_setup.hpp"
#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/pipeline_schedule.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/report.hpp"

namespace sextant::planner {

struct Estimate {
  double step_time_s = 0;
  int64_t peak_memory_bytes = 0;  // on the device
  bool host_fits = true;          // the offloaded state fits the rank's share of host memory
  bool fits = false;              // both fit
};

class Estimator {
 public:
  Estimator(const spec::ModelSpec& model, const spec::ClusterSpec& cluster);
  // Not thread-safe (it caches lowerings, schedules and prices); use one per thread. A reference
  // into the lowering cache lives for one estimate() call.
  Estimate estimate(const spec::Plan& plan);
  // With the stack given: `plan.stack` is ignored (the planner's candidates share one stack and
  // do not carry a copy each).
  Estimate estimate(const spec::Plan& plan, const spec::Stack& stack);

 private:
  // estimate() of the stack as the cluster runs it (spec::stack_on).
  Estimate estimate_as_run(const spec::Plan& plan, const spec::Stack& stack);
  struct LayerCost {
    double forward = 0;  // compute + tensor-parallel collectives, s
    double backward = 0;
    double recompute = 0;
    // The passes as stretches (sim::layer_times): the forward, and the recompute then the
    // backward; and their compute alone (not beside a tensor-parallel collective), s.
    std::vector<sim::PassSegment> forward_profile, backward_profile;
    double forward_alone = 0, backward_alone = 0;
    sim::HostChain forward_issue, backward_issue;  // sim::LayerTimes'
    // Under SUPER's branch split, per tp rank: its own kernels' issue against the unit's GPU time
    // (each join waits for the most loaded rank; a rank's host issues only its own kernels).
    std::vector<sim::HostChain> rank_forward_issue, rank_backward_issue;
  };
  // A pipeline stage of one micro-batch, for one split into stages and one recompute mode.
  struct StageEntry {
    double time = 0;  // forward + backward (+ recompute, + overlap slowdown), s
    // Per local chunk: forward, and backward with recompute and the overlap slowdown, s.
    std::vector<double> chunk_forward, chunk_backward;
    // Per local chunk: of those, the compute alone, s; and how each pass begins (its first two
    // layers' stretches), what a pipeline transfer starting with it runs beside.
    std::vector<double> chunk_forward_alone, chunk_backward_alone;
    std::vector<std::array<const std::vector<sim::PassSegment>*, 2>> chunk_forward_head,
        chunk_backward_head;
    // Of the passes' times, what they wait for their offloaded activations (included above), s.
    double offload_forward_wait = 0, offload_backward_wait = 0;
    // The share of its forwards' and backwards' time that is compute alone, not beside a
    // tensor-parallel collective or waiting: where a data-parallel transfer beside them slows
    // them (the engine slows compute once, however many transfers run beside it).
    double forward_alone_share = 1, backward_alone_share = 1;
    sim::StageFootprint footprint;
    // The parameters it holds alike with other ranks that see other tokens, summed after the
    // backward (models::partial_gradient_sum: over tp, or a tensor grid's z).
    int64_t partial_params = 0;
    // One micro-batch's forward then backward through the stage as the host issues its kernels
    // (sim::HostChain; empty when the stack's host is not modelled).
    sim::HostChain issue;
    std::vector<sim::HostChain> rank_issues;  // per tp rank, under the branch split (LayerCost)
  };
  // What a plan's time formula takes from its stages (one pass over them, cached with them).
  struct StageSummary {
    double slowest = 0;  // forward + backward of one micro-batch through a stage, s
  };
  struct Stages {
    std::vector<StageEntry> entries;
    StageSummary summary;
    // Per lowered layer: its backward with recompute, a wall time as layer_costs gives it, s.
    std::vector<double> layer_backward;
    std::vector<double> layer_forward;  // per lowered layer: its forward, s
  };
  // The inputs of a plan's peak memory besides its stages (the stack's overlap knobs are not
  // among them): plans that differ only in those share the last memory result.
  struct MemoryKey {
    const void* stages = nullptr;
    int64_t dp = 0, micro_batches = 0, zero = 0;
    int schedule = 0, grad_dtype = 0, param_dtype = 0;
    int64_t bucket_bytes = 0, prefetch = 0;
    bool autocast = false;
    double reserve = 0;
    spec::Offload offload;
    spec::GradientCompression compression;
    bool operator==(const MemoryKey&) const = default;
  };
  // Per stage, what its pipeline transfers of a step run beside (transfer_terms): seconds of
  // transfers over compute alone, sent (the next pass's beginning) and received (anywhere in
  // the pass), and the stage's compute.
  struct TransferTerm {
    double sent = 0, received = 0, compute = 0;
  };
  // ZeRO-3's parameter gathers and gradient scatters of the largest stage (zero3_times).
  struct Zero3Key {
    const void* stages = nullptr;
    int64_t dp = 0, tp = 0, pp = 0, cp = 0, ep = 0;  // (the groups' shapes)
    int impl = 0;
    int64_t prefetch = 0;
    bool overlap_reductions = true;  // Stack::dp_overlap
    int64_t param_bytes = 0, grad_bytes = 0;
    int offload = 0;
    auto operator<=>(const Zero3Key&) const = default;
  };
  struct Zero3Times {
    // Per micro-batch: what the passes' layers wait for their gathers (and, without dp_overlap,
    // for the scatter of the layer before), s.
    double waits = 0;
    // Per micro-batch: how much longer the forwards and the backwards run beside them, s.
    double forward_slowed = 0, backward_slowed = 0;
    double tail = 0;  // after the last backward: the scatters still running, s
    // Whether `waits` holds the backward's waits for its offloaded activations too: their
    // reloads share the copy stream with the parameter fetches (one stage).
    bool reloads = false;
  };
  struct MakespanKey {
    const void* stages = nullptr;
    int64_t micro_batches = 0;
    int schedule = 0;
    double p2p = 0;
    bool blocking = false;
    auto operator<=>(const MakespanKey&) const = default;
  };
  // What the data-parallel gradient exchange (not ZeRO-3) adds to a step, and the parameter
  // gather of ZeRO-1/2, from the stages' real gradient buckets.
  struct DpKey {
    const void* stages = nullptr;
    int64_t dp = 0, micro_batches = 0, bucket_bytes = 0, grad_bytes = 0, param_bytes = 0, zero = 0;
    bool overlap = false;
    // The compression's kind and knobs (spec::GradientCompression holds a double: no <=>).
    int compression = 0;
    int64_t bits = 0, scale_bucket = 0, rank = 0;
    double ratio = 0;
    bool error_feedback = false;
    int sparse_algorithm = 0;
    auto operator<=>(const DpKey&) const = default;
  };
  // The data-parallel drain of a split into stages for one bucket size and gradient width
  // (models::gradient_buckets), the arrays of every stage end to end: per stage, the drained
  // passes and each bucket's readiness, its buckets by price class (alike in size, kind and
  // matrices: priced once per DpKey); and the first stage's buckets for ZeRO-1/2's parameter
  // gather.
  struct DrainLayout {
    struct Stage {
      size_t layers = 0, passes = 0, buckets = 0;  // where its arrays begin
      size_t layer_count = 0, pass_count = 0, bucket_count = 0;
      int64_t tied_class = -1;  // the tied table's bucket's class, or none
      double slowdown = 0;      // spec::StageDrain's
      int64_t last_params = 0;  // the bucket reduced last (the tied table's, if it has one)
    };
    std::vector<Stage> stages;
    std::vector<double> layer_backward;
    std::vector<size_t> pass_end;  // (each stage's counted from its first layer)
    std::vector<int64_t> bucket_ready_after;
    std::vector<size_t> bucket_class;
    std::vector<models::GradientBucket> classes;  // one bucket of each class, without its layers
    std::vector<models::GradientBucket> first_stage_buckets;
  };
  struct DpTimes {
    // Per stage: its passes from the last micro-batch's first on and its buckets
    // (spec::pipeline_makespan's drain), views of the layout's arrays and of bucket_seconds.
    spec::PipelineDrain drain;
    std::vector<double> bucket_seconds;  // every stage's buckets, end to end
    double single_stage_extra = 0;       // pp 1: what the drain adds to the step, s
    double gather_total = 0;             // the first stage's buckets, all-gathered, s
    double gather_delay = 0;  // what the gather overlapped with the first forwards adds, s
    // Per stage: its own buckets all-gathered (after its update when not overlapped), s.
    std::vector<double> stage_gather;
  };
  struct Lowering {
    sim::StepSetup setup;
    models::LoweredModel lowered;  // under SUPER's branch split, each unit's most loaded rank's
    std::vector<models::LoweredModel> rank_lowered;  // ... and each tp rank's own
    std::optional<sim::ComputeModel> compute;
    std::map<std::tuple<spec::Recompute, int>, std::vector<LayerCost>> costs;
    // By (pp, virtual stages, stage_layers, recompute, recompute_layers, tp_overlap, the
    // activation_layers offloaded or -1, their prefetch_layers), one entry per stage. (ZeRO-3's
    // times key on the entry's address, so on all of these too.)
    std::map<std::tuple<int64_t, int64_t, std::vector<int64_t>, spec::Recompute, int64_t, int,
                        int64_t, int64_t>,
             Stages>
        stages;
    // The pipeline's sweep per stages, micro-batch count, schedule and transfer time, and its
    // makespan per sweep and drain (a DpTimes' or none).
    std::map<MakespanKey, spec::PipelineSweep> sweeps;
    // (Each makespan's stages' ends, pp from the offset it maps to, live in stage_ends: one array
    // for all, not one per makespan.)
    std::map<std::pair<const void*, const void*>, size_t> makespans;
    std::vector<double> stage_ends;
    std::map<MakespanKey, std::vector<TransferTerm>> transfer_terms;
    std::map<Zero3Key, Zero3Times> zero3_times;
    std::map<DpKey, DpTimes> dp_times;
    // By (stages, bucket bytes, gradient bytes).
    std::map<std::tuple<const void*, int64_t, int64_t>, DrainLayout> drain_layouts;
  };
  // Group shapes of a (dp, tp, pp) layout: every plan of a search with that layout shares them.
  struct Shapes {
    sim::GroupShape tp, dp, pp_pair, embedding;  // embedding: the first and the last stage
    sim::GroupShape cp;                          // the ranks splitting each sequence
    sim::GroupShape ep, expert_dp;  // the ranks splitting the experts, and holding the same ones
    sim::GroupShape grid_x, grid_y, grid_z;  // the lines of a 3D tensor grid
    sim::GroupShape spatial;                 // the ranks splitting each sample spatially
    // A CNN channel split's stationary-w reduce and gather groups.
    sim::GroupShape filter_reduce, channel_gather;
  };
  Lowering& lowering(const spec::Plan& plan, const spec::Stack& stack);
  // Every layer's cost in recompute mode `mode`.
  const std::vector<LayerCost>& layer_costs(const spec::Plan& plan, const spec::Stack& stack,
                                            spec::Recompute mode, Lowering& l);
  const Stages& stage_entries(const spec::Plan& plan, const spec::Stack& stack, Lowering& l);
  const DrainLayout& drain_layout(const spec::Plan& plan, Lowering& l, const Stages& stages,
                                  int64_t bucket_bytes, int64_t grad_bytes);
  const DpTimes& dp_times(const spec::Plan& plan, const spec::Stack& stack, Lowering& l,
                          const Stages& stages);
  // What reducing every micro-batch's buckets (ZeRO-2 over micro-batches, one stage) adds to the
  // step's passes, `last` being the last micro-batch's drain.
  double each_pass_extra(const spec::Plan& plan, const spec::Stack& stack, const Stages& stages,
                         const spec::StageDrain& last) const;
  // The device's peak over the stages, and whether every stage's offloaded state fits the host
  // (sim::stage_memory's rules).
  struct PeakMemory {
    int64_t device = 0;
    bool host_fits = true;
  };
  // What ZeRO-1/2's parameter gather, dispatched at the start of the step (Megatron's
  // --overlap-param-gather), delays the first stage's forwards: `ready` holds when each lowered
  // layer's buckets have arrived, `gathered` when the last has, s.
  double first_stage_gather_delay(const spec::Plan& plan, const models::LoweredModel& lowered,
                                  const Stages& stages, const std::vector<double>& ready,
                                  double gathered) const;
  PeakMemory peak_memory(const spec::Plan& plan, const spec::Stack& stack, const Lowering& l,
                         const Stages& stages);
  // The step of a pipeline (pp > 1): the schedule's makespan over the stages with its transfers,
  // the tied table's all-reduce and PipeDream-2BW's steady state; where the stages' ends sit in
  // l.stage_ends, and the makespan alone.
  struct PipelineStep {
    double step = 0;
    size_t stage_ends_at = 0;
    double pipeline_end = 0;
    // PipeDream: the stages' ends of one batch without the drain (in l.stage_ends), and the last.
    std::optional<size_t> undrained_ends_at;
    double undrained_end = 0;
  };
  PipelineStep pipeline_step(const spec::Plan& plan, const spec::Stack& stack, Lowering& l,
                             const Stages& stages, const DpTimes* dp);
  // When the latest stage has updated (the optimizer step, ZeRO-Offload's copies and host step,
  // ZeRO-1/2's gather after it when not overlapped), each from its end in l.stage_ends at
  // `stage_ends_at` (0 without pipeline stages), s.
  // Under PipeDream (`pipedream` set) the batch's steady period instead: the stage whose passes,
  // drain and update together take longest sets the pace.
  double latest_update_end(const spec::Plan& plan, const spec::Stack& stack, Lowering& l,
                           const Stages& stages, const DpTimes* dp, size_t stage_ends_at,
                           const PipelineStep* pipedream = nullptr);
  double partial_sum_seconds(const spec::Plan& plan, const StageEntry& entry, int64_t grad_bytes,
                             const DpTimes* dp, size_t stage);
  double servers_step(const spec::Plan& plan, const spec::Stack& stack, Lowering& l,
                      const Stages& stages, size_t stage_ends_at, double pipeline_end, double step);
  // What `overlapped` seconds of communication beside compute add by slowing it.
  double overlap_cost(double overlapped) const;
  // How much later than its GPU work the step's passes end for the host's issue of their kernels
  // (sim::HostChain), s.
  static double host_issue_delay(const Stages& stages, int64_t micro_batches);
  // The slowdown a transfer beside passes of which `alone_share` is compute alone brings on
  // average: the device's overlap_slowdown f where it meets compute alone, none elsewhere.
  double slowdown_beside(double alone_share) const;
  const sim::CollectiveModel& collectives(const spec::Plan& plan);
  double collective_s(const spec::Plan& plan, spec::CollectiveKind kind, int64_t bytes,
                      const sim::GroupShape& shape);
  // One data-parallel bucket's reduction of its gradients of `grad_bytes`: the collective, or a
  // compressed bucket's exchange (models::compressed_exchange_ops, the simulator's chain on its
  // stream).
  double bucket_seconds(const spec::Plan& plan, const Lowering& l, spec::CollectiveKind kind,
                        const models::GradientBucket& bucket, int64_t grad_bytes,
                        const sim::GroupShape& shape);
  const Shapes& shapes(const spec::Plan& plan);
  // Every stage's live micro-batches under the plan's schedule (spec::live_profile).
  const std::vector<spec::LiveProfile>& live_profiles(const spec::Plan& plan);
  const std::vector<std::pair<int64_t, bool>>& drain_passes(const spec::Plan& plan, int64_t stage);
  const Zero3Times& zero3_times(const spec::Plan& plan, const spec::Stack& stack, Lowering& l,
                                const Stages& stages);
  // What each stage's pipeline transfers run beside over a step (cached with the sweep's key).
  const std::vector<TransferTerm>& transfer_terms(const spec::Plan& plan, Lowering& l,
                                                  const Stages& stages, const MakespanKey& key);
  // Every stage's units for `micro_batches` micro-batches (the plan's, or PipeDream-2BW's
  // window of back-to-back batches).
  const std::shared_ptr<const spec::PipelineSweep::StageUnits>& stage_units(const spec::Plan& plan,
                                                                            int64_t micro_batches);
  double slowest_speed(int64_t world);

  const spec::ModelSpec* model_;
  const spec::ClusterSpec* cluster_;
  sim::OffloadCost offload_;  // the cluster's host prices (none without a host section)
  // The lowerings used last, most recent first: a few, because the planner hands each thread runs
  // of plans that share one, and holding every lowering of a search (~2 MB each for GPT-3 175B)
  // made the estimate phase fault in fresh pages for each.
  using LoweringKey = std::tuple<int64_t, int64_t, bool, int, int, int64_t, int, int, int, bool,
                                 bool, bool, bool, int, int64_t, bool, int64_t, int64_t, int64_t,
                                 int64_t, int, int64_t, int64_t, int64_t, int64_t, int64_t, double,
                                 double, bool, int, bool, int64_t, int64_t, std::string, bool, int>;
  static constexpr size_t kKeptLowerings = 4;
  std::vector<std::pair<LoweringKey, std::unique_ptr<Lowering>>> lowerings_;
  std::optional<sim::CollectiveModel> collectives_;
  std::map<spec::CollectiveKind, spec::CollectiveAlgorithm> collectives_overrides_;
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t>, double> collective_seconds_;
  std::map<
      std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>,
      Shapes>
      shapes_;
  std::map<std::tuple<int, int64_t, int64_t, int64_t>, std::vector<spec::LiveProfile>> profiles_;
  std::map<int64_t, double> slowest_speed_;
  // Per (schedule, pp, vpp, micro-batches): every stage's units, shared by its sweeps.
  std::map<std::tuple<int, int64_t, int64_t, int64_t>,
           std::shared_ptr<const spec::PipelineSweep::StageUnits>>
      stage_units_;
  // Per (schedule, pp, vpp, micro-batches, stage): the backward passes from the stage's first of
  // the last micro-batch on, as (local chunk, whether of the last micro-batch).
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t>,
           std::vector<std::pair<int64_t, bool>>>
      drain_passes_;
  MemoryKey last_memory_key_;  // cleared when a lowering is made (its stages' addresses reused)
  PeakMemory last_memory_;
};

}  // namespace sextant::planner
