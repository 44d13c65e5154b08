// Wires lowering, programs, network and engine together and turns the result into a Report.
#include "sextant/sim/simulator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <map>

#include "sextant/models/counts.hpp"
#include "sextant/sim/flow_network.hpp"
#include "sextant/sim/memory_model.hpp"
#include "sextant/sim/program_builder.hpp"
#include "sextant/sim/rank_symmetry.hpp"
#include "sextant/sim/step_setup.hpp"
#include "sextant/spec/build_info.hpp"
#include "sextant/spec/pipeline_schedule.hpp"
#include "sextant/spec/rank_layout.hpp"

namespace sextant::sim {

namespace {
constexpr std::array<std::pair<std::string_view, Fidelity>, 2> kFidelities{
    {{"analytic", Fidelity::kAnalytic}, {"flow", Fidelity::kFlow}}};
}  // namespace

spec::EnumNames<Fidelity> fidelity_names() {
  return kFidelities;
}

namespace {

Topology build_topology(const spec::Plan& plan, const spec::ClusterSpec& cluster, bool tied,
                        bool stationary_w) {
  spec::RankLayout layout(plan);
  const int64_t world = layout.world_size();
  Topology topo;
  topo.ranks.resize(static_cast<size_t>(world));
  // A group is its members, and `own` for a communicator of its own over the same ranks.
  std::map<std::pair<std::vector<int64_t>, bool>, int32_t> group_ids;
  auto group_id = [&](std::vector<int64_t> members, bool own = false) {
    auto it = group_ids.find({members, own});
    if (it != group_ids.end()) return it->second;
    int32_t id = static_cast<int32_t>(topo.groups.size());
    GroupSetup g;
    g.shape = group_shape(members, cluster.devices_per_node);
    g.members = members;
    topo.groups.push_back(std::move(g));
    group_ids.emplace(std::pair{std::move(members), own}, id);
    return id;
  };
  std::map<std::tuple<int64_t, int64_t, int>, int32_t> channel_ids;
  auto channel = [&](int64_t src, int64_t dst, PeerSlot slot) {
    auto key = std::make_tuple(src, dst, static_cast<int>(slot));
    auto it = channel_ids.find(key);
    if (it != channel_ids.end()) return it->second;
    int32_t id = static_cast<int32_t>(topo.channels.size());
    topo.channels.push_back({src, dst, slot == PeerSlot::kPrevUp || slot == PeerSlot::kNextUp});
    channel_ids.emplace(key, id);
    return id;
  };
  for (int64_t r = 0; r < world; ++r) {
    RankSetup& s = topo.ranks[static_cast<size_t>(r)];
    // Under SUPER's branch split each tp rank runs its own branches: a program of its own.
    s.program = static_cast<int32_t>(plan.branch_parallel
                                         ? layout.coord(r).pp * plan.tp + layout.coord(r).tp
                                         : layout.coord(r).pp);
    s.groups[static_cast<size_t>(GroupSlot::kTp)] = group_id(layout.layer_group(r));
    s.groups[static_cast<size_t>(GroupSlot::kDp)] = group_id(layout.replica_group(r));
    if (!plan.per_op.empty())
      s.groups[static_cast<size_t>(GroupSlot::kDpLayer)] = group_id(layout.replica_group(r), true);
    if (plan.cp > 1) s.groups[static_cast<size_t>(GroupSlot::kCp)] = group_id(layout.cp_group(r));
    if (plan.spatial.any())
      s.groups[static_cast<size_t>(GroupSlot::kSpatial)] = group_id(layout.spatial_group(r));
    if (plan.tp_grid.any()) {
      s.groups[static_cast<size_t>(GroupSlot::kGridX)] = group_id(layout.grid_group(r, 0));
      s.groups[static_cast<size_t>(GroupSlot::kGridY)] = group_id(layout.grid_group(r, 1));
      s.groups[static_cast<size_t>(GroupSlot::kGridZ)] = group_id(layout.grid_group(r, 2));
    }
    if (stationary_w) {
      s.groups[static_cast<size_t>(GroupSlot::kFilterReduce)] =
          group_id(layout.channel_filter_group(r, 0));
      s.groups[static_cast<size_t>(GroupSlot::kChannelGather)] =
          group_id(layout.channel_filter_group(r, 1));
    }
    if (plan.ep > 1) {
      s.groups[static_cast<size_t>(GroupSlot::kEp)] = group_id(layout.ep_group(r));
      s.groups[static_cast<size_t>(GroupSlot::kExpertDp)] =
          group_id(layout.expert_replica_group(r));
    }
    const spec::RankCoord c = layout.coord(r);
    if (tied && plan.pp > 1 && (c.pp == 0 || c.pp == plan.pp - 1)) {
      spec::RankCoord first = c, last = c;
      first.pp = 0;
      last.pp = plan.pp - 1;
      s.groups[static_cast<size_t>(GroupSlot::kEmbedding)] =
          group_id({layout.rank(first), layout.rank(last)});
    }
    s.speed = cluster.speed_factor(r);
    if (plan.pp > 1) {
      int64_t next = layout.pp_next(r);
      int64_t prev = layout.pp_prev(r);
      s.send_channel[static_cast<size_t>(PeerSlot::kNext)] = channel(r, next, PeerSlot::kNext);
      s.send_channel[static_cast<size_t>(PeerSlot::kPrev)] = channel(r, prev, PeerSlot::kPrev);
      // What the previous stage sends "next" arrives here as "from prev", and vice versa.
      s.recv_channel[static_cast<size_t>(PeerSlot::kPrev)] = channel(prev, r, PeerSlot::kNext);
      s.recv_channel[static_cast<size_t>(PeerSlot::kNext)] = channel(next, r, PeerSlot::kPrev);
      if (plan.schedule == spec::Schedule::kGems) {  // the second replica's own channels
        s.send_channel[static_cast<size_t>(PeerSlot::kNextUp)] =
            channel(r, next, PeerSlot::kNextUp);
        s.send_channel[static_cast<size_t>(PeerSlot::kPrevUp)] =
            channel(r, prev, PeerSlot::kPrevUp);
        s.recv_channel[static_cast<size_t>(PeerSlot::kPrevUp)] =
            channel(prev, r, PeerSlot::kNextUp);
        s.recv_channel[static_cast<size_t>(PeerSlot::kNextUp)] =
            channel(next, r, PeerSlot::kPrevUp);
      }
    }
  }
  return topo;
}

spec::Trace build_trace(const EngineResult& result, const std::vector<Program>& programs,
                        const std::vector<RankSetup>& ranks, const std::vector<GroupSetup>& groups,
                        spec::Dtype dtype) {
  spec::Trace trace;
  trace.kind = "predicted";
  std::vector<TaskRecord> records = result.records;
  std::sort(records.begin(), records.end(), [](const TaskRecord& a, const TaskRecord& b) {
    return std::tie(a.rank, a.start, a.task) < std::tie(b.rank, b.start, b.task);
  });
  for (const TaskRecord& rec : records) {
    const RankSetup& setup = ranks[static_cast<size_t>(rec.rank)];
    const Program& p = programs[static_cast<size_t>(setup.program)];
    const Task& task = p.tasks[static_cast<size_t>(rec.task)];
    auto base = [&](const OpInfo& op) {
      spec::TraceEvent e;
      e.name = op.name;
      e.op_class = op.op_class;
      e.rank = rec.rank;
      e.stream = task.stream;
      e.phase = task.phase;
      if (op.layer >= 0) e.layer = op.layer;
      if (task.micro_batch >= 0) e.micro_batch = task.micro_batch;
      e.flops = op.flops;
      e.bytes = op.bytes;
      e.shape = op.shape;
      e.dtype = dtype;
      return e;
    };
    if (task.kind == TaskKind::kCompute) {
      // Spread the task's span but for its wait for the host over its ops in proportion to their
      // modelled times; the wait goes before the ops whose kernels the host was issuing, in
      // proportion to their kernels.
      Picoseconds t = rec.start;
      const Picoseconds span = rec.end - rec.start - rec.host_wait;
      int64_t kernels = 0;
      for (int32_t i = task.op_begin; i < task.op_end; ++i)
        kernels += p.ops[static_cast<size_t>(p.task_ops[static_cast<size_t>(i)])].kernels;
      for (int32_t i = task.op_begin; i < task.op_end; ++i) {
        const OpInfo& op = p.ops[static_cast<size_t>(p.task_ops[static_cast<size_t>(i)])];
        spec::TraceEvent e = base(op);
        if (kernels > 0) {
          t += static_cast<Picoseconds>(static_cast<double>(rec.host_wait) * op.kernels /
                                        static_cast<double>(kernels));
        }
        Picoseconds d = task.duration > 0
                            ? static_cast<Picoseconds>(static_cast<double>(op.duration) *
                                                       static_cast<double>(span) /
                                                       static_cast<double>(task.duration))
                            : 0;
        if (i + 1 == task.op_end) d = std::max<Picoseconds>(0, rec.end - t);
        e.start_ps = t;
        e.duration_ps = d;
        t += d;
        trace.events.push_back(std::move(e));
      }
    } else {
      const OpInfo& op = p.ops[static_cast<size_t>(task.op_begin)];
      spec::TraceEvent e = base(op);
      e.start_ps = rec.start;
      e.duration_ps = rec.end - rec.start;
      e.algorithm = std::string(rec.algorithm);
      if (task.kind == TaskKind::kCollective) {
        e.group_size = static_cast<int64_t>(
            groups[static_cast<size_t>(setup.groups[task.slot])].members.size());
      } else if (task.kind != TaskKind::kLocal) {
        e.group_size = 2;
      }
      trace.events.push_back(std::move(e));
    }
  }
  return trace;
}

// What each of the `added` batches after the first of a back-to-back window added to a rank's
// finish and to each part of its breakdown (an asynchronous pipeline's steady state); a part the
// later batches hid is 0.
RankTimes steady_state(const RankTimes& two, const RankTimes& one, int64_t batches_added) {
  auto added = [&](Picoseconds a, Picoseconds b) {
    return std::max<Picoseconds>(0, a - b) / batches_added;
  };
  RankTimes t;
  t.finish = added(two.finish, one.finish);
  t.compute = added(two.compute, one.compute);
  t.optimizer = added(two.optimizer, one.optimizer);
  t.tp = added(two.tp, one.tp);
  t.dp = added(two.dp, one.dp);
  t.fsdp = added(two.fsdp, one.fsdp);
  t.pp = added(two.pp, one.pp);
  t.bubble = added(two.bubble, one.bubble);
  t.offload = added(two.offload, one.offload);
  t.spatial = added(two.spatial, one.spatial);
  t.cp = added(two.cp, one.cp);
  t.ep = added(two.ep, one.ep);
  t.host = added(two.host, one.host);
  return t;
}

}  // namespace

SimulationResult simulate(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                          const spec::Plan& asked, const SimulationOptions& options) {
  auto wall_start = std::chrono::steady_clock::now();
  const int64_t world = asked.world_size();
  spec::validate_plan(asked, model, world, options.plan_source);
  if (world > cluster.total_devices()) {
    throw InputError(
        options.plan_source, "/dp", asked.name(),
        fmt::format("needs {} devices; cluster {} has {} ({} nodes x {})", world, cluster.name,
                    cluster.total_devices(), cluster.nodes, cluster.devices_per_node));
  }
  const spec::Stack asked_stack =
      spec::plan_stack(asked, cluster.device.kind == spec::DeviceKind::kGpu, model.kind());
  // Priced as the stack runs it (spec::as_run); reported as asked.
  const spec::PlanAsRun ran = spec::as_run(asked, asked_stack);
  const spec::Plan& plan = ran.plan;
  const spec::Stack& given = ran.stack;
  const StepSetup setup = step_setup(model, cluster, plan, given);
  const spec::Dtype dtype = setup.dtype;
  const int64_t seq = model.is_transformer() ? setup.seq_len : 1;
  models::LoweredModel lowered = models::lower(model, setup.lowering);
  // SUPER's tp ranks each lower their own branches (LoweringOptions::branch_rank); `lowered`
  // holds each module's most loaded rank's.
  std::vector<models::LoweredModel> rank_lowered;
  if (plan.branch_parallel)
    for (int64_t r = 0; r < plan.tp; ++r) {
      models::LoweringOptions o = setup.lowering;
      o.branch_rank = r;
      rank_lowered.push_back(models::lower(model, o));
    }
  ComputeModel compute = make_compute_model(cluster, setup, lowered);
  CollectiveModel collectives(cluster, plan.collective_algorithms);

  const OffloadCost offload(cluster, plan, options.plan_source);
  auto build = [&](int64_t batches) {
    std::vector<Program> programs;
    for (int64_t s = 0; s < plan.pp; ++s) {
      if (rank_lowered.empty()) {
        programs.push_back(
            build_stage_program(plan, setup.stack, lowered, compute, s, &offload, batches));
        continue;
      }
      for (const models::LoweredModel& own : rank_lowered)  // program pp x tp + tp rank
        programs.push_back(
            build_stage_program(plan, setup.stack, own, compute, s, &offload, batches));
    }
    return programs;
  };
  const std::vector<Program> programs = build(1);
  Topology topo =
      build_topology(plan, cluster, lowered.tied_table_params > 0, lowered.stationary_w);

  auto traced = [&](int64_t rank) {
    return options.trace_ranks.empty() ||
           std::binary_search(options.trace_ranks.begin(), options.trace_ranks.end(), rank);
  };
  int64_t simulated_ranks = world;
  auto run = [&](const std::vector<Program>& stage_programs, bool trace) {
    EngineResult result;
    if (options.fidelity == Fidelity::kFlow) {
      FlowNetwork network(cluster, collectives, topo.groups, topo.channels);
      result = run_engine(stage_programs, topo.ranks, topo.groups, topo.channels, network, trace,
                          cluster.device.overlap_slowdown, cluster.device.compute_jitter,
                          options.progress);
    } else if (!options.fold_symmetric_ranks) {
      AnalyticNetwork network(cluster, collectives, topo.groups, topo.channels);
      result = run_engine(stage_programs, topo.ranks, topo.groups, topo.channels, network, trace,
                          cluster.device.overlap_slowdown, cluster.device.compute_jitter,
                          options.progress);
    } else {
      // Each class of symmetric ranks simulated once (rank_symmetry.hpp), then copied back.
      const FoldedTopology folded = fold_symmetric_ranks(topo, cluster);
      AnalyticNetwork network(cluster, collectives, folded.network_groups, folded.network_channels);
      EngineResult classes =
          run_engine(stage_programs, folded.engine.ranks, folded.engine.groups,
                     folded.engine.channels, network, trace, cluster.device.overlap_slowdown,
                     cluster.device.compute_jitter, options.progress);
      result.events = classes.events;
      result.ranks.reserve(static_cast<size_t>(world));
      for (int64_t r = 0; r < world; ++r)
        result.ranks.push_back(
            classes.ranks[static_cast<size_t>(folded.class_of[static_cast<size_t>(r)])]);
      for (const TaskRecord& rec : classes.records) {
        for (int64_t r : folded.class_ranks[static_cast<size_t>(rec.rank)]) {
          if (!traced(r)) continue;
          TaskRecord copy = rec;
          copy.rank = static_cast<int32_t>(r);
          result.records.push_back(copy);
        }
      }
      simulated_ranks = static_cast<int64_t>(folded.class_ranks.size());
    }
    return result;
  };
  EngineResult result = run(programs, options.trace);
  if (const int64_t batches = spec::asynchronous_window(plan); batches > 1) {
    // PipeDream(-2BW) has no flush, stale parameter-server workers do not wait for the last
    // update: a batch in steady state costs what each batch of a window run back to back adds
    // (spec::asynchronous_window), its fill and drain paid once in both runs.
    // The trace keeps the one batch, the step the executor's one-step trace holds.
    const EngineResult window = run(build(batches), false);
    result.events += window.events;
    for (size_t r = 0; r < result.ranks.size(); ++r)
      result.ranks[r] = steady_state(window.ranks[r], result.ranks[r], batches - 1);
  }
  if (!options.trace_ranks.empty())
    std::erase_if(result.records, [&](const TaskRecord& rec) { return !traced(rec.rank); });

  SimulationResult out;
  size_t critical = 0;
  for (size_t r = 0; r < result.ranks.size(); ++r)
    if (result.ranks[r].finish > result.ranks[critical].finish) critical = r;
  out.critical_rank = static_cast<int64_t>(critical);
  const RankTimes& ct = result.ranks[critical];

  spec::Report& rep = out.report;
  rep.model = model.name;
  rep.cluster = cluster.name;
  rep.plan = asked.name();
  rep.gpus = world;
  rep.network = std::string(spec::enum_name(fidelity_names(), options.fidelity));
  rep.stack = spec::stack_label(asked_stack);
  rep.step_time_s = ps_to_seconds(ct.finish);
  const double step = rep.step_time_s;
  const double samples = static_cast<double>(plan.global_batch);
  rep.samples_per_s = samples / step;
  rep.tokens_per_s = samples * static_cast<double>(model.is_transformer() ? seq : 1) / step;
  models::StepFlops flops = models::step_flops(model, plan, model.is_transformer() ? seq : 0);
  const double gpus = static_cast<double>(world);
  rep.model_tflops_per_gpu = flops.model / (step * gpus) / kFlopsPerTflop;
  rep.hardware_tflops_per_gpu = flops.hardware / (step * gpus) / kFlopsPerTflop;
  rep.mfu = flops.model / (step * gpus * compute.peak_flops());
  rep.hfu = flops.hardware / (step * gpus * compute.peak_flops());
  rep.breakdown_s.compute = ps_to_seconds(ct.compute);
  rep.breakdown_s.optimizer = ps_to_seconds(ct.optimizer);
  rep.breakdown_s.tp_comm_exposed = ps_to_seconds(ct.tp);
  rep.breakdown_s.dp_comm_exposed = ps_to_seconds(ct.dp);
  rep.breakdown_s.fsdp_comm_exposed = ps_to_seconds(ct.fsdp);
  rep.breakdown_s.spatial_comm_exposed = ps_to_seconds(ct.spatial);
  rep.breakdown_s.cp_comm_exposed = ps_to_seconds(ct.cp);
  rep.breakdown_s.ep_comm_exposed = ps_to_seconds(ct.ep);
  rep.breakdown_s.pp_comm_exposed = ps_to_seconds(ct.pp);
  rep.breakdown_s.bubble = ps_to_seconds(ct.bubble);
  rep.breakdown_s.offload_exposed = ps_to_seconds(ct.offload);
  rep.breakdown_s.host_bound = ps_to_seconds(ct.host);

  // Memory: the most loaded stage (and under SUPER's split, tp rank).
  spec::MemoryBreakdown worst;
  int64_t worst_stage = 0;
  const models::LoweredModel* worst_lowered = &lowered;
  std::vector<const models::LoweredModel*> held{&lowered};
  if (!rank_lowered.empty()) {
    held.clear();
    for (const models::LoweredModel& own : rank_lowered) held.push_back(&own);
  }
  for (int64_t s = 0; s < plan.pp; ++s)
    for (const models::LoweredModel* rank : held) {
      spec::MemoryBreakdown m = stage_memory(plan, setup.stack, *rank, s, &cluster);
      if ((s == 0 && rank == held.front()) || m.peak_bytes > worst.peak_bytes) {
        worst = m;
        worst_stage = s;
        worst_lowered = rank;
      }
    }
  if (options.explain_memory)
    worst = stage_memory(plan, setup.stack, *worst_lowered, worst_stage, &cluster, nullptr, true);
  rep.memory = worst;
  rep.events = result.events;
  rep.simulated_ranks = simulated_ranks;

  if (options.trace) {
    out.trace = build_trace(result, programs, topo.ranks, topo.groups, dtype);
    out.trace->metadata = {{"model", model.name},
                           {"cluster", cluster.name},
                           {"plan", asked.name()},
                           {"plan_json", spec::to_json(asked)},
                           {"stack", spec::to_json(setup.stack)},
                           {"network", rep.network},
                           {"step_time_s", rep.step_time_s},
                           {"commit", spec::git_commit()}};
  }
  out.ranks = std::move(result.ranks);
  rep.sim_wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return out;
}

}  // namespace sextant::sim
