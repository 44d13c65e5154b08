// Enumeration of legal plans.
#include "sextant/planner/search_space.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <optional>
#include <regex>

#include "sextant/models/lowering.hpp"
#include "sextant/sim/step_setup.hpp"
#include "sextant/spec/branch_parallel.hpp"
#include "sextant/spec/channel_split.hpp"
#include "sextant/spec/context_parallel.hpp"
#include "sextant/spec/expert_parallel.hpp"
#include "sextant/spec/limits.hpp"
#include "sextant/spec/parameter_server.hpp"
#include "sextant/spec/spatial_split.hpp"
#include "sextant/spec/stack_on_cluster.hpp"
#include "sextant/spec/stack_support.hpp"
#include "sextant/spec/tensor_grid.hpp"

namespace sextant::planner {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i * i <= n; ++i) {
    if (n % i == 0) {
      d.push_back(i);
      if (i != n / i) d.push_back(n / i);
    }
  }
  std::sort(d.begin(), d.end());
  return d;
}

int64_t model_layers(const spec::ModelSpec& m) {
  switch (m.kind()) {
    case spec::ModelKind::kTransformer:
      return m.transformer().layers;
    case spec::ModelKind::kMlp:
      return static_cast<int64_t>(m.mlp().widths.size()) - 1;
    case spec::ModelKind::kCnn: {
      int64_t units = 0;
      for (const spec::CnnLayer& l : m.cnn().layers)
        units += l.kind == spec::CnnLayerKind::kBottleneck ? l.blocks : 1;
      return units;
    }
  }
  return 1;
}

int64_t value_of(const Candidate& p, Constraint::Dim d) {
  switch (d) {
    case Constraint::Dim::kDp:
      return p.dp;
    case Constraint::Dim::kTp:
      return p.tp;
    case Constraint::Dim::kPp:
      return p.pp;
    case Constraint::Dim::kZero:
      return p.zero;
    case Constraint::Dim::kMicroBatch:
      return p.micro_batch;
    case Constraint::Dim::kVpp:
      return p.virtual_stages;
    case Constraint::Dim::kRecomputeLayers:
      return p.recompute_layers;
    case Constraint::Dim::kOffload:
      return p.offload;
    case Constraint::Dim::kSpatial:
    case Constraint::Dim::kCp:
      // Candidates carry an index into their enumeration's sample splits; those are the powers
      // of two from 1 in order (Enumeration::sample_splits), each a grid or a cp degree with its
      // algorithms: the index's rank count.
      return int64_t{1} << p.split_log2;
    case Constraint::Dim::kEp:
      return int64_t{1} << p.ep_log2;
    case Constraint::Dim::kGrid:
      return p.grid > 0 ? 1 : 0;
    case Constraint::Dim::kActivationOffload:
      return p.offload_activations ? 1 : 0;
    case Constraint::Dim::kOps:
      break;  // not a dimension of a uniform candidate
  }
  return 0;
}

}  // namespace

namespace {

bool compares(Constraint::Op op, int64_t v, int64_t value) {
  switch (op) {
    case Constraint::Op::kLess:
      return v < value;
    case Constraint::Op::kLessEqual:
      return v <= value;
    case Constraint::Op::kEqual:
      return v == value;
    case Constraint::Op::kGreaterEqual:
      return v >= value;
    case Constraint::Op::kGreater:
      return v > value;
  }
  return true;
}

}  // namespace

bool Constraint::allows_splits(const spec::Plan& plan) const {
  if (dim != Dim::kOps) return true;
  // A lower bound cannot make the search split ops that do not pay: it bounds from above only.
  const int64_t ops = static_cast<int64_t>(plan.per_op.size());
  return op == Op::kGreater || op == Op::kGreaterEqual ? true
         : op == Op::kEqual                            ? ops <= value
                                                       : compares(op, ops, value);
}

bool Constraint::allows(const Candidate& candidate) const {
  if (dim == Dim::kOps) return true;
  const int64_t v = value_of(candidate, dim);
  switch (op) {
    case Op::kLess:
      return v < value;
    case Op::kLessEqual:
      return v <= value;
    case Op::kEqual:
      return v == value;
    case Op::kGreaterEqual:
      return v >= value;
    case Op::kGreater:
      return v > value;
  }
  return true;
}

Constraint parse_constraint(const std::string& text) {
  static const std::regex pattern(
      R"(^\s*(dp|tp|pp|zero|mb|vpp|recompute_layers|offload|act_offload|spatial|cp|ep|grid|ops)\s*(<=|>=|==|=|<|>)\s*(\d+)\s*$)");
  std::smatch m;
  if (!std::regex_match(text, m, pattern)) {
    throw InputError("command line", "--constraint", text,
                     "expected <dim><op><integer> with dim one of dp, tp, pp, zero, mb, vpp, "
                     "recompute_layers, offload, act_offload, spatial, cp, ep, grid, ops and "
                     "op one of <=, <, =, >=, > (e.g. tp<=8)");
  }
  Constraint c{};
  const std::string dim = m[1];
  c.dim = dim == "dp"            ? Constraint::Dim::kDp
          : dim == "tp"          ? Constraint::Dim::kTp
          : dim == "pp"          ? Constraint::Dim::kPp
          : dim == "zero"        ? Constraint::Dim::kZero
          : dim == "mb"          ? Constraint::Dim::kMicroBatch
          : dim == "vpp"         ? Constraint::Dim::kVpp
          : dim == "offload"     ? Constraint::Dim::kOffload
          : dim == "spatial"     ? Constraint::Dim::kSpatial
          : dim == "cp"          ? Constraint::Dim::kCp
          : dim == "ep"          ? Constraint::Dim::kEp
          : dim == "grid"        ? Constraint::Dim::kGrid
          : dim == "act_offload" ? Constraint::Dim::kActivationOffload
          : dim == "ops"         ? Constraint::Dim::kOps
                                 : Constraint::Dim::kRecomputeLayers;
  const std::string op = m[2];
  c.op = op == "<"    ? Constraint::Op::kLess
         : op == "<=" ? Constraint::Op::kLessEqual
         : op == ">"  ? Constraint::Op::kGreater
         : op == ">=" ? Constraint::Op::kGreaterEqual
                      : Constraint::Op::kEqual;
  c.value = std::stoll(m[3]);
  return c;
}

void check_request(const SearchRequest& r) {
  Diagnostics diag("request");
  if (r.gpus < 1) diag.add("--gpus", std::to_string(r.gpus), "must be >= 1");
  if (r.global_batch < 1 || r.global_batch > spec::kMaxGlobalBatch)
    diag.add("--global-batch", std::to_string(r.global_batch),
             fmt::format("must be in [1, {}]", spec::kMaxGlobalBatch));
  if (r.seq_len)
    if (std::string problem = spec::seq_len_problem(r.model, *r.seq_len); !problem.empty())
      diag.add("--seq-len", std::to_string(*r.seq_len), problem);
  if (r.gpus > r.cluster.total_devices()) {
    diag.add("--gpus", std::to_string(r.gpus),
             fmt::format("cluster {} has {} devices ({} nodes x {})", r.cluster.name,
                         r.cluster.total_devices(), r.cluster.nodes, r.cluster.devices_per_node));
  }
  diag.throw_if_any();
}

