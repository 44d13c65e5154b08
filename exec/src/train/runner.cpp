// Layout communicators, trace merging, logs and the failure policy.
#include "sextant/exec/runner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "comm/mpi_communicator.hpp"
#include "sextant/exec/cpu_backend.hpp"
#include "sextant/exec/host_allocator.hpp"
#include "sextant/models/counts.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/spec/build_info.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/limits.hpp"
#include "sextant/spec/rank_layout.hpp"
#include "sextant/spec/stack.hpp"
#include "sextant/spec/stack_support.hpp"
#include "sextant/spec/step_times.hpp"
#include "sextant/spec/tensor_grid.hpp"

namespace sextant::exec {

namespace {

MPI_Comm split(MPI_Comm parent, int color, int key) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(parent, color, key, &comm));
  return comm;
}

}  // namespace

namespace {

// The MPI group of `members` (world ranks, in group order) that `rank` belongs to: the colour is
// the group's first member, the key the rank's place in it. Every rank of the world calls it
// (MPI_Comm_split is collective); a rank outside every such group passes an empty list.
MPI_Comm split_group(MPI_Comm world, int64_t rank, const std::vector<int64_t>& members) {
  if (members.empty()) return split(world, MPI_UNDEFINED, 0);
  const auto at = std::find(members.begin(), members.end(), rank);
  return split(world, static_cast<int>(members.front()),
               static_cast<int>(std::distance(members.begin(), at)));
}

int64_t index_in(const std::vector<int64_t>& members, int64_t rank) {
  return std::distance(members.begin(), std::find(members.begin(), members.end(), rank));
}

}  // namespace

Layout::Layout(MPI_Comm world, const spec::Plan& plan, CommKind kind, bool stationary_w) {
  MPI_Comm own = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(world, &own));
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  // The groups are the shared rank layout's (spec::RankLayout, the simulator's too).
  const spec::RankLayout layout(plan);
  const spec::RankCoord c = layout.coord(rank);
  // The layer group: the tp group, or a 3D tensor grid's z slice (Groups::tp).
  const std::vector<int64_t> tp_members =
      plan.tp_grid.any() ? layout.layer_group(rank) : layout.tp_group(rank);
  const std::vector<int64_t> replica_members = layout.replica_group(rank);
  const std::vector<int64_t> spatial_members = layout.spatial_group(rank);
  const std::vector<int64_t> cp_members = layout.cp_group(rank);
  // Every split first, then the communicators (NCCL's are created collectively, group by group).
  MPI_Comm tp_comm = split_group(world, rank, tp_members);
  MPI_Comm replica_comm = split_group(world, rank, replica_members);
  MPI_Comm spatial_comm =
      plan.spatial.any() ? split_group(world, rank, spatial_members) : MPI_COMM_NULL;
  MPI_Comm cp_comm = plan.cp > 1 ? split_group(world, rank, cp_members) : MPI_COMM_NULL;
  const std::vector<int64_t> ep_members = layout.ep_group(rank);
  const std::vector<int64_t> expert_members = layout.expert_replica_group(rank);
  MPI_Comm ep_comm = plan.ep > 1 ? split_group(world, rank, ep_members) : MPI_COMM_NULL;
  MPI_Comm expert_comm = plan.ep > 1 ? split_group(world, rank, expert_members) : MPI_COMM_NULL;
  std::array<std::vector<int64_t>, 3> grid_members;
  std::array<MPI_Comm, 3> grid_comms{MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL};
  if (plan.tp_grid.any()) {
    for (int axis = 0; axis < 3; ++axis) {
      grid_members[static_cast<size_t>(axis)] = layout.grid_group(rank, axis);
      grid_comms[static_cast<size_t>(axis)] =
          split_group(world, rank, grid_members[static_cast<size_t>(axis)]);
    }
  }
  std::array<std::vector<int64_t>, 2> channel_filter_members;
  std::array<MPI_Comm, 2> channel_filter_comms{MPI_COMM_NULL, MPI_COMM_NULL};
  if (stationary_w) {
    for (int axis = 0; axis < 2; ++axis) {
      channel_filter_members[static_cast<size_t>(axis)] = layout.channel_filter_group(rank, axis);
      channel_filter_comms[static_cast<size_t>(axis)] =
          split_group(world, rank, channel_filter_members[static_cast<size_t>(axis)]);
    }
  }
  world_ = make_communicator(kind, own, "world", plan.collective_algorithms);
  tp_ = make_communicator(kind, tp_comm, "tp", plan.collective_algorithms);
  replicas_ = make_communicator(kind, replica_comm, "dp", plan.collective_algorithms);
  if (spatial_comm != MPI_COMM_NULL) {
    spatial_ = make_communicator(kind, spatial_comm, "spatial", plan.collective_algorithms);
    groups_.spatial = spatial_.get();
  }
  if (cp_comm != MPI_COMM_NULL) {
    cp_ = make_communicator(kind, cp_comm, "cp", plan.collective_algorithms);
    groups_.cp = cp_.get();
  }
  if (ep_comm != MPI_COMM_NULL) {
    ep_ = make_communicator(kind, ep_comm, "ep", plan.collective_algorithms);
    expert_replicas_ =
        make_communicator(kind, expert_comm, "expert_dp", plan.collective_algorithms);
    groups_.ep = ep_.get();
    groups_.expert_replicas = expert_replicas_.get();
    groups_.ep_rank = index_in(ep_members, rank);
    groups_.ep_size = plan.ep;
    groups_.expert_replica_rank = index_in(expert_members, rank);
    groups_.expert_replica_size = static_cast<int64_t>(expert_members.size());
  }
  constexpr std::array<const char*, 3> kGridNames{"grid_x", "grid_y", "grid_z"};
  for (size_t axis = 0; axis < 3; ++axis) {
    if (grid_comms[axis] == MPI_COMM_NULL) continue;
    grid_[axis] =
        make_communicator(kind, grid_comms[axis], kGridNames[axis], plan.collective_algorithms);
    groups_.grid[axis] = {grid_[axis].get(), index_in(grid_members[axis], rank),
                          static_cast<int64_t>(grid_members[axis].size())};
  }
  constexpr std::array<const char*, 2> kChannelFilterNames{"filter_reduce", "channel_gather"};
  for (size_t axis = 0; axis < 2; ++axis) {
    if (channel_filter_comms[axis] == MPI_COMM_NULL) continue;
    channel_filter_[axis] = make_communicator(
        kind, channel_filter_comms[axis], kChannelFilterNames[axis], plan.collective_algorithms);
    groups_.channel_filter[axis] = {channel_filter_[axis].get(),
                                    index_in(channel_filter_members[axis], rank),
                                    static_cast<int64_t>(channel_filter_members[axis].size())};
  }
  groups_.world = world_.get();
  groups_.tp = tp_.get();
  groups_.replicas = replicas_.get();
  groups_.tp_rank = index_in(tp_members, rank);
  groups_.tp_size = static_cast<int64_t>(tp_members.size());
  groups_.dp_rank = c.dp;
  groups_.dp_size = plan.dp;
  groups_.spatial_rank = c.spatial;
  groups_.spatial_size = plan.spatial.ranks();
  groups_.cp_rank = c.cp;
  groups_.cp_size = plan.cp;
  groups_.replica_rank = index_in(replica_members, rank);
  groups_.replica_size = static_cast<int64_t>(replica_members.size());
  groups_.pp_rank = c.pp;
  groups_.pp_size = plan.pp;
  if (plan.pp > 1) {  // a ring: the interleaved schedule passes from the last stage to the first
    groups_.next = static_cast<int>(layout.pp_next(rank));
    groups_.prev = static_cast<int>(layout.pp_prev(rank));
  }
  // Tied embeddings on the first and the last stage: a group of the two.
  std::vector<int64_t> ends;
  if (plan.pp > 1 && (c.pp == 0 || c.pp == plan.pp - 1)) {
    spec::RankCoord first = c, last = c;
    first.pp = 0;
    last.pp = plan.pp - 1;
    ends = {layout.rank(first), layout.rank(last)};
  }
  MPI_Comm emb = split_group(world, rank, ends);
  if (emb != MPI_COMM_NULL) {
    embedding_ = make_communicator(kind, emb, "embedding", plan.collective_algorithms);
    groups_.embedding = embedding_.get();
  }
}