std::vector<int64_t> balanced_split(int64_t layers, int64_t chunks) {
  if (chunks < 3 || layers < 2 * chunks) return {};
  // The first and last chunk each give one layer to the middle ones (Megatron-LM lets users
  // shorten the first and last stages for the embedding and the output layer the same way).
  std::vector<int64_t> counts(static_cast<size_t>(chunks), 0);
  int64_t rest = layers - 2 * (layers / chunks - 1);
  counts.front() = counts.back() = layers / chunks - 1;
  int64_t middle = chunks - 2;
  for (int64_t i = 0; i < middle; ++i)
    counts[static_cast<size_t>(i + 1)] = rest / middle + (i < rest % middle ? 1 : 0);
  return counts;
}

namespace {

// What the request asks for by name (the model, the compute dtype, each compression, the
// asynchronous pipeline) that the stack's software cannot run: an error, not a search that
// silently leaves it out. Asked through the plan rule (spec::stack_support_problems) on probe
// plans that use just that.
void check_stack_request(const SearchRequest& r, const spec::Stack& stack, spec::Dtype compute) {
  std::vector<spec::Plan> probes(1);
  for (const spec::GradientCompression& c : r.compressions) {
    spec::Plan p;
    p.dp = 2;
    p.compression = c;
    probes.push_back(p);
  }
  if (r.asynchronous_pipelines) {
    spec::Plan p;
    p.pp = 2;
    p.schedule = spec::Schedule::kPipeDream2BW;
    probes.push_back(p);
  }
  if (r.gems) {
    spec::Plan p;
    p.pp = 2;
    p.global_batch = 2;
    p.schedule = spec::Schedule::kGems;
    probes.push_back(p);
  }
  if (!r.parameter_server_staleness.empty()) {
    spec::Plan p;
    p.dp = 2;
    p.parameter_server = {true, r.parameter_server_staleness.front()};
    probes.push_back(p);
  }
  Diagnostics diag("request");
  std::vector<std::string> seen;
  for (const spec::Plan& p : probes)
    for (std::string& problem : spec::stack_support_problems(p, r.model, stack, compute)) {
      if (std::find(seen.begin(), seen.end(), problem) != seen.end()) continue;
      seen.push_back(problem);
      diag.add("--stack", stack.preset, problem);
    }
  diag.throw_if_any();
}

template <typename T>
bool has(const std::vector<T>& values, T value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

// The request's stack and its variants (a feature the software has a flag for can be switched
// off, TP overlap down to bulk, then none; the gradient bucket is also tried at a quarter and at
// four times its size: fewer, larger buckets pay less latency, smaller ones leave less exposed
// after the backward), as a product: variant (((t * nd + d) * ng + g) * np + p) * nb + b takes
// option t of the TP overlap, d of the DP overlap, g of the parameter-gather overlap, p of the
// pipeline-transfer overlap and b of the bucket size; option 0 is always the request's own value.
struct StackVariants {
  std::vector<spec::Stack> stacks;
  size_t nt = 1, nd = 1, ng = 1, np = 1, nb = 1;
  size_t index(size_t t, size_t d, size_t g, size_t p, size_t b) const {
    return (((t * nd + d) * ng + g) * np + p) * nb + b;
  }
};

StackVariants stack_variants(const spec::Stack& stack, const StackTuning& tuning,
                             const spec::ClusterSpec& cluster) {
  // A knob varies where the software has it as a flag (the preset's "tunable") and the request
  // did not pin it; an overlap only where the cluster's collectives can overlap at all
  // (spec::stack_on turns them all off elsewhere, so their variants would be copies).
  const bool overlaps = !spec::collectives_block(cluster);
  auto varies = [&](std::string_view knob, bool unpinned) {
    const bool overlap = knob != "dp_bucket_bytes";
    return unpinned && spec::is_tunable(stack, knob) && (overlaps || !overlap);
  };
  std::vector<spec::TpOverlap> tp = {stack.tp_overlap};
  if (varies("tp_overlap", tuning.tp_overlap))
    for (int o = static_cast<int>(stack.tp_overlap) - 1; o >= 0; --o)
      tp.push_back(static_cast<spec::TpOverlap>(o));
  auto off_too = [](bool on, bool tunable) {
    return on && tunable ? std::vector<bool>{true, false} : std::vector<bool>{on};
  };
  const std::vector<bool> dp = off_too(stack.dp_overlap, varies("dp_overlap", tuning.dp_overlap));
  const std::vector<bool> gather = off_too(
      stack.param_gather_overlap, varies("param_gather_overlap", tuning.param_gather_overlap));
  const std::vector<bool> pp = off_too(stack.pp_overlap, varies("pp_overlap", tuning.pp_overlap));
  std::vector<int64_t> buckets = {stack.dp_bucket_bytes};
  if (varies("dp_bucket_bytes", tuning.dp_bucket_bytes) && stack.dp_bucket_bytes >= 4)
    buckets.insert(buckets.end(), {stack.dp_bucket_bytes / 4, stack.dp_bucket_bytes * 4});
  StackVariants v;
  v.nt = tp.size();
  v.nd = dp.size();
  v.ng = gather.size();
  v.np = pp.size();
  v.nb = buckets.size();
  for (spec::TpOverlap t : tp)
    for (bool d : dp)
      for (bool g : gather)
        for (bool p : pp)
          for (int64_t b : buckets) {
            spec::Stack s = stack;
            s.tp_overlap = t;
            s.dp_overlap = d;
            s.param_gather_overlap = g;
            s.pp_overlap = p;
            s.dp_bucket_bytes = b;
            v.stacks.push_back(std::move(s));
          }
  return v;
}

}  // namespace

std::string tuned_knobs(const spec::Stack& requested, const spec::Stack& used) {
  std::string out;
  auto add = [&](std::string_view knob, std::string_view value) {
    out += fmt::format("{}{}={}", out.empty() ? "" : " ", knob, value);
  };
  if (used.tp_overlap != requested.tp_overlap)
    add("tp_overlap", spec::enum_name(spec::tp_overlap_names(), used.tp_overlap));
  if (used.dp_overlap != requested.dp_overlap) add("dp_overlap", used.dp_overlap ? "on" : "off");
  if (used.param_gather_overlap != requested.param_gather_overlap)
    add("param_gather_overlap", used.param_gather_overlap ? "on" : "off");
  if (used.pp_overlap != requested.pp_overlap) add("pp_overlap", used.pp_overlap ? "on" : "off");
  if (used.dp_bucket_bytes != requested.dp_bucket_bytes) {
    const int64_t b = used.dp_bucket_bytes;
    add("dp_bucket", b % (int64_t{1} << 18) == 0
                         ? fmt::format("{:g}MiB", static_cast<double>(b) / (1 << 20))
                         : fmt::format("{:g}MB", static_cast<double>(b) / 1e6));
  }
  return out;
}

void Enumeration::fill(size_t i, spec::Plan& out) const {
  const Candidate& c = candidates[i];
  out.dp = c.dp;
  out.tp = c.tp;
  out.pp = c.pp;
  out.zero = c.zero;
  out.sequence_parallel = c.sequence_parallel;
  out.micro_batch = c.micro_batch;
  out.global_batch = base.global_batch;
  out.schedule = static_cast<spec::Schedule>(c.schedule);
  out.virtual_stages = c.virtual_stages;
  if (c.balanced) {
    const std::vector<int64_t>& split =
        balanced_splits.at(static_cast<int64_t>(c.pp) * c.virtual_stages);
    out.stage_layers.assign(split.begin(), split.end());
  } else {
    out.stage_layers.clear();
  }
  out.recompute = static_cast<spec::Recompute>(c.recompute);
  out.recompute_layers = c.recompute_layers;
  out.offload.optimizer = c.offload >= 1 ? spec::OffloadTarget::kHost : spec::OffloadTarget::kNone;
  out.offload.params = c.offload >= 2 ? spec::OffloadTarget::kHost : spec::OffloadTarget::kNone;
  out.offload.activations =
      c.offload_activations ? spec::OffloadTarget::kHost : spec::OffloadTarget::kNone;
  // Every block but the last; under KARMA's split the blocks before the recomputed ones.
  const bool karma =
      c.recompute == static_cast<uint8_t>(spec::Recompute::kFull) && c.recompute_layers > 0;
  out.offload.activation_layers =
      c.offload_activations ? (karma ? units - c.recompute_layers : units - 1) : 0;
  // KARMA's swap schedule: the swapped blocks' reloads issued as the backward begins, beside the
  // recomputed blocks above them, at the memory of that many reloaded blocks.
  out.offload.prefetch_layers =
      !c.reload_ahead ? 1 : (c.reload_window > 0 ? c.reload_window : c.recompute_layers);
  out.compression =
      compressions.empty() ? spec::GradientCompression{} : compressions[c.compression];
  out.parameter_server = c.servers == 0 ? spec::ParameterServer{} : servers[c.servers - 1u];
  const Enumeration::SampleSplit split =
      sample_splits.empty() ? Enumeration::SampleSplit{} : sample_splits[c.spatial];
  out.spatial = split.spatial;
  out.cp = split.cp;
  out.cp_algorithm = split.cp_algorithm;
  out.ep = int64_t{1} << c.ep_log2;
  out.tp_grid = grids.empty() ? spec::TensorGrid{} : grids[c.grid];
  out.branch_parallel = branch_split && c.tp > 1;
  out.dtype = base.dtype;
  out.seq_len = base.seq_len;
  if (out.model != base.model) out.model = base.model;
  if (out.cluster != base.cluster) out.cluster = base.cluster;
}

spec::Plan Enumeration::plan(size_t i) const {
  spec::Plan p;
  fill(i, p);
  p.stack = stack_of(i);
  return p;
}

namespace {

// The candidates the executor runs in `run`; the others counted under the first rule they break.
void keep_what_the_executor_runs(const SearchRequest& r, const spec::ExecutorRun& run,
                                 Enumeration& out) {
  std::vector<Candidate> kept;
  for (size_t i = 0; i < out.candidates.size(); ++i) {
    const std::vector<Problem> problems = spec::executor_problems(r.model, out.plan(i), run);
    if (problems.empty()) {
      kept.push_back(out.candidates[i]);
      continue;
    }
    const std::string reason =
        fmt::format("not run by Sextant's executor on {} in {}: {}",
                    spec::enum_name(spec::executor_backend_names(), run.backend),
                    spec::enum_name(spec::executor_precision_names(), run.precision),
                    problems.front().expected);
    out.rejected[reason] += 1;
    out.rejected_units.try_emplace(reason, kConfigurations);
  }
  out.candidates = std::move(kept);
}

}  // namespace

namespace {

// The search walks a tree of axes, outermost first: the ranks splitting each sample (spatial
// grids, context parallelism) x tp x pp (a layout); the tp layout (1D or a 3D grid) x the
// micro-batch size; the schedule and its chunks; the ZeRO stage; sequence parallelism; the
// recompute mode, split and layers; the offloads, expert parallelism and compression; the stack's
// variants. Each level applies its named rules (most ask a spec predicate), counting what a rule
// cuts in the unit of its level (Enumeration::rejected_units).
class Enumerator {
 public:
  Enumerator(const SearchRequest& r, Enumeration& out)
      : r_(r),
        out_(out),
        m_(r.model),
        transformer_(m_.is_transformer()),
        layers_(model_layers(m_)),
        // Every plan names its stack, so that a written plan predicts and runs the same way
        // anywhere.
        stack_(r.stack ? *r.stack
                       : spec::builtin_stack(spec::default_stack_name(
                             r.cluster.device.kind == spec::DeviceKind::kGpu, m_.kind()))),
        variants_(stack_variants(stack_, r.tuning, r.cluster)),
        // What the stack's software runs (stacks/*.json "supports"; null: not a shipped preset,
        // no limit): the search proposes nothing else (spec::plan_features lists the same).
        support_(spec::stack_support(stack_)),
        not_run_(fmt::format("not run by the stack {}: ", stack_.preset)),
        seq_len_(transformer_ ? r.seq_len.value_or(m_.transformer().seq_len) : 0) {}