namespace {

bool ties_embeddings(const spec::ModelSpec& m) {
  return m.is_transformer() && m.transformer().tied_embeddings;
}

spec::Json events_json(const std::vector<spec::TraceEvent>& events) {
  spec::Trace t;
  t.events = events;
  spec::Json j = spec::Json::parse(spec::trace_to_chrome_json(t));
  spec::Json out = spec::Json::array();
  for (const spec::Json& e : j.at("traceEvents"))
    if (e.at("ph") == "X") out.push_back(e);
  return out;
}

// Before allocating anything: the fp32 parameters, gradients and Adam moments a CPU rank holds at
// the least (its pipeline stage's share of its tensor-parallel shard; the moments sharded over dp
// under ZeRO) against the host memory available; every rank of a node shares it. A model too big
// for the host died with a bare std::bad_alloc.
void check_host_memory(const Job& job, const models::LoweredModel& lowered, const Backend& backend,
                       MPI_Comm world) {
  if (backend.kind() != spec::ExecutorBackend::kCpu) return;
  int64_t per_tp_rank = 0;
  for (const models::Layer& l : lowered.layers) per_tp_rank += l.params;
  const double params = static_cast<double>(per_tp_rank) / static_cast<double>(job.plan.pp);
  const double moments = job.plan.zero >= 1 ? 8.0 / static_cast<double>(job.plan.dp) : 8.0;
  const double per_rank = params * (4 + 4 + moments);
  const int64_t available = spec::available_memory_bytes();
  // The ranks sharing this node's memory (MPI's own notion, under mpirun or srun alike).
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int ranks_here = 1;
  MPI_CHECK(MPI_Comm_size(node, &ranks_here));
  MPI_CHECK(MPI_Comm_free(&node));
  const double needed = per_rank * ranks_here;
  // Every rank learns whether any node is short, so that all end together.
  int short_here = available > 0 && needed > static_cast<double>(available) ? 1 : 0, short_any = 0;
  MPI_CHECK(MPI_Allreduce(&short_here, &short_any, 1, MPI_INT, MPI_MAX, world));
  if (short_any != 0) {
    throw InputError(
        "plan", "", job.plan.name(),
        fmt::format("needs at least {:.1f} GiB of host memory for parameters, gradients and "
                    "optimizer state ({} rank(s) on this node), {:.1f} GiB are available",
                    needed / (1 << 30), ranks_here, static_cast<double>(available) / (1 << 30)));
  }
}

// Rank 0's string on every rank of `world`.
std::string broadcast_from_root(const std::string& mine, MPI_Comm world) {
  int64_t n = static_cast<int64_t>(mine.size());
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT64_T, 0, world));
  std::string out = mine;
  out.resize(static_cast<size_t>(n));
  if (n > 0) MPI_CHECK(MPI_Bcast(out.data(), static_cast<int>(n), MPI_CHAR, 0, world));
  return out;
}

// The model as the executor trains it: without dropout, which it does not implement (a dropout
// mask would have to be the same for a token under every layout). The trace records this model,
// so `compare` against a prediction of the model with dropout shows the dropout ops as one-sided.
spec::ModelSpec as_executed(const spec::ModelSpec& model, bool say) {
  if (!model.is_transformer() || !model.transformer().dropout) return model;
  if (say)
    fmt::print(stderr,
               "note: {} has dropout; the executor trains it without dropout (the trace records "
               "the model as run)\n",
               model.name);
  spec::ModelSpec out = model;
  std::get<spec::TransformerSpec>(out.body).dropout = false;
  return out;
}

}  // namespace