  void run() {
    out_.units = layers_;
    out_.base.global_batch = r_.global_batch;
    out_.base.dtype = r_.dtype;
    out_.base.seq_len = r_.seq_len;
    out_.base.model = m_.name;
    out_.base.cluster = r_.cluster.name;
    out_.compressions.push_back({});
    for (const spec::GradientCompression& c : r_.compressions)
      if (c.any() && std::find(out_.compressions.begin(), out_.compressions.end(), c) ==
                         out_.compressions.end())
        out_.compressions.push_back(c);
    for (int64_t staleness : r_.parameter_server_staleness) {
      const spec::ParameterServer bound{true, staleness};
      if (std::find(out_.servers.begin(), out_.servers.end(), bound) == out_.servers.end())
        out_.servers.push_back(bound);
    }
    SEXTANT_CHECK(out_.servers.size() <= kMaxSearchedServerBounds,
                  "{} staleness bounds to search; at most {}", out_.servers.size(),
                  kMaxSearchedServerBounds);
    out_.stacks = variants_.stacks;
    spec::Plan probe;
    probe.dtype = r_.dtype;
    compute_ = sim::step_precision(r_.cluster, probe, stack_).dtype;
    check_stack_request(r_, stack_, sim::step_precision(r_.cluster, probe, stack_).gemm_dtype);
    grad_bytes_ = spec::dtype_bytes(spec::gradient_dtype(stack_, compute_));
    smallest_bucket_ = static_cast<double>(
        std::min_element(out_.stacks.begin(), out_.stacks.end(), [](const auto& a, const auto& b) {
          return a.dp_bucket_bytes < b.dp_bucket_bytes;
        })->dp_bucket_bytes);
    add_spatial_splits();
    add_context_splits();
    add_expert_degrees();
    out_.grids.push_back({});
    out_.branch_split = m_.kind() == spec::ModelKind::kCnn && m_.cnn().has_cells();
    for (size_t si = 0; si < out_.sample_splits.size(); ++si) {
      const int64_t split_ranks = out_.sample_splits[si].ranks();
      if (r_.gpus % split_ranks != 0) continue;
      const int64_t sample_groups = r_.gpus / split_ranks;
      for (int64_t tp : divisors(sample_groups))
        for (int64_t pp : divisors(sample_groups / tp)) layout(si, tp, pp);
    }
    if (r_.executor) keep_what_the_executor_runs(r_, *r_.executor, out_);
  }

 private:
  // A layout: the sample split, tp, pp and dp, with what its levels below share.
  struct Layout {
    size_t si = 0;
    const Enumeration::SampleSplit* split = nullptr;
    int64_t split_ranks = 1, tp = 1, pp = 1, dp = 1;
    int64_t replicas = 1;  // ranks summing each gradient (Plan::replicas)
    int64_t per_replica = 0;
    std::vector<uint8_t> tp_layouts;
    std::vector<int64_t> expert_splits;
    bool one_bucket = false;
  };
  // A branch below a layout: the tp layout, micro-batch, schedule, ZeRO stage and what they allow.
  struct Branch {
    uint8_t grid = 0;
    int64_t mb = 1, micro_batches = 1, v = 1;
    spec::Schedule schedule = spec::Schedule::k1F1B;
    std::vector<bool> splits;
    int zero = 0;
    std::vector<uint8_t> offloads;
    bool sp = false;
    // The stack variants this branch runs (the others would repeat a plan).
    size_t nt = 1, skipped_t = 1, nd = 1, nb = 1, ng = 1, np = 1;
    bool repeats_bulk = false;
  };

  template <typename Feature>
  bool runs(Feature&& feature) const {
    return support_ == nullptr || feature(*support_);
  }
  // A rule counts what it cut where it cut it (Enumeration::rejected_units): a rule on a layout
  // counts the layout once, one on a whole configuration each configuration it refused.
  void reject(const std::string& reason, const char* unit, int64_t count = 1) {
    out_.rejected[reason] += count;
    out_.rejected_units.try_emplace(reason, unit);
  }

  // Spatial splits (CNNs): a grid per power of two, up to a node (the split ranks exchange halos
  // at every layer) and as long as the model's maps split (a larger grid only shrinks blocks).
  // Each doubling goes to the axis with the fewest ranks: rows first, then columns (h >= w), and
  // over a volume planes first (d >= h >= w: slabs, then pencils, then cubes).
  void add_spatial_splits() {
    out_.sample_splits.push_back({});
    const bool may_split_maps = runs([](const spec::StackSupport& s) { return s.spatial; });
    if (m_.kind() != spec::ModelKind::kCnn) return;
    if (!may_split_maps) {
      reject(not_run_ + "spatial parallelism", kLayouts);
      return;
    }
    const int64_t limit =
        r_.allow_tp_across_nodes ? r_.gpus : std::min(r_.gpus, r_.cluster.devices_per_node);
    spec::SpatialSplit grid;
    for (int64_t s = 2; s <= limit; s *= 2) {
      if (m_.cnn().volumes() && grid.d <= grid.h && grid.d <= grid.w) {
        grid.d *= 2;
      } else if (grid.h <= grid.w) {
        grid.h *= 2;
      } else {
        grid.w *= 2;
      }
      if (!spec::spatial_split_problem(m_, grid).empty()) break;
      out_.sample_splits.push_back({grid, 1, spec::ContextAlgorithm::kRing});
    }
  }

  // Context parallelism (transformers): each power of two that leaves every rank
  // kMinContextTokens of the sequence, with each algorithm (ring only over a fused attention
  // kernel: spec::context_attention_problem); what a tp degree refuses is left out below.
  void add_context_splits() {
    for (int64_t cp = 2; transformer_ && cp <= r_.gpus && seq_len_ / cp >= kMinContextTokens;
         cp *= 2) {
      for (const auto& [name, algorithm] : spec::context_algorithm_names()) {
        if (!spec::context_attention_problem(cp, algorithm, stack_.attention).empty()) continue;
        if (!runs([a = algorithm](const spec::StackSupport& s) {
              return has(s.context_parallel, a);
            })) {
          reject(not_run_ + fmt::format("context parallelism with {} attention", name), kLayouts);
          continue;
        }
        out_.sample_splits.push_back({{}, cp, algorithm});
      }
    }
  }

  // Expert parallelism (mixtures of experts): each power of two dividing the routed experts, 1
  // (none) first; what a layout refuses is left out below.
  void add_expert_degrees() {
    ep_degrees_ = {1};
    if (transformer_ && m_.transformer().moe)
      for (int64_t ep = 2; ep <= std::min<int64_t>(r_.gpus, int64_t{1} << 15); ep *= 2)
        if (spec::expert_model_problem(m_, ep).empty()) ep_degrees_.push_back(ep);
  }

  // AxoNN's 3D tensor grids (transformers): for each tp, the x * y * z = tp the model divides
  // (spec::tensor_grid_model_problem without the micro-batch, checked per candidate below), but
  // 1 x tp x 1, which is the 1D layout.
  const std::vector<uint8_t>& grids_of(int64_t tp) {
    auto [it, added] = grids_by_tp_.try_emplace(tp);
    if (!added || !transformer_ || tp == 1) return it->second;
    for (int64_t x : divisors(tp))
      for (int64_t y : divisors(tp / x)) {
        const spec::TensorGrid g{x, y, tp / (x * y)};
        if ((g.x == 1 && g.z == 1) || !spec::tensor_grid_model_problem(m_, g, g.z).empty())
          continue;
        auto known = std::find(out_.grids.begin(), out_.grids.end(), g);
        if (known == out_.grids.end()) {
          if (out_.grids.size() > std::numeric_limits<uint8_t>::max()) continue;
          known = out_.grids.insert(known, g);
        }
        it->second.push_back(static_cast<uint8_t>(known - out_.grids.begin()));
      }
    return it->second;
  }