namespace {

// What is about to run, in one line: a log read later says what produced it.
void print_run_header(const Job& job, const spec::ModelSpec& model, int ranks,
                      const Backend& backend, int64_t seq) {
  fmt::print("run {} {} on {} rank{} ({} {}, {}, stack {}): {} steps of {}{}\n", model.name,
             job.plan.name(), ranks, ranks == 1 ? "" : "s", backend.name(),
             precision_name(backend.precision()), comm_kind_name(job.comm),
             spec::executor_stack(job.plan).preset, job.train.steps, job.plan.global_batch,
             model.is_transformer() ? fmt::format(" x {} tokens", seq) : " samples");
}

// The run in one line: the mean step after the warm-up (spec::mean_step_after_warmup), the
// throughput and, where the device's peak is known, the model FLOPs utilisation
// (models::step_flops, as the simulator's); then the plan file's prediction against it.
void print_run_summary(const Job& job, const spec::ModelSpec& model, int ranks, int64_t seq,
                       const std::vector<StepLog>& steps) {
  std::vector<double> times;
  for (const StepLog& s : steps) times.push_back(s.step_time_s);
  const std::optional<double> mean = spec::mean_step_after_warmup(times);
  if (!mean || !(*mean > 0)) return;
  const double items = static_cast<double>(job.plan.global_batch) *
                       static_cast<double>(model.is_transformer() ? seq : 1);
  const models::StepFlops flops =
      models::step_flops(model, job.plan, model.is_transformer() ? seq : 0);
  const double per_rank = flops.model / (*mean * ranks);
  std::string mfu;
  if (job.peak_flops > 0)
    mfu = fmt::format(", MFU {:.1f}% ({})", 100 * per_rank / job.peak_flops, job.peak_source);
  const auto seconds = [](double t) {
    return t < 1 ? fmt::format("{:.2f} ms", 1e3 * t) : fmt::format("{:.3f} s", t);
  };
  const size_t dropped = times.size() - spec::steps_after_warmup(times).size();
  const std::string warm_up = dropped == 0   ? ""
                              : dropped == 1 ? " (after the first)"
                                             : fmt::format(" (after the first {})", dropped);
  fmt::print("mean step {}{}, {:.0f} {}/s, {:.3g} TFLOP/s/rank{}\n", seconds(*mean), warm_up,
             items / *mean, model.is_transformer() ? "tokens" : "samples",
             per_rank / kFlopsPerTflop, mfu);
  // The plan's own prediction held against the run: how far the model was off on this machine.
  if (job.predicted_step_s > 0) {
    const double off = *mean / job.predicted_step_s - 1;
    fmt::print("predicted {} on {} (the plan file): the mean step is {:.1f}% {}\n",
               seconds(job.predicted_step_s), job.predicted_on, 100 * std::abs(off),
               off >= 0 ? "slower" : "faster");
  }
}

}  // namespace

spec::ExecutorRun executor_run_of(const Job& job) {
  spec::ExecutorRun run;
  run.backend = job.backend;
  run.precision = job.precision.value_or(spec::default_precision(job.backend));
  run.synthetic_data = job.train.data == "synthetic";
  run.clipping = job.train.clip > 0;
  run.checkpoints = !job.train.checkpoint_dir.empty() || job.train.resume;
  return run;
}

void check_job(const Job& job, int64_t ranks) {
  const std::string source = job.plan_source.empty() ? "plan " + job.plan.name() : job.plan_source;
  spec::validate_plan(job.plan, job.model, ranks, source);
  const spec::ExecutorRun run = executor_run_of(job);
  // The stack names the software a plan is for; a plan that software cannot run is refused here
  // too, though the executor runs it (it would predict one thing and run another).
  spec::check_stack_runs(job.plan, job.model, spec::executor_stack(job.plan),
                         spec::compute_dtype(run.precision), source);
  spec::check_executor_runs(job.model, job.plan, run);
}