  // A rank whose gradients fit in the smallest bucket reduces one bucket at every size: the
  // bucket variants would repeat its plan. A rank holds at most every layer's shard plus a tied
  // table's copy (models::stage_params), in the stack's gradient dtype.
  double most_gradient_bytes(int64_t tp) {
    if (auto it = gradient_bytes_by_tp_.find(tp); it != gradient_bytes_by_tp_.end())
      return it->second;
    // (A tp only a 3D grid lays out: never one bucket.)
    if (!spec::tensor_parallel_problem(m_, tp).empty())
      return gradient_bytes_by_tp_[tp] = std::numeric_limits<double>::infinity();
    models::LoweringOptions o;
    o.dtype = compute_;
    o.tp = tp;
    // (The parameters do not depend on sequence parallelism; a mixture of experts with tp needs
    // it, and then tp must divide the sequence.)
    o.sequence_parallel = !spec::moe_tensor_parallel_problem(m_, tp, false).empty();
    if (o.sequence_parallel &&
        !spec::sequence_parallel_problem(m_.transformer().seq_len, tp).empty())
      return gradient_bytes_by_tp_[tp] = std::numeric_limits<double>::infinity();
    const models::LoweredModel lowered = models::lower(m_, o);
    int64_t params = lowered.tied_table_params;
    for (const models::Layer& l : lowered.layers) params += l.params;
    return gradient_bytes_by_tp_[tp] = static_cast<double>(params * grad_bytes_);
  }

  // The layout rules after the tp layouts; false: refused (counted).
  bool layout_allowed(const Layout& l) {
    if (l.tp > r_.cluster.devices_per_node && !r_.allow_tp_across_nodes) {
      reject("tp larger than a node", kLayouts);
      return false;
    }
    if (l.pp > layers_) {
      reject("more pipeline stages than layers", kLayouts);
      return false;
    }
    if (r_.global_batch % l.dp != 0) {
      reject("global batch not divisible by dp", kLayouts);
      return false;
    }
    return true;
  }

  void layout(size_t si, int64_t tp, int64_t pp) {
    Layout l;
    l.si = si;
    l.split = &out_.sample_splits[si];
    l.split_ranks = l.split->ranks();
    l.tp = tp;
    l.pp = pp;
    l.dp = r_.gpus / l.split_ranks / (tp * pp);
    ++out_.considered;
    // (The rules in order: the tp layouts the stack runs, pipelines, the model's own tp rule.)
    std::optional<std::vector<uint8_t>> layouts = tp_layouts_the_stack_runs(tp, l.split_ranks);
    if (!layouts) return;
    if (pp > 1 && !runs([](const spec::StackSupport& s) { return !s.schedules.empty(); })) {
      reject(not_run_ + "pipeline parallelism", kLayouts);
      return;
    }
    if (layouts->empty()) {
      refuse_unsplittable_tp();
      return;
    }
    l.tp_layouts = std::move(*layouts);
    if (!layout_allowed(l)) return;
    l.per_replica = r_.global_batch / l.dp;
    for (int64_t ep : ep_degrees_)
      if (l.dp % ep == 0) l.expert_splits.push_back(ep);
    l.replicas = l.dp * l.split_ranks;
    l.one_bucket =
        l.replicas > 1 && variants_.nb > 1 && most_gradient_bytes(tp) <= smallest_bucket_;
    // One grid at a time (outside the micro-batch sizes): the plans of a lowering stay together
    // for the estimator's cache of lowerings.
    for (uint8_t grid : l.tp_layouts)
      for (int64_t mb : divisors(l.per_replica)) micro_batch(l, grid, mb);
  }

  // SUPER's branch split over tp ranks (a model with multi-branch units): the one tp layout, when
  // the rule allows it and the stack runs it.
  std::optional<std::vector<uint8_t>> branch_layouts(int64_t tp, int64_t split_ranks) {
    spec::Plan probe;
    probe.tp = tp;
    probe.branch_parallel = true;
    if (split_ranks > 1 || !spec::branch_parallel_problem(m_, probe).empty())
      return std::vector<uint8_t>{};
    if (!runs([](const spec::StackSupport& s) { return s.branch_parallel; })) {
      reject(not_run_ + "SUPER's branch split", kLayouts);
      return std::nullopt;
    }
    return std::vector<uint8_t>{0};
  }

  // The layout's tp layouts the model allows and the stack runs. None: the stack runs none of
  // those the model allows (counted here); empty: the model allows none (counted by
  // refuse_unsplittable_tp, after the pipeline rule).
  std::optional<std::vector<uint8_t>> tp_layouts_the_stack_runs(int64_t tp, int64_t split_ranks) {
    std::vector<uint8_t> layouts;
    if (out_.branch_split && tp > 1) return branch_layouts(tp, split_ranks);
    if (spec::tensor_parallel_problem(m_, tp).empty()) layouts.push_back(0);
    if (split_ranks == 1)
      for (uint8_t g : grids_of(tp)) layouts.push_back(g);
    if (tp > 1 && !layouts.empty()) {
      // The layouts the stack runs: Megatron-LM's 1D split, AxoNN's grids.
      const bool one_d = runs([](const spec::StackSupport& s) { return s.tensor_parallel; });
      const bool grids = runs([](const spec::StackSupport& s) { return s.tensor_grid; });
      // (Named by what the model allowed: a tp the heads do not divide only had grids.)
      const bool had_one_d = layouts.front() == 0;
      std::erase_if(layouts, [&](uint8_t g) { return g == 0 ? !one_d : !grids; });
      if (layouts.empty()) {
        reject(not_run_ + (had_one_d ? "tensor parallelism" : "3D tensor grids (AxoNN)"), kLayouts);
        return std::nullopt;
      }
    }
    return layouts;
  }

  // The model's own tp rule: tp splits a transformer's heads and a CNN's channels
  // (spec/channel_split.hpp), of each spatial block under a spatial split; not an MLP.
  void refuse_unsplittable_tp() {
    const bool cnn = m_.kind() == spec::ModelKind::kCnn;
    const bool unsplittable =
        cnn && (m_.cnn().volumes() || m_.cnn().has_skips() || m_.cnn().has_cells() ||
                m_.cnn().layers.back().kind != spec::CnnLayerKind::kFc);
    reject(transformer_        ? "tp does not divide the heads or the MLP"
           : out_.branch_split ? "tp past the 2 to 4 ranks SUPER splits multi-branch units over"
           : unsplittable
               ? "tp on volumes, skip connections, multi-branch units or a per-pixel head"
               : "tp does not divide the channels",
           kLayouts);
  }

  void micro_batch(const Layout& l, uint8_t grid, int64_t mb) {
    Branch b;
    b.grid = grid;
    b.mb = mb;
    b.micro_batches = l.per_replica / mb;
    if (!spec::micro_batch_count_problem(b.micro_batches).empty()) {
      reject("more micro-batches per step than the limit (spec/limits.hpp)", kMicroBatches);
      return;
    }
    for (auto [schedule, v] : schedules(l.pp, b.micro_batches)) {
      b.schedule = schedule;
      b.v = v;
      // The splits into chunks: even, and balanced where that differs.
      b.splits = {false};
      const int64_t chunks = l.pp * v;
      if (!out_.balanced_splits.contains(chunks)) {
        std::vector<int64_t> balanced = balanced_split(layers_, chunks);
        if (!balanced.empty()) out_.balanced_splits.emplace(chunks, std::move(balanced));
      }
      if (out_.balanced_splits.contains(chunks)) b.splits.push_back(true);
      for (int zero = 0; zero <= 3; ++zero) {
        b.zero = zero;
        if (zero_allowed(l, b)) zero_stage(l, b);
      }
    }
  }

  // Schedules and chunk counts of a layout with `pp` stages and `micro_batches` a step, those
  // the stack runs.
  std::vector<std::pair<spec::Schedule, int64_t>> schedules(int64_t pp, int64_t micro_batches) {
    std::vector<std::pair<spec::Schedule, int64_t>> out;
    if (pp == 1) return {{spec::Schedule::k1F1B, 1}};
    out.push_back({spec::Schedule::kGpipe, 1});
    out.push_back({spec::Schedule::k1F1B, 1});
    for (int64_t v : divisors(layers_ / pp)) {
      if (v < 2 || layers_ % (pp * v) != 0) continue;
      if (micro_batches % pp != 0) {
        reject("interleaving needs micro-batches divisible by pp", kSchedules);
        continue;
      }
      out.push_back({spec::Schedule::kInterleaved, v});
    }
    // PipeDream-2BW and PipeDream change what the model learns (stale gradients): only where
    // the user opts in, 2BW with the m >= pp it needs (spec::pipedream_2bw_problem), PipeDream
    // with its one micro-batch a batch (spec::pipedream_problem).
    if (r_.asynchronous_pipelines) {
      if (micro_batches >= pp) {
        out.push_back({spec::Schedule::kPipeDream2BW, 1});
      } else {
        reject("PipeDream-2BW needs at least pp micro-batches", kSchedules);
      }
      if (micro_batches == 1) {
        out.push_back({spec::Schedule::kPipeDream, 1});
      } else {
        reject("PipeDream updates after each micro-batch: one a batch", kSchedules);
      }
    }
    // GEMS' two replicas of the stages (spec/pipeline_schedule.hpp): on request, where each
    // replica gets half the micro-batches.
    if (r_.gems) {
      if (pp % 2 == 0 && micro_batches % 2 == 0) {
        out.push_back({spec::Schedule::kGems, 1});
      } else {
        reject("GEMS needs an even pp and micro-batch count", kSchedules);
      }
    }
    std::erase_if(out, [&](const std::pair<spec::Schedule, int64_t>& s) {
      if (runs([k = s.first](const spec::StackSupport& t) { return has(t.schedules, k); }))
        return false;
      reject(not_run_ +
                 fmt::format("the {} schedule", spec::enum_name(spec::schedule_names(), s.first)),
             kSchedules);
      return true;
    });
    return out;
  }

  // The ZeRO stage's rules; false: refused (counted).
  bool zero_allowed(const Layout& l, const Branch& b) {
    const int zero = b.zero;
    if (zero >= 2 && l.pp > 1) {
      reject("ZeRO-2/3 with pipeline parallelism", kZeroStages);
      return false;
    }
    if (zero > 0 && b.schedule == spec::Schedule::kPipeDream) {
      reject("ZeRO with PipeDream's per-batch updates", kZeroStages);
      return false;
    }
    if (zero > 0 && b.schedule == spec::Schedule::kGems) {
      reject("ZeRO with GEMS (a rank and its mirror sum their stages' gradients)", kZeroStages);
      return false;
    }
    // (Stage 0 on one replica is no data parallelism at all: any stack runs it. A stage above 0
    // on one replica only comes with offload, which the stack's stage list governs too, as
    // spec::plan_features says.)
    if ((zero > 0 || l.replicas > 1) &&
        !runs([zero](const spec::StackSupport& s) { return has(s.zero, zero); })) {
      reject(not_run_ + (zero == 0 ? std::string("DDP (ZeRO 0)") : fmt::format("ZeRO-{}", zero)),
             kZeroStages);
      return false;
    }
    if (zero == 0 && l.replicas > 1 && (l.tp > 1 || l.pp > 1 || l.split->cp > 1) &&
        !runs([](const spec::StackSupport& s) { return s.ddp_with_model_parallel; })) {
      reject(not_run_ + "DDP (ZeRO 0) beside tensor, pipeline or context parallelism", kZeroStages);
      return false;
    }
    return true;
  }

  // What may live in host memory (Candidate::offload) under this stage, of what the stack runs.
  // With one replica ZeRO shards nothing (the same plan as zero 0), but ZeRO-Offload still moves
  // the optimizer out: ZeRO-2 then (gradients leave bucket by bucket), and ZeRO-3 with the
  // parameters too.
  std::vector<uint8_t> offloads(const Layout& l, const Branch& b) {
    std::vector<uint8_t> out;
    // (ZeRO shards over every rank holding the parameters: dp x cp or dp x spatial,
    // Plan::replicas.)
    if (b.zero == 0 || l.replicas > 1) out.push_back(0);
    // A spatial split runs without optimizer or parameter offload (spec::validate_plan).
    const bool may_offload = r_.cluster.host && !l.split->spatial.any();
    if (may_offload && b.zero >= 1 && (l.replicas > 1 || b.zero == 2)) out.push_back(1);
    if (may_offload && b.zero == 3) out.push_back(2);
    if (spec::asynchronous(b.schedule) || b.schedule == spec::Schedule::kGems)  // (no offload)
      std::erase_if(out, [](uint8_t o) { return o != 0; });
    // The state offloads the stack runs (to host memory, the planner's target).
    std::erase_if(out, [&](uint8_t o) {
      if (o == 0) return false;
      const spec::OffloadKind kind =
          o == 1 ? spec::OffloadKind::kOptimizer : spec::OffloadKind::kOptimizerAndParams;
      if (runs([kind](const spec::StackSupport& s) {
            return has(s.offload, kind) && has(s.offload_devices, spec::OffloadTarget::kHost);
          }))
        return false;
      reject(not_run_ + (o == 1 ? "offloading the optimizer state alone"
                                : "offloading the optimizer state and the parameters"),
             kZeroStages);
      return true;
    });
    return out;
  }

  void zero_stage(const Layout& l, Branch& b) {
    b.offloads = offloads(l, b);
    if (b.offloads.empty()) return;
    for (bool sp : {false, true}) {
      b.sp = sp;
      if (sequence_split_allowed(l, b)) sequence_split(l, b);
    }
  }