TrainResult run_job(const Job& job, MPI_Comm world, Backend& backend) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  MPI_CHECK(MPI_Comm_size(world, &size));
  const spec::ModelSpec model = as_executed(job.model, rank == 0 && !job.quiet);
  const int64_t seq =
      model.is_transformer() ? job.plan.seq_len.value_or(model.transformer().seq_len) : 0;
  // The bytes each traced op reports are those of the activation type the backend stores.
  const spec::Dtype dtype =
      backend.activation_dtype() == DType::kBF16 ? spec::Dtype::kBf16 : spec::Dtype::kFp32;
  // The vocabulary padded as the executor's own stack says (stacks/sextant.json: 128 x tp rows,
  // Megatron-LM's default), whatever the plan's stack: the executor runs its own kernels.
  models::LoweringOptions lowering{job.plan.micro_batch, seq, dtype, job.plan.tp,
                                   job.plan.sequence_parallel};
  lowering.vocab_multiple = spec::builtin_stack(spec::kExecutorStack).vocab_multiple;
  lowering.spatial = job.plan.spatial;  // a CNN rank's ops work on its block of each map
  lowering.cp = job.plan.cp;            // a context-parallel rank's, on its chunks of each sequence
  lowering.cp_algorithm = job.plan.cp_algorithm;
  // A fused kernel (and ring attention's steps) keeps no probabilities, traced as attn.core.
  lowering.attention = spec::executed_attention(job.plan);
  lowering.ep = job.plan.ep;            // a rank's experts, and their dispatch and combine
  lowering.tp_grid = job.plan.tp_grid;  // a 3D tensor grid's blocks (exec/src/gpt/grid_linear.hpp)
  lowering.channel_algorithms = job.plan.channel_algorithms;  // each convolution's, as chosen
  lowering.dp = job.plan.dp;  // per-op splits: the blocks' ops on the dp x tp mesh
  lowering.per_op = job.plan.per_op;
  lowering.branch_parallel = job.plan.branch_parallel;  // SUPER: this tp rank's branches
  if (job.plan.branch_parallel) lowering.branch_rank = spec::RankLayout(job.plan).coord(rank).tp;
  models::LoweredModel lowered = models::lower(model, lowering);
  check_host_memory(job, lowered, backend, world);
  Layout layout(world, job.plan, job.comm, lowered.stationary_w);
  if (!ties_embeddings(model)) layout.groups().embedding = nullptr;
  Recorder recorder(rank, !job.trace_file.empty(), &backend);
  Context ctx;
  ctx.backend = &backend;
  ctx.groups = &layout.groups();
  ctx.recorder = &recorder;
  ctx.plan = &job.plan;
  ctx.lowered = &lowered;
  ctx.sequence_parallel = job.plan.sequence_parallel && job.plan.tp > 1;
  layout.groups().world->barrier();
  recorder.start_epoch();

  // Rank 0 writes the step log and the trace: it checks both paths before the first step, and
  // every rank learns the verdict, so that a path rank 0 cannot write ends every rank with the same
  // error instead of leaving the others waiting at their first collective.
  std::unique_ptr<std::ofstream> log;
  std::string output_problem;  // "flag\npath\nwhat": rank 0's first unwritable output
  if (rank == 0) {
    if (!job.log_json.empty()) {
      log = std::make_unique<std::ofstream>(job.log_json);
      if (!*log)
        output_problem = fmt::format("--log-json\n{}\ncannot open for writing", job.log_json);
    }
    if (output_problem.empty() && !job.trace_file.empty())
      if (std::string why = spec::unwritable_reason(job.trace_file); !why.empty())
        output_problem = fmt::format("--trace\n{}\n{}", job.trace_file, why);
  }
  output_problem = broadcast_from_root(output_problem, world);
  if (!output_problem.empty()) {
    const size_t a = output_problem.find('\n'), b = output_problem.find('\n', a + 1);
    throw InputError(output_problem.substr(0, a), "", output_problem.substr(a + 1, b - a - 1),
                     output_problem.substr(b + 1));
  }
  if (rank == 0 && !job.quiet) print_run_header(job, model, size, backend, seq);
  auto on_step = [&](const StepLog& s) {
    if (rank != 0) return;
    if (!job.quiet)
      fmt::print("step {:>4}  loss {:.6f}  step {:.3f} s  {:.{}f} {}/s  grad norm {:.3f}\n", s.step,
                 s.loss, s.step_time_s, s.tokens_per_s, model.is_transformer() ? 0 : 2,
                 model.is_transformer() ? "tokens" : "samples", s.grad_norm);
    if (log) {
      *log << spec::Json{{"step", s.step},
                         {"loss", s.loss},
                         {"step_time_s", s.step_time_s},
                         {"tokens_per_s", s.tokens_per_s},
                         {"grad_norm", s.grad_norm}}
                  .dump()
           << "\n";
      log->flush();
      // A full disk or a closed pipe: the log would be lost without a word (the check before
      // the first step only saw that the file opens).
      if (!*log) throw std::runtime_error(fmt::format("--log-json {}: write failed", job.log_json));
    }
    std::fflush(stdout);
  };
  TrainResult result;
  try {
    // Training only: what follows (the trace's gather) is short and bounded by the ranks' data.
    const Watchdog watchdog(world, job.watchdog);
    result = train(model, ctx, job.train, on_step);
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).find("the loss is") != std::string::npos)
      throw TrainingDiverged(e.what());
    throw;
  }

  if (rank == 0 && !job.quiet) print_run_summary(job, model, size, seq, result.steps);
  if (!job.trace_file.empty()) {
    // Each rank drops what the trace does not keep before sending: a rank left out sends nothing.
    std::erase_if(result.events,
                  [&](const spec::TraceEvent& e) { return !job.trace_selection.keeps(e); });
    std::vector<std::string> parts =
        layout.groups().world->gather_strings(events_json(result.events).dump(), 0);
    if (rank == 0) {
      spec::Json merged = spec::Json::array();
      for (const std::string& p : parts)
        for (spec::Json& e : spec::Json::parse(p)) merged.push_back(std::move(e));
      spec::Json doc = {{"schema", spec::kTraceSchema},
                        {"displayTimeUnit", "ms"},
                        {"otherData", {{"kind", "measured"}}},
                        {"traceEvents", merged}};
      spec::Trace trace = spec::trace_from_json(doc, "merged trace");
      std::vector<double> times;
      for (const StepLog& s : result.steps) times.push_back(s.step_time_s);
      const spec::Json step_times = times;
      trace.metadata = {{"model", model.name},
                        {"plan", job.plan.name()},
                        {"plan_json", spec::to_json(job.plan)},
                        {"ranks", size},
                        {"backend", backend.name()},
                        {"collectives", comm_kind_name(job.comm)},
                        {"steps", result.steps.size()},
                        {"step_time_s", spec::mean_step_after_warmup(times).value_or(0.0)},
                        {"step_times_s", step_times},
                        // What a simulator needs to predict this run again (calibration checks
                        // its fit on it): the model, the precision and the software stack.
                        {"model_json", spec::to_json(model)},
                        {"precision", precision_name(backend.precision())},
                        {"dtype", backend.activation_dtype() == DType::kBF16 ? "bf16" : "fp32"},
                        {"stack", spec::executor_stack(job.plan).preset},
                        {"commit", spec::git_commit()}};
      if (!job.trace_selection.keeps_everything()) {
        trace.metadata["trace_ranks"] = job.trace_selection.ranks;  // [] = every rank
        trace.metadata["trace_steps"] = job.trace_selection.steps;
      }
      trace.kind = "measured";
      spec::write_trace_file(job.trace_file, trace);
      if (trace.events.empty())
        fmt::print(stderr, "warning: --trace-ranks / --trace-steps kept no event: {} is empty\n",
                   job.trace_file);
      if (!job.quiet) {
        fmt::print("trace: {} ({} events from {} rank{})\n", job.trace_file, trace.events.size(),
                   size, size == 1 ? "" : "s");
        if (job.on_trace) job.on_trace(trace, result.steps);
      }
    }
  }
  return result;
}