  // Sequence parallelism's rules (it splits a transformer's sequence, spec::validate_plan) and
  // context parallelism's on this tp; false: refused (counted) or not a choice here.
  bool sequence_split_allowed(const Layout& l, const Branch& b) {
    const bool sp = b.sp;
    if (sp && (l.tp == 1 || !transformer_)) return false;
    if (sp && !runs([](const spec::StackSupport& s) { return s.sequence_parallel; })) {
      reject(not_run_ + "sequence parallelism", kSequenceSplits);
      return false;
    }
    if (sp && transformer_ &&
        !spec::sequence_parallel_problem(seq_len_ / l.split->cp, l.tp).empty()) {
      reject("sequence parallelism needs tp to divide the sequence", kSequenceSplits);
      return false;
    }
    if (!spec::moe_tensor_parallel_problem(m_, l.tp, sp).empty()) {
      reject("a mixture of experts with tp but no sp", kSequenceSplits);
      return false;
    }
    if (l.split->cp > 1) {
      spec::Plan shape;
      shape.tp = l.tp;
      shape.sequence_parallel = sp;
      shape.cp = l.split->cp;
      shape.cp_algorithm = l.split->cp_algorithm;
      if (!spec::context_parallel_problem(m_, seq_len_, shape).empty()) {
        reject("cp does not divide the sequence or the heads", kSequenceSplits);
        return false;
      }
    }
    return true;
  }

  // The stack knobs that change this layout's step (the others stay the request's: varying them
  // would repeat a plan): TP overlap runs under sequence parallelism (sim::tp_overlap_applies) or
  // on a 3D tensor grid, where it is AxoNN's (sim::grid_overlap), gradient buckets and their
  // overlap with data parallelism below ZeRO-3, the parameter gather under ZeRO-1/2, stage
  // transfers with pipeline stages.
  void stack_variants_of(const Layout& l, Branch& b) const {
    b.nt = l.tp > 1 && (b.sp || b.grid > 0) ? variants_.nt : 1;
    // Without a z axis a grid's forward has no weight gather to overlap: its "bulk" variant
    // (after the request's "pipelined") would repeat the request's.
    b.repeats_bulk =
        b.nt > 2 && b.grid > 0 && out_.grids[b.grid].z == 1 &&
        out_.stacks[variants_.index(0, 0, 0, 0, 0)].tp_overlap == spec::TpOverlap::kPipelined &&
        out_.stacks[variants_.index(1, 0, 0, 0, 0)].tp_overlap == spec::TpOverlap::kBulk;
    b.skipped_t = b.repeats_bulk ? 1 : b.nt;  // nt: none skipped
    // (One bucket is reduced when the backward ends, overlapped or not.)
    const bool buckets = l.replicas > 1 && b.zero < 3 && !l.one_bucket;
    b.nd = buckets ? variants_.nd : 1;
    b.nb = buckets ? variants_.nb : 1;
    b.ng = l.replicas > 1 && (b.zero == 1 || b.zero == 2) ? variants_.ng : 1;
    b.np = l.pp > 1 ? variants_.np : 1;
  }

  void sequence_split(const Layout& l, Branch& b) {
    stack_variants_of(l, b);
    for (spec::Recompute rc :
         {spec::Recompute::kNone, spec::Recompute::kSelective, spec::Recompute::kFull}) {
      // Recompute re-runs transformer blocks only (spec::validate_plan).
      if (rc != spec::Recompute::kNone && !transformer_) continue;
      if (!runs([rc](const spec::StackSupport& s) { return has(s.recompute, rc); })) {
        reject(not_run_ + fmt::format("{} recompute", spec::enum_name(spec::recompute_names(), rc)),
               kSequenceSplits);
        continue;
      }
      const bool first_layers_only =
          runs([](const spec::StackSupport& s) { return s.recompute_layers; });
      for (bool balanced : b.splits) {
        // Full recompute of the first N layers of each chunk (Megatron-LM's block method) for N
        // below the largest chunk; 0: every layer.
        int64_t largest_chunk = 0;
        if (rc == spec::Recompute::kFull && transformer_ && first_layers_only) {
          spec::Plan shape;
          shape.pp = l.pp;
          shape.virtual_stages = b.v;
          if (balanced) shape.stage_layers = out_.balanced_splits.at(l.pp * b.v);
          largest_chunk = spec::largest_stage_chunk(shape, layers_);
        }
        for (int64_t rc_layers = 0; rc_layers == 0 || rc_layers < largest_chunk; ++rc_layers)
          recompute(l, b, rc, balanced, rc_layers);
      }
    }
  }

  void recompute(const Layout& l, const Branch& b, spec::Recompute rc, bool balanced,
                 int64_t rc_layers) {
    Candidate c;
    c.dp = static_cast<int32_t>(l.dp);
    c.tp = static_cast<int32_t>(l.tp);
    c.pp = static_cast<int32_t>(l.pp);
    c.micro_batch = static_cast<int32_t>(b.mb);
    c.virtual_stages = static_cast<int16_t>(b.v);
    c.recompute_layers = static_cast<int16_t>(rc_layers);
    c.zero = static_cast<uint8_t>(b.zero);
    c.schedule = static_cast<uint8_t>(b.schedule);
    c.recompute = static_cast<uint8_t>(rc);
    c.sequence_parallel = b.sp;
    c.balanced = balanced;
    c.spatial = static_cast<uint8_t>(l.si);
    c.split_log2 = static_cast<uint8_t>(std::bit_width(static_cast<uint64_t>(l.split_ranks)) - 1);
    // Megatron-LM's activation offload: one stage, no recompute (TransformerConfig refuses it
    // beside either), every block but the last. Or KARMA's split where the stack runs it: the
    // first blocks swapped and the last rc_layers recomputed (spec::unit_recompute).
    const bool karma = rc == spec::Recompute::kFull && rc_layers > 0 &&
                       runs([](const spec::StackSupport& s) { return s.swap_and_recompute; });
    const bool act_offload =
        r_.cluster.host && transformer_ && l.pp == 1 && (rc == spec::Recompute::kNone || karma) &&
        layers_ >= 2 && !spec::asynchronous(b.schedule) && runs([](const spec::StackSupport& s) {
          return has(s.offload, spec::OffloadKind::kActivations);
        });
    for (uint8_t off : b.offloads)
      for (bool act : {false, true})
        for (bool ahead : {false, true}) {
          if ((act && !act_offload) || (ahead && !(act && karma && rc_layers > 1))) continue;
          c.offload = off & 3;
          c.offload_activations = act;
          c.reload_ahead = ahead;
          for (int64_t ep : l.expert_splits) {
            // Expert parallelism: ep of the dp ranks split the routed experts
            // (spec::expert_parallel_problem: not with offload).
            c.ep_log2 = static_cast<uint8_t>((std::bit_width(static_cast<uint64_t>(ep)) - 1) & 15);
            configurations(l, b, c, off, ep);
          }
        }
  }

  // The fields of a configuration that the ep, grid and compression rules read.
  spec::Plan shape_of(const Layout& l, const Branch& b, uint8_t off, int64_t ep) const {
    spec::Plan shape;
    shape.dp = l.dp;
    shape.tp = l.tp;
    shape.tp_grid = out_.grids[b.grid];
    shape.sequence_parallel = b.sp;
    shape.zero = b.zero;
    shape.ep = ep;
    shape.offload.optimizer = off >= 1 ? spec::OffloadTarget::kHost : spec::OffloadTarget::kNone;
    return shape;
  }

  // The rules on a whole configuration (each counts the configurations it refused: the
  // compressions times the stack variants); false: refused.
  bool configuration_allowed(const Layout& l, const Branch& b, const Candidate& c, uint8_t off,
                             int64_t ep, int64_t configurations) {
    if (ep > 1) {
      if (!runs([](const spec::StackSupport& s) { return s.expert_parallel; }) ||
          (b.zero == 0 &&
           !runs([](const spec::StackSupport& s) { return s.ddp_with_model_parallel; }))) {
        reject(not_run_ + "expert parallelism (or DDP beside it)", kConfigurations, configurations);
        return false;
      }
      if (!spec::expert_parallel_problem(shape_of(l, b, off, ep)).empty()) {
        reject("ep with optimizer or parameter offload", kConfigurations, configurations);
        return false;
      }
    }
    if (b.grid > 0) {
      // The grid's rules (spec/tensor_grid.hpp) on this layout.
      const spec::Plan shape = shape_of(l, b, off, ep);
      if (!spec::tensor_grid_problem(shape).empty()) {
        reject("a 3D tensor grid with sp, ep, ZeRO-3 or optimizer/parameter offload",
               kConfigurations, configurations);
        return false;
      }
      if (!spec::tensor_grid_model_problem(m_, shape.tp_grid, b.mb).empty()) {
        reject("a 3D tensor grid whose z does not divide the micro-batch", kConfigurations,
               configurations);
        return false;
      }
    }
    for (const Constraint& k : r_.constraints)
      if (!k.allows(c)) {
        reject("excluded by --constraint", kConfigurations, configurations);
        return false;
      }
    return true;
  }

  // A configuration's compressions and stack variants, each a candidate.
  void configurations(const Layout& l, const Branch& b, Candidate& c, uint8_t off, int64_t ep) {
    // Compression applies to DDP's all-reduce (spec::compression_layout_problem); each
    // compression runs every variant of the stack.
    auto compressible = [&] {
      spec::Plan shape = shape_of(l, b, off, ep);
      shape.spatial = l.split->spatial;
      shape.cp = l.split->cp;
      return spec::compression_layout_problem(shape).empty();
    };
    const bool gems = b.schedule == spec::Schedule::kGems;
    if (gems && (b.grid > 0 || l.split_ranks > 1 || ep > 1)) {
      reject("GEMS with a tensor grid, context, spatial or expert parallelism", kConfigurations);
      return;
    }
    const size_t nc =
        out_.compressions.size() > 1 && !gems && compressible() ? out_.compressions.size() : 1;
    const auto variants_here =
        static_cast<int64_t>((b.nt - (b.repeats_bulk ? 1 : 0)) * b.nd * b.ng * b.np * b.nb);
    c.grid = b.grid;
    if (!configuration_allowed(l, b, c, off, ep, static_cast<int64_t>(nc) * variants_here)) return;
    for (size_t k = 0; k < nc; ++k) {
      if (out_.compressions[k].kind == spec::CompressionKind::kPowersgd &&
          !spec::powersgd_problem(out_.grids[b.grid]).empty()) {
        reject("PowerSGD on a 3D tensor grid", kConfigurations, variants_here);
        continue;
      }
      if (out_.compressions[k].kind == spec::CompressionKind::kSparcml &&
          !spec::sparcml_problem(l.dp, out_.compressions[k].sparse_algorithm).empty()) {
        reject("SparCML's recursive doubling on dp not a power of two", kConfigurations,
               variants_here);
        continue;
      }
      c.compression = static_cast<uint8_t>(k);
      for (size_t v = 0; v <= (k == 0 ? servable(l, b, c, off, ep) : 0); ++v) {
        c.servers = static_cast<uint8_t>(v);
        // Servers reduce no buckets: the bucket and its overlap stay the stack's ([0]).
        const size_t nb = v > 0 ? 1 : b.nb, nd = v > 0 ? 1 : b.nd;
        // The knobs that change the memory (the TP overlap's stage costs, the bucket size)
        // outermost: the estimator reuses a memory estimate while only the overlaps change.
        for (size_t t = 0; t < b.nt; ++t)
          for (size_t bi = 0; bi < nb && t != b.skipped_t; ++bi)
            for (size_t d = 0; d < nd; ++d)
              for (size_t g = 0; g < b.ng; ++g)
                for (size_t q = 0; q < b.np; ++q) {
                  c.stack = static_cast<uint8_t>(variants_.index(t, d, g, q, bi));
                  out_.candidates.push_back(c);
                }
      }
    }
    c.servers = 0;
  }

  // How many of the request's parameter servers a configuration may exchange through (all or
  // none: spec::parameter_server_problem reads no bound but the staleness, which it does not
  // refuse within the request's), and whether its stack runs them.
  size_t servable(const Layout& l, const Branch& b, const Candidate& c, uint8_t off, int64_t ep) {
    if (out_.servers.empty() || b.schedule == spec::Schedule::kGems) return 0;
    spec::Plan shape = shape_of(l, b, off, ep);
    shape.schedule = b.schedule;
    shape.spatial = l.split->spatial;
    shape.cp = l.split->cp;
    shape.offload.activations =
        c.offload_activations ? spec::OffloadTarget::kHost : spec::OffloadTarget::kNone;
    shape.parameter_server = out_.servers.front();
    if (!spec::parameter_server_problem(shape).empty()) return 0;
    if (!runs([](const spec::StackSupport& s) { return s.parameter_server; })) {
      reject(not_run_ + "parameter servers", kConfigurations);
      return 0;
    }
    return out_.servers.size();
  }

  const SearchRequest& r_;
  Enumeration& out_;
  const spec::ModelSpec& m_;
  const bool transformer_;
  const int64_t layers_;
  const spec::Stack stack_;
  const StackVariants variants_;
  const spec::StackSupport* support_;
  const std::string not_run_;
  const int64_t seq_len_;
  spec::Dtype compute_ = spec::Dtype::kBf16;
  int64_t grad_bytes_ = 0;
  double smallest_bucket_ = 0;
  std::vector<int64_t> ep_degrees_;
  std::map<int64_t, std::vector<uint8_t>> grids_by_tp_;
  std::map<int64_t, double> gradient_bytes_by_tp_;
};

}  // namespace

Enumeration enumerate_plans(const SearchRequest& r) {
  check_request(r);
  Enumeration out;
  Enumerator(r, out).run();
  return out;
}

}  // namespace sextant::planner