std::unique_ptr<Backend> make_backend(BackendKind kind, std::optional<CommKind> choice,
                                      std::optional<Precision> precision, bool quiet,
                                      MPI_Comm world, CommKind& comm) {
  if (kind == BackendKind::kCpu) {
    if (choice && *choice != CommKind::kMpi)
      throw InputError("command line", "--comm", std::string(comm_kind_name(*choice)),
                       "mpi with the cpu backend (nccl needs --backend cuda)");
    comm = CommKind::kMpi;
    std::unique_ptr<Backend> backend = make_cpu_backend(precision.value_or(Precision::kFp32));
    int rank = 0;
    MPI_CHECK(MPI_Comm_rank(world, &rank));
    if (rank == 0 && !quiet && backend->activation_dtype() == DType::kBF16)
      fmt::print(
          "backend {}: mixed precision emulated on the CPU (bf16 rounding checked, not "
          "bf16 speed: slower than fp32)\n",
          backend->name());
    return backend;
  }
  const int devices = cuda_device_count();
  if (devices == 0)
    throw InputError("command line", "--backend", "cuda",
                     "a usable GPU, but " + cuda_unavailable_reason());
  const auto [local_rank, local_size] = node_local_rank(world);
  const bool gpu_per_rank = local_size <= devices;
  if (choice == CommKind::kNccl && !gpu_per_rank)
    throw InputError(
        "command line", "--comm", "nccl",
        fmt::format("one GPU per rank, but {} ranks share {} GPU(s) on a node and NCCL "
                    "refuses two ranks on one GPU (use --comm mpi)",
                    local_size, devices));
  if (choice == CommKind::kMpi || choice == CommKind::kMpiStaged) {
    comm = CommKind::kMpiStaged;
  } else {
    comm = gpu_per_rank ? CommKind::kNccl : CommKind::kMpiStaged;
  }
  std::unique_ptr<Backend> backend =
      make_cuda_backend(local_rank % devices, precision.value_or(Precision::kBf16));
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  if (rank == 0 && !quiet)
    fmt::print("backend {} ({} GPU(s) per node, {} rank(s) per node), collectives {}\n",
               backend->name(), devices, local_size, comm_kind_name(comm));
  return backend;
}

std::unique_ptr<Backend> make_backend(Job& job, MPI_Comm world) {
  return make_backend(job.backend, job.comm_choice, job.precision, job.quiet, world, job.comm);
}

int run_main(const std::function<Job()>& make_job) {
  keep_freed_host_memory();
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Errors are returned as exceptions, not the default abort-on-error.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int status = 0;
  try {
    Job job = make_job();
    int size = 1;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    check_job(job, size);
    std::unique_ptr<Backend> backend = make_backend(job, MPI_COMM_WORLD);
    run_job(job, MPI_COMM_WORLD, *backend);
  } catch (const InputError& e) {
    // Every rank validates the same plan and model: one message, from rank 0.
    if (rank == 0) fmt::print(stderr, "error: {}\n", e.what());
    status = 2;
  } catch (const TrainingDiverged& e) {
    if (rank == 0) fmt::print(stderr, "error: {}\n", e.what());
    status = 1;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "[rank {}] error: out of memory (host or device) while training\n", rank);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  } catch (const std::exception& e) {
    // A failure of this rank alone: end the whole job so that no other rank waits forever.
    fmt::print(stderr, "[rank {}] error: {}\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}

}  // namespace sextant::exec
