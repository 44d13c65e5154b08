// Plan JSON decoding, the rules inside a plan, and the rules between a plan and a model.
#include "sextant/spec/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <functional>
#include <numeric>

#include "sextant/spec/branch_parallel.hpp"
#include "sextant/spec/channel_split.hpp"
#include "sextant/spec/context_parallel.hpp"
#include "sextant/spec/expert_parallel.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/limits.hpp"
#include "sextant/spec/parameter_server.hpp"
#include "sextant/spec/pipeline_schedule.hpp"
#include "sextant/spec/spatial_split.hpp"
#include "sextant/spec/tensor_grid.hpp"

namespace sextant::spec {

namespace {
constexpr std::array<std::pair<std::string_view, Schedule>, 6> kSchedules{
    {{"gpipe", Schedule::kGpipe},
     {"1f1b", Schedule::k1F1B},
     {"interleaved", Schedule::kInterleaved},
     {"pipedream-2bw", Schedule::kPipeDream2BW},
     {"pipedream", Schedule::kPipeDream},
     {"gems", Schedule::kGems}}};
constexpr std::array<std::pair<std::string_view, Recompute>, 3> kRecomputes{
    {{"none", Recompute::kNone}, {"selective", Recompute::kSelective}, {"full", Recompute::kFull}}};
constexpr std::array<std::pair<std::string_view, OffloadTarget>, 3> kOffloadTargets{
    {{"none", OffloadTarget::kNone},
     {"host", OffloadTarget::kHost},
     {"nvme", OffloadTarget::kNvme}}};
constexpr std::array<std::pair<std::string_view, CompressionKind>, 6> kCompressionKinds{
    {{"none", CompressionKind::kNone},
     {"qsgd", CompressionKind::kQsgd},
     {"topk", CompressionKind::kTopk},
     {"onebit", CompressionKind::kOnebit},
     {"powersgd", CompressionKind::kPowersgd},
     {"sparcml", CompressionKind::kSparcml}}};
constexpr std::array<std::pair<std::string_view, SparseAlgorithm>, 2> kSparseAlgorithms{
    {{"recursive_doubling", SparseAlgorithm::kRecursiveDoubling},
     {"split_allgather", SparseAlgorithm::kSplitAllGather}}};
constexpr std::array<std::pair<std::string_view, ContextAlgorithm>, 3> kContextAlgorithms{
    {{"ring", ContextAlgorithm::kRing},
     {"all-gather", ContextAlgorithm::kAllGather},
     {"all-to-all", ContextAlgorithm::kAllToAll}}};
constexpr std::array<std::pair<std::string_view, ChannelAlgorithm>, 4> kChannelAlgorithms{
    {{"whole", ChannelAlgorithm::kWholeInput},
     {"x", ChannelAlgorithm::kStationaryX},
     {"y", ChannelAlgorithm::kStationaryY},
     {"w", ChannelAlgorithm::kStationaryW}}};
const Range kPositiveInt = Range::at_least(1);
}  // namespace

EnumNames<ChannelAlgorithm> channel_algorithm_names() {
  return kChannelAlgorithms;
}

bool asynchronous(Schedule schedule) {
  return schedule == Schedule::kPipeDream2BW || schedule == Schedule::kPipeDream;
}

EnumNames<SparseAlgorithm> sparse_algorithm_names() {
  return kSparseAlgorithms;
}

EnumNames<ContextAlgorithm> context_algorithm_names() {
  return kContextAlgorithms;
}

EnumNames<CompressionKind> compression_kind_names() {
  return kCompressionKinds;
}

EnumNames<OffloadTarget> offload_target_names() {
  return kOffloadTargets;
}

EnumNames<Schedule> schedule_names() {
  return kSchedules;
}
EnumNames<Recompute> recompute_names() {
  return kRecomputes;
}

std::string spatial_text(const SpatialSplit& split) {
  if (split.d > 1) return fmt::format("{}x{}x{}", split.d, split.h, split.w);
  return fmt::format("{}x{}", split.h, split.w);
}

std::string Plan::name() const {
  std::string s = fmt::format("dp{}.tp{}.pp{}.z{}.mb{}", dp, tp, pp, zero, micro_batch);
  if (sequence_parallel) s += ".sp";
  if (branch_parallel) s += ".super";
  if (pp > 1) {
    switch (schedule) {
      case Schedule::kGpipe:
        s += ".gpipe";
        break;
      case Schedule::k1F1B:
        s += ".1f1b";
        break;
      case Schedule::kInterleaved:
        s += fmt::format(".il{}", virtual_stages);
        break;
      case Schedule::kGems:
        s += ".gems";
        break;
      case Schedule::kPipeDream2BW:
      case Schedule::kPipeDream:
        break;  // named below, also without stages
    }
  }
  // With one stage still a different training rule (one-version-stale gradients): named too.
  if (schedule == Schedule::kPipeDream2BW) s += ".2bw";
  if (schedule == Schedule::kPipeDream) s += ".pipedream";
  if (!stage_layers.empty()) s += ".split";  // a layer split of its own, not the even one
  if (recompute == Recompute::kSelective) s += ".rc-sel";
  if (recompute == Recompute::kFull) s += ".rc-full";
  if (recompute == Recompute::kFull && recompute_layers > 0) s += std::to_string(recompute_layers);
  if (offload.optimizer != OffloadTarget::kNone)
    s += offload.optimizer == OffloadTarget::kNvme ? ".off-opt-nvme" : ".off-opt";
  if (offload.params != OffloadTarget::kNone)
    s += offload.params == OffloadTarget::kNvme ? ".off-par-nvme" : ".off-par";
  if (offload.activations != OffloadTarget::kNone) {
    s += ".off-act";
    if (offload.activation_layers > 0) s += std::to_string(offload.activation_layers);
    if (offload.prefetch_layers > 1) s += fmt::format("-pf{}", offload.prefetch_layers);
  }
  switch (compression.kind) {
    case CompressionKind::kNone:
      break;
    case CompressionKind::kQsgd:
      s += fmt::format(".qsgd{}b{}", compression.bits, compression.bucket);
      break;
    case CompressionKind::kTopk:
      s += fmt::format(".topk{:g}", compression.ratio);
      break;
    case CompressionKind::kOnebit:
      s += fmt::format(".onebit{}", compression.bucket);
      break;
    case CompressionKind::kPowersgd:
      s += fmt::format(".powersgd{}", compression.rank);
      break;
    case CompressionKind::kSparcml:
      s += fmt::format(".sparcml{:g}", compression.ratio);
      if (compression.sparse_algorithm == SparseAlgorithm::kSplitAllGather) s += "split";
      break;
  }
  if (compression.any() && !compression.error_feedback) s += "-noef";
  if (parameter_server.enabled) s += fmt::format(".ps{}", parameter_server.staleness);
  if (spatial.any())
    s += spatial.d > 1 ? fmt::format(".dhw{}", spatial_text(spatial))
                       : fmt::format(".hw{}", spatial_text(spatial));
  if (cp > 1) {
    s += fmt::format(".cp{}", cp);
    if (cp_algorithm == ContextAlgorithm::kAllGather) s += "ag";
    if (cp_algorithm == ContextAlgorithm::kAllToAll) s += "a2a";
  }
  if (ep > 1) s += fmt::format(".ep{}", ep);
  if (tp_grid.any()) s += ".g" + tensor_grid_text(tp_grid);
  if (!channel_algorithms.empty()) s += ".chan";  // a choice of its own, not the byte rule's
  s += op_splits_text(per_op);
  // Collectives run by a named algorithm, not the library's choice: ".all_reduce-rabenseifner".
  for (const auto& [kind, algorithm] : collective_algorithms)
    s += fmt::format(".{}-{}", enum_name(collective_kind_names(), kind),
                     enum_name(collective_algorithm_names(), algorithm));
  return s;
}

namespace {

using ProblemSink = std::function<void(const std::string& field, const std::string& value,
                                       const std::string& expected)>;

// The "compression" object of a plan (or of --compression): each knob only where its kind reads
// it.
GradientCompression read_compression(ObjectReader& c) {
  GradientCompression g;
  g.kind = c.enumeration("kind", compression_kind_names()).value_or(CompressionKind::kNone);
  // Each knob only where its kind reads it: a "bits" on top-k is a mistake, not a default.
  auto applies = [&](std::string_view key, bool reads, std::string_view kinds) {
    if (!reads)
      if (const Json* v = c.value(key, Presence::kOptional))
        c.problem(key, short_dump(*v), fmt::format("applies to kind {} only", kinds));
    return reads;
  };
  const bool qsgd = g.kind == CompressionKind::kQsgd;
  const bool scaled = qsgd || g.kind == CompressionKind::kOnebit;
  if (applies("bits", qsgd, "\"qsgd\""))
    g.bits = c.integer("bits", Range::between(2, 8), Presence::kOptional).value_or(g.bits);
  if (applies("bucket", scaled, "\"qsgd\" and \"onebit\""))
    g.bucket = c.integer("bucket", Range::between(1, static_cast<double>(kMaxCompressionBucket)),
                         Presence::kOptional)
                   .value_or(g.bucket);
  if (applies("ratio", selects_topk(g.kind), "\"topk\" and \"sparcml\""))
    g.ratio = c.number("ratio", Range::fraction(), Presence::kOptional).value_or(g.ratio);
  if (applies("algorithm", g.kind == CompressionKind::kSparcml, "\"sparcml\""))
    g.sparse_algorithm = c.enumeration("algorithm", sparse_algorithm_names(), Presence::kOptional)
                             .value_or(g.sparse_algorithm);
  if (applies("rank", g.kind == CompressionKind::kPowersgd, "\"powersgd\""))
    g.rank = c.integer("rank", Range::between(1, static_cast<double>(kMaxPowerSgdRank)),
                       Presence::kOptional)
                 .value_or(g.rank);
  if (applies("error_feedback", g.any(),
              "\"qsgd\", \"topk\", \"onebit\", \"powersgd\" and \"sparcml\""))
    g.error_feedback = c.boolean("error_feedback", Presence::kOptional).value_or(true);
  c.finish();
  return g;
}

// The values of a compression's knobs, whatever the plan.
void check_compression_knobs(const GradientCompression& c, const ProblemSink& problem) {
  if (!c.any()) return;
  if (c.kind == CompressionKind::kQsgd && c.bits != 2 && c.bits != 4 && c.bits != 8)
    problem("compression/bits", std::to_string(c.bits),
            "must be 2, 4 or 8 (a sign bit and 2^(bits-1) - 1 levels, whole codes per 32-bit "
            "word)");
  if (c.bucket < 1 || c.bucket > kMaxCompressionBucket)
    problem("compression/bucket", std::to_string(c.bucket),
            fmt::format("must be between 1 and {} elements per scale", kMaxCompressionBucket));
  if (!(c.ratio > 0 && c.ratio < 1))
    problem("compression/ratio", fmt::format("{:g}", c.ratio),
            "must be in (0, 1): the fraction of gradient elements sent");
  if (c.rank < 1 || c.rank > kMaxPowerSgdRank)
    problem("compression/rank", std::to_string(c.rank),
            fmt::format("must be between 1 and {} columns of P and Q", kMaxPowerSgdRank));
}

// The rules a plan obeys on its own, without a model or a cluster: one home for plan files and
// flags (plan_from_json) and for plans built in code (validate_plan).
void check_plan_rules(const Plan& p, const ProblemSink& problem) {
  // (A plan file's reader has refused these already; a plan built in code may hold anything.)
  if (p.dp < 1 || p.tp < 1 || p.pp < 1 || p.micro_batch < 1 || p.global_batch < 1 ||
      p.virtual_stages < 1 || p.spatial.h < 1 || p.spatial.w < 1 || p.spatial.d < 1 || p.cp < 1 ||
      p.ep < 1) {
    problem("dp",
            fmt::format("dp {}, tp {}, pp {}, spatial {}, cp {}, ep {}, micro_batch {}, "
                        "global_batch {}, virtual_stages {}",
                        p.dp, p.tp, p.pp, spatial_text(p.spatial), p.cp, p.ep, p.micro_batch,
                        p.global_batch, p.virtual_stages),
            "every degree and batch size must be >= 1");
    return;
  }
  // In double: six degrees of up to 2^24 each multiply past int64.
  if (static_cast<double>(p.dp) * static_cast<double>(p.tp) * static_cast<double>(p.pp) *
          static_cast<double>(p.spatial.ranks()) * static_cast<double>(p.cp) >
      static_cast<double>(kMaxRanks)) {
    if (p.cp > 1) {
      problem("dp", fmt::format("{} (dp*tp*pp*cp = {}*{}*{}*{})", p.dp, p.dp, p.tp, p.pp, p.cp),
              fmt::format("dp*tp*pp*cp must be at most {} ranks", kMaxRanks));
    } else if (p.spatial.any()) {
      problem("dp",
              fmt::format("{} (dp*tp*pp*spatial = {}*{}*{}*{})", p.dp, p.dp, p.tp, p.pp,
                          spatial_text(p.spatial)),
              fmt::format("dp*tp*pp*spatial must be at most {} ranks", kMaxRanks));
    } else {
      problem("dp", fmt::format("{} (dp*tp*pp = {}*{}*{})", p.dp, p.dp, p.tp, p.pp),
              fmt::format("dp*tp*pp must be at most {} ranks", kMaxRanks));
    }
    return;
  }
  if (p.global_batch % (p.dp * p.micro_batch) != 0) {
    problem("global_batch", std::to_string(p.global_batch),
            fmt::format("must be a multiple of dp*micro_batch ({}*{} = {})", p.dp, p.micro_batch,
                        p.dp * p.micro_batch));
  } else if (std::string count = micro_batch_count_problem(p.micro_batches()); !count.empty()) {
    problem("global_batch", std::to_string(p.global_batch), count);
  }
  if (p.virtual_stages > 1 && p.schedule != Schedule::kInterleaved) {
    problem("virtual_stages", std::to_string(p.virtual_stages),
            "must be 1 unless schedule is \"interleaved\"");
  }
  if (p.schedule == Schedule::kInterleaved && p.pp > 1 && p.virtual_stages < 2) {
    problem("virtual_stages", std::to_string(p.virtual_stages),
            "must be >= 2 with the interleaved schedule");
  }
  if (!p.stage_layers.empty() &&
      static_cast<int64_t>(p.stage_layers.size()) != p.pp * p.virtual_stages) {
    problem("stage_layers", fmt::format("{} entries", p.stage_layers.size()),
            fmt::format("must have pp*virtual_stages = {} entries", p.pp * p.virtual_stages));
  }
  if (p.sequence_parallel && p.tp < 2) {
    problem("sequence_parallel", "true", "needs tp > 1");
  }
  if (p.recompute_layers < 0) {
    problem("recompute_layers", std::to_string(p.recompute_layers),
            "must be >= 1 (the first layers of each chunk recomputed), or 0 for all");
  } else if (p.recompute_layers > 0 && p.recompute != Recompute::kFull) {
    problem("recompute_layers", std::to_string(p.recompute_layers),
            "applies to recompute \"full\" only (Megatron-LM --recompute-method block)");
  }
  // DeepSpeed's rules (docs/config-json: offload_optimizer "valid only with stage 1, 2 and 3",
  // offload_param "valid only with stage 3"): the offloaded state is the rank's ZeRO shard.
  if (p.offload.optimizer != OffloadTarget::kNone && p.zero < 1) {
    problem("offload/optimizer",
            std::string(enum_name(offload_target_names(), p.offload.optimizer)),
            "needs zero >= 1 (ZeRO-Offload moves the rank's optimizer shard)");
  }
  if (p.offload.params != OffloadTarget::kNone && p.zero != 3) {
    problem("offload/params", std::string(enum_name(offload_target_names(), p.offload.params)),
            "needs zero 3 (parameters are offloaded as ZeRO-3 shards)");
  }
  if (p.offload.activations == OffloadTarget::kNvme) {
    problem("offload/activations", "nvme",
            "\"host\" or \"none\" (activations are offloaded to host memory, as Megatron-LM's "
            "and Transformer Engine's CPU offloading do)");
  }
  if (p.offload.activation_layers < 0) {
    problem("offload/activation_layers", std::to_string(p.offload.activation_layers),
            "must be >= 1 (the first layers of each chunk offloaded), or 0 for all");
  } else if (p.offload.activation_layers > 0 && p.offload.activations == OffloadTarget::kNone) {
    problem("offload/activation_layers", std::to_string(p.offload.activation_layers),
            "applies with offload/activations \"host\" only");
  }
  if (p.offload.prefetch_layers < 1) {
    problem("offload/prefetch_layers", std::to_string(p.offload.prefetch_layers),
            "must be >= 1 (the layers below the running one whose reloads are issued)");
  } else if (p.offload.prefetch_layers > 1 && p.offload.activations == OffloadTarget::kNone) {
    problem("offload/prefetch_layers", std::to_string(p.offload.prefetch_layers),
            "applies with offload/activations \"host\" only");
  }
  const GradientCompression& c = p.compression;
  if (c.any()) {
    const std::string kind(enum_name(compression_kind_names(), c.kind));
    if (std::string why = compression_problem(p, c); !why.empty())
      problem("compression/kind", kind, why);
    check_compression_knobs(c, problem);
  }
  if (p.spatial.any()) {
    // What the spatial split does not (yet) combine with. The ranks splitting a sample hold whole
    // layers and are replicas for their weights' gradients (Plan::replicas), so ZeRO shards over
    // dp x spatial ranks as it does over dp x cp.
    const std::string split = spatial_text(p.spatial);
    if (p.offload.state()) problem("spatial", split, "runs without optimizer or parameter offload");
    if (p.cp > 1)
      problem("cp", std::to_string(p.cp),
              "splits a transformer's sequences; a CNN's samples split with spatial");
  }
  if (std::string ep = expert_parallel_problem(p); !ep.empty())
    problem("ep", std::to_string(p.ep), ep);
  if (std::string grid = tensor_grid_problem(p); !grid.empty())
    problem("tp_grid", tensor_grid_text(p.tp_grid), grid);
  if (std::string async = pipedream_2bw_problem(p); !async.empty())
    problem("schedule", "\"pipedream-2bw\"", async);
  if (std::string async = pipedream_problem(p); !async.empty())
    problem("schedule", "\"pipedream\"", async);
  if (std::string gems = gems_problem(p); !gems.empty()) problem("schedule", "\"gems\"", gems);
  if (std::string ps = parameter_server_problem(p); !ps.empty())
    problem("parameter_server", fmt::format("staleness {}", p.parameter_server.staleness), ps);
  if (std::string chosen = channel_algorithms_problem(p.channel_algorithms, p.tp); !chosen.empty())
    problem("channel_algorithms", fmt::format("{} entries", p.channel_algorithms.size()), chosen);
  if (std::string why = per_op_problem(p); !why.empty())
    problem("per_op", op_splits_text(p.per_op).substr(1), why);
  if (p.zero >= 2 && p.pp > 1) {
    problem("zero", std::to_string(p.zero),
            "ZeRO-2/3 shard gradients that pipeline parallelism accumulates over "
            "micro-batches: use zero <= 1 with pp > 1");
  }
}

}  // namespace

Plan plan_from_json(const Json& json, const std::string& source) {
  Diagnostics diag(source);
  ObjectReader r(json, "", diag);
  if (!r.is_object()) diag.throw_if_any();
  Plan p;
  r.expect_schema(kPlanSchema);
  const Range degree = Range::between(1, static_cast<double>(kMaxRanks));
  p.dp = r.integer("dp", degree).value_or(1);
  p.tp = r.integer("tp", degree).value_or(1);
  p.pp = r.integer("pp", degree).value_or(1);
  p.zero = static_cast<int>(r.integer("zero", Range::between(0, 3)).value_or(0));
  p.sequence_parallel = r.boolean("sequence_parallel", Presence::kOptional).value_or(false);
  p.branch_parallel = r.boolean("branch_parallel", Presence::kOptional).value_or(false);
  const Range batch = Range::between(1, static_cast<double>(kMaxGlobalBatch));
  p.micro_batch = r.integer("micro_batch", batch).value_or(1);
  p.global_batch = r.integer("global_batch", batch).value_or(1);
  p.schedule =
      r.enumeration("schedule", schedule_names(), Presence::kOptional).value_or(p.schedule);
  const Range layers = Range::between(1, static_cast<double>(kMaxLayers));
  p.virtual_stages = r.integer("virtual_stages", layers, Presence::kOptional).value_or(1);
  p.stage_layers =
      r.integer_array("stage_layers", layers, Presence::kOptional).value_or(std::vector<int64_t>{});
  p.recompute =
      r.enumeration("recompute", recompute_names(), Presence::kOptional).value_or(p.recompute);
  p.recompute_layers =
      r.integer("recompute_layers", Range::between(0, static_cast<double>(kMaxLayers)),
                Presence::kOptional)
          .value_or(0);
  // Knobs of the software stack that older plans kept at the top level.
  for (const auto& [old_key, knob] : std::array<std::pair<std::string_view, std::string_view>, 4>{
           {{"dp_bucket_bytes", "dp_bucket_bytes"},
            {"overlap_dp_comm", "dp_overlap"},
            {"fsdp_prefetch", "zero3_prefetch"},
            {"overlap_pp_comm", "pp_overlap"}}}) {
    if (const Json* v = r.value(old_key, Presence::kOptional))
      r.problem(old_key, short_dump(*v), fmt::format("moved to /stack/{}", knob));
  }
  if (const Json* stack = r.value("stack", Presence::kOptional)) {
    try {
      p.stack = stack_from_plan_json(*stack, source, "/stack");
    } catch (const InputError& e) {
      for (const Problem& problem : e.problems())
        diag.add(problem.pointer, problem.value, problem.expected);
    }
  }
  if (auto o = r.object("offload", Presence::kOptional)) {
    p.offload.optimizer = o->enumeration("optimizer", offload_target_names(), Presence::kOptional)
                              .value_or(OffloadTarget::kNone);
    p.offload.params = o->enumeration("params", offload_target_names(), Presence::kOptional)
                           .value_or(OffloadTarget::kNone);
    p.offload.activations =
        o->enumeration("activations", offload_target_names(), Presence::kOptional)
            .value_or(OffloadTarget::kNone);
    p.offload.activation_layers =
        o->integer("activation_layers", Range::between(0, static_cast<double>(kMaxLayers)),
                   Presence::kOptional)
            .value_or(0);
    p.offload.prefetch_layers =
        o->integer("prefetch_layers", Range::between(1, static_cast<double>(kMaxLayers)),
                   Presence::kOptional)
            .value_or(1);
    o->finish();
  }
  if (auto c = r.object("compression", Presence::kOptional)) p.compression = read_compression(*c);
  if (auto ps = r.object("parameter_server", Presence::kOptional)) {
    p.parameter_server.enabled = true;
    p.parameter_server.staleness =
        ps->integer("staleness", Range::between(0, static_cast<double>(kMaxStaleness)),
                    Presence::kOptional)
            .value_or(0);
    ps->finish();
  }
  const bool cp_given = r.value("cp", Presence::kOptional) != nullptr;
  const std::optional<int64_t> cp = r.integer("cp", degree, Presence::kOptional);
  p.cp = cp.value_or(1);
  if (const Json* algo = r.value("cp_algorithm", Presence::kOptional)) {
    if (p.cp > 1 || (cp_given && !cp)) {  // (a cp that is itself wrong is reported alone)
      p.cp_algorithm = r.enumeration("cp_algorithm", context_algorithm_names(), Presence::kOptional)
                           .value_or(p.cp_algorithm);
    } else {
      r.problem("cp_algorithm", short_dump(*algo), "applies with cp > 1 only");
    }
  }
  p.ep = r.integer("ep", degree, Presence::kOptional).value_or(1);
  if (auto grid = r.integer_array("tp_grid", degree, Presence::kOptional)) {
    if (grid->size() == 3) {
      p.tp_grid = {(*grid)[0], (*grid)[1], (*grid)[2]};
    } else {
      r.problem("tp_grid", fmt::format("{} entries", grid->size()),
                "must be [x, y, z], three grid axes whose product is tp");
    }
  }
  if (const Json* chosen = r.array("channel_algorithms", Presence::kOptional)) {
    for (size_t i = 0; i < chosen->size(); ++i) {
      const Json& e = (*chosen)[i];
      const std::string text = e.is_string() ? e.get<std::string>() : "";
      bool known = false;
      for (const auto& [name, algorithm] : channel_algorithm_names()) {
        if (name != text) continue;
        p.channel_algorithms.push_back(algorithm);
        known = true;
      }
      if (!known)
        diag.add(fmt::format("/channel_algorithms/{}", i), short_dump(e),
                 "\"x\", \"y\" or \"w\" (Dryden et al.'s stationary-x, -y, -w)");
    }
  }
  p.per_op = read_op_splits(r);
  if (auto sp = r.object("spatial", Presence::kOptional)) {
    p.spatial.h = sp->integer("h", degree, Presence::kOptional).value_or(1);
    p.spatial.w = sp->integer("w", degree, Presence::kOptional).value_or(1);
    p.spatial.d = sp->integer("d", degree, Presence::kOptional).value_or(1);
    sp->finish();
  }
  p.dtype = r.enumeration("dtype", dtype_names(), Presence::kOptional);
  p.seq_len = r.integer("seq_len", kPositiveInt, Presence::kOptional);
  if (auto algos = r.object("collective_algorithms", Presence::kOptional)) {
    for (const auto& [name, kind] : collective_kind_names()) {
      if (auto a = algos->enumeration(name, collective_algorithm_names(), Presence::kOptional))
        p.collective_algorithms[kind] = *a;
    }
    algos->finish();
  }
  p.model = r.string("model", Presence::kOptional).value_or("");
  p.cluster = r.string("cluster", Presence::kOptional).value_or("");
  r.value("predicted", Presence::kOptional);  // written by `sextant plan`, informational
  r.value("provenance", Presence::kOptional);
  r.finish();
  if (diag.ok())
    check_plan_rules(
        p, [&](const std::string& field, const std::string& value, const std::string& expected) {
          diag.add("/" + field, value, expected);
        });
  diag.throw_if_any();
  return p;
}

GradientCompression compression_from_text(const std::string& text, const std::string& source) {
  // kind[:knob=value,...] as the JSON object it stands for, read by the plan file's reader.
  Json j = Json::object();
  const size_t colon = text.find(':');
  j["kind"] = text.substr(0, colon);
  if (colon != std::string::npos) {
    std::string rest = text.substr(colon + 1);
    size_t at = 0;
    while (at <= rest.size()) {
      const size_t comma = std::min(rest.find(',', at), rest.size());
      const std::string item = rest.substr(at, comma - at);
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0)
        throw InputError(source, "", text,
                         "expected kind[:knob=value,...], e.g. qsgd:bits=4,bucket=512, "
                         "topk:ratio=0.001,error_feedback=false or "
                         "sparcml:algorithm=split_allgather");
      const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
      if (value == "true" || value == "false") {
        j[key] = value == "true";
      } else {
        try {
          size_t used = 0;
          const double number = std::stod(value, &used);
          if (used != value.size()) throw std::invalid_argument(value);
          if (std::floor(number) == number && value.find_first_of(".eE") == std::string::npos) {
            j[key] = static_cast<int64_t>(number);
          } else {
            j[key] = number;
          }
        } catch (const std::exception&) {
          j[key] = value;  // a name (sparcml's algorithm); the reader checks each key's type
        }
      }
      at = comma + 1;
    }
  }
  Diagnostics diag(source);
  ObjectReader r(j, "", diag);
  GradientCompression c = read_compression(r);
  if (diag.ok())
    check_compression_knobs(
        c, [&](const std::string& field, const std::string& value, const std::string& expected) {
          diag.add("/" + field.substr(field.find('/') + 1), value, expected);
        });
  diag.throw_if_any();
  return c;
}

std::vector<GradientCompression> searched_compressions(const std::string& text,
                                                       const std::string& source) {
  GradientCompression c = compression_from_text(text, source);
  if (c.kind != CompressionKind::kSparcml || text.find("algorithm=") != std::string::npos)
    return {c};
  GradientCompression split = c;
  split.sparse_algorithm = SparseAlgorithm::kSplitAllGather;
  return {c, split};
}

namespace {

// A compression's plan-file object: its kind and the knobs it reads.
Json compression_json(const GradientCompression& c) {
  Json cj = {{"kind", enum_name(compression_kind_names(), c.kind)},
             {"error_feedback", c.error_feedback}};
  if (c.kind == CompressionKind::kQsgd) cj["bits"] = c.bits;
  if (c.kind == CompressionKind::kQsgd || c.kind == CompressionKind::kOnebit)
    cj["bucket"] = c.bucket;
  if (selects_topk(c.kind)) cj["ratio"] = c.ratio;
  if (c.kind == CompressionKind::kPowersgd) cj["rank"] = c.rank;
  if (c.kind == CompressionKind::kSparcml)
    cj["algorithm"] = enum_name(sparse_algorithm_names(), c.sparse_algorithm);
  return cj;
}

}  // namespace

std::string compression_text(const GradientCompression& c) {
  std::string text(enum_name(compression_kind_names(), c.kind));
  if (!c.any()) return text;
  const Json j = compression_json(c);
  char sep = ':';
  for (const char* key : {"bits", "bucket", "ratio", "rank", "algorithm", "error_feedback"}) {
    if (!j.contains(key)) continue;
    const Json& v = j[key];
    text += sep;
    text += key;
    text += '=';
    if (v.is_string()) {
      text += v.get<std::string>();
    } else if (v.is_number_float()) {
      text += fmt::format("{:g}", v.get<double>());
    } else {
      text += v.dump();
    }
    sep = ',';
  }
  return text;
}

Json to_json(const Plan& p) {
  Json j = {{"schema", kPlanSchema},
            {"dp", p.dp},
            {"tp", p.tp},
            {"pp", p.pp},
            {"zero", p.zero},
            {"sequence_parallel", p.sequence_parallel},
            {"micro_batch", p.micro_batch},
            {"global_batch", p.global_batch},
            {"schedule", enum_name(schedule_names(), p.schedule)},
            {"virtual_stages", p.virtual_stages},
            {"recompute", enum_name(recompute_names(), p.recompute)}};
  if (p.recompute_layers > 0) j["recompute_layers"] = p.recompute_layers;
  if (p.branch_parallel) j["branch_parallel"] = true;
  if (p.stack) j["stack"] = to_json(*p.stack);
  if (p.offload.any()) {
    j["offload"] = {{"optimizer", enum_name(offload_target_names(), p.offload.optimizer)},
                    {"params", enum_name(offload_target_names(), p.offload.params)},
                    {"activations", enum_name(offload_target_names(), p.offload.activations)}};
    if (p.offload.activation_layers > 0)
      j["offload"]["activation_layers"] = p.offload.activation_layers;
    if (p.offload.prefetch_layers > 1) j["offload"]["prefetch_layers"] = p.offload.prefetch_layers;
  }
  if (p.compression.any()) j["compression"] = compression_json(p.compression);
  if (p.parameter_server.enabled)
    j["parameter_server"] = {{"staleness", p.parameter_server.staleness}};
  if (p.spatial.any()) {
    j["spatial"] = {{"h", p.spatial.h}, {"w", p.spatial.w}};
    if (p.spatial.d > 1) j["spatial"]["d"] = p.spatial.d;
  }
  if (p.cp > 1) {
    j["cp"] = p.cp;
    j["cp_algorithm"] = enum_name(context_algorithm_names(), p.cp_algorithm);
  }
  if (p.ep > 1) j["ep"] = p.ep;
  if (p.tp_grid.any()) j["tp_grid"] = {p.tp_grid.x, p.tp_grid.y, p.tp_grid.z};
  if (!p.channel_algorithms.empty()) {
    Json a = Json::array();
    for (ChannelAlgorithm c : p.channel_algorithms)
      a.push_back(std::string(enum_name(channel_algorithm_names(), c)));
    j["channel_algorithms"] = a;
  }
  if (!p.per_op.empty()) j["per_op"] = op_splits_json(p.per_op);
  if (!p.stage_layers.empty()) j["stage_layers"] = p.stage_layers;
  if (p.dtype) j["dtype"] = enum_name(dtype_names(), *p.dtype);
  if (p.seq_len) j["seq_len"] = *p.seq_len;
  if (!p.collective_algorithms.empty()) {
    Json a = Json::object();
    for (const auto& [kind, algo] : p.collective_algorithms)
      a[std::string(enum_name(collective_kind_names(), kind))] =
          enum_name(collective_algorithm_names(), algo);
    j["collective_algorithms"] = a;
  }
  if (!p.model.empty()) j["model"] = p.model;
  if (!p.cluster.empty()) j["cluster"] = p.cluster;
  return j;
}

Stack plan_stack(const Plan& plan, bool gpu_cluster, ModelKind model) {
  if (plan.stack) return *plan.stack;
  return builtin_stack(default_stack_name(gpu_cluster, model));
}

Plan read_plan_file(const std::string& path) {
  return plan_from_json(read_json_file(path), path);
}

std::vector<bool> unit_activation_offload(const Plan& plan, int64_t units) {
  const bool on = plan.offload.activations != OffloadTarget::kNone;
  std::vector<bool> offloaded(static_cast<size_t>(std::max<int64_t>(units, 0)), on);
  if (!on || plan.offload.activation_layers <= 0) return offloaded;
  size_t unit = 0;
  for (int64_t count : stage_layer_counts(plan, units)) {
    for (int64_t i = 0; i < count && unit < offloaded.size(); ++i, ++unit)
      if (i >= plan.offload.activation_layers) offloaded[unit] = false;
  }
  return offloaded;
}

PlanAsRun as_run(const Plan& plan, const Stack& stack) {
  PlanAsRun run{plan, stack};
  const bool fsdp_zero2 = plan.zero == 2 && stack.zero2 == Zero2Impl::kFsdp &&
                          plan.replicas() > 1 && plan.pp == 1 && !asynchronous(plan.schedule) &&
                          plan.per_op.empty() && !plan.tp_grid.any() &&
                          !plan.parameter_server.enabled;
  if (!fsdp_zero2) return run;
  run.plan.zero = 3;
  run.stack.reshard_after_forward = ReshardAfterForward::kNone;
  if (run.plan.stack) run.plan.stack = run.stack;
  return run;
}

bool swaps_and_recomputes(const Plan& plan) {
  return plan.offload.activations != OffloadTarget::kNone && plan.offload.activation_layers > 0 &&
         plan.recompute == Recompute::kFull && plan.recompute_layers > 0;
}

std::vector<Recompute> unit_recompute(const Plan& plan, int64_t units) {
  std::vector<Recompute> modes(static_cast<size_t>(std::max<int64_t>(units, 0)), plan.recompute);
  if (plan.recompute != Recompute::kFull || plan.recompute_layers <= 0) return modes;
  const int64_t first = swaps_and_recomputes(plan) ? plan.offload.activation_layers : 0;
  size_t unit = 0;
  for (int64_t count : stage_layer_counts(plan, units)) {
    for (int64_t i = 0; i < count && unit < modes.size(); ++i, ++unit)
      if (i < first || i >= first + plan.recompute_layers) modes[unit] = Recompute::kNone;
  }
  return modes;
}

int64_t largest_stage_chunk(const Plan& plan, int64_t layers) {
  const std::vector<int64_t> counts = stage_layer_counts(plan, layers);
  return counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
}

std::vector<int64_t> stage_layer_counts(const Plan& plan, int64_t layers) {
  if (!plan.stage_layers.empty()) return plan.stage_layers;
  int64_t chunks = plan.chunks();
  std::vector<int64_t> counts(static_cast<size_t>(chunks), layers / chunks);
  int64_t rest = layers % chunks;
  for (int64_t i = 0; i < rest; ++i) counts[static_cast<size_t>(chunks - 1 - i)] += 1;
  return counts;
}

namespace {

// Number of "layers" a model can be split into along a pipeline.
int64_t pipeline_units(const ModelSpec& model) {
  switch (model.kind()) {
    case ModelKind::kTransformer:
      return model.transformer().layers;
    case ModelKind::kMlp:
      return static_cast<int64_t>(model.mlp().widths.size()) - 1;
    case ModelKind::kCnn: {
      // A bottleneck entry stands for `blocks` residual blocks, each a pipeline unit.
      int64_t units = 0;
      for (const CnnLayer& l : model.cnn().layers)
        units += l.kind == CnnLayerKind::kBottleneck ? l.blocks : 1;
      return units;
    }
  }
  return 1;
}

}  // namespace

void validate_plan(const Plan& p, const ModelSpec& model, int64_t ranks,
                   const std::string& source) {
  Diagnostics diag(source);
  auto add = [&](std::string field, std::string value, std::string expected) {
    diag.add("/" + field, std::move(value), std::move(expected));
  };
  // A plan built in code has not been through plan_from_json: its own rules first (the checks
  // below divide by its degrees).
  check_plan_rules(p, add);
  diag.throw_if_any();
  if (p.world_size() != ranks) {
    if (p.cp > 1) {
      add("dp",
          fmt::format("{} (dp*tp*pp*cp = {}*{}*{}*{} = {})", p.dp, p.dp, p.tp, p.pp, p.cp,
                      p.world_size()),
          fmt::format("dp*tp*pp*cp must equal the number of ranks ({})", ranks));
    } else if (p.spatial.any()) {
      add("dp",
          fmt::format("{} (dp*tp*pp*spatial = {}*{}*{}*{} = {})", p.dp, p.dp, p.tp, p.pp,
                      spatial_text(p.spatial), p.world_size()),
          fmt::format("dp*tp*pp*spatial must equal the number of ranks ({})", ranks));
    } else {
      add("dp",
          fmt::format("{} (dp*tp*pp = {}*{}*{} = {})", p.dp, p.dp, p.tp, p.pp, p.world_size()),
          fmt::format("dp*tp*pp must equal the number of ranks ({})", ranks));
    }
  }
  if (std::string problem = spatial_split_problem(model, p.spatial); !problem.empty())
    add("spatial", spatial_text(p.spatial), problem);
  const int64_t tokens =
      model.is_transformer() ? p.seq_len.value_or(model.transformer().seq_len) : 0;
  if (std::string problem = context_parallel_problem(model, tokens, p); !problem.empty())
    add("cp", std::to_string(p.cp), problem);
  if (std::string problem = expert_model_problem(model, p.ep); !problem.empty())
    add("ep", std::to_string(p.ep), problem);
  int64_t units = pipeline_units(model);
  if (p.chunks() > units) {
    add("pp", std::to_string(p.pp),
        fmt::format("pp*virtual_stages ({}) must not exceed the model's {} layers", p.chunks(),
                    units));
  }
  if (!p.stage_layers.empty()) {
    int64_t sum = std::accumulate(p.stage_layers.begin(), p.stage_layers.end(), int64_t{0});
    if (sum != units)
      add("stage_layers", std::to_string(sum),
          fmt::format("must add up to the model's {} layers", units));
  }
  if (p.recompute_layers > 0 && p.chunks() <= units) {
    // Up to the largest chunk: a chunk with fewer layers recomputes them all.
    const int64_t largest = largest_stage_chunk(p, units);
    if (p.recompute_layers > largest)
      add("recompute_layers", std::to_string(p.recompute_layers),
          fmt::format("must not exceed the layers of the largest stage chunk ({})", largest));
  }
  if (p.offload.activation_layers > 0 && p.chunks() <= units) {
    const int64_t largest = largest_stage_chunk(p, units);
    if (p.offload.activation_layers > largest)
      add("offload/activation_layers", std::to_string(p.offload.activation_layers),
          fmt::format("must not exceed the layers of the largest stage chunk ({})", largest));
  }
  // GEMS' end ranks each hold the first and the last stage: a table tied between them would be
  // read and updated twice on one rank.
  if (p.schedule == Schedule::kGems && model.is_transformer() &&
      model.transformer().tied_embeddings)
    add("schedule", "\"gems\"",
        "runs models without a tied embedding table (each end rank holds the first and the last "
        "stage): a Llama, an MLP or a CNN");
  if (!p.per_op.empty() && model.is_transformer() && model.transformer().moe.has_value())
    add("per_op", op_splits_text(p.per_op).substr(1),
        "splits the ops of a dense transformer's blocks, a CNN's or an MLP's fc layers: not a "
        "mixture of experts'");
  if (std::string problem = branch_parallel_problem(model, p); !problem.empty())
    add("branch_parallel", "true", problem);
  if (!p.channel_algorithms.empty() && model.kind() != ModelKind::kCnn)
    add("channel_algorithms", fmt::format("{} entries", p.channel_algorithms.size()),
        "chooses the algorithms of a CNN's convolutions under a channel split: a CNN only");
  if (model.is_transformer()) {
    const TransformerSpec& t = model.transformer();
    int64_t seq = p.seq_len.value_or(t.seq_len);
    if (p.tp_grid.any()) {
      if (std::string problem = tensor_grid_model_problem(model, p.tp_grid, p.micro_batch);
          !problem.empty())
        add("tp_grid", tensor_grid_text(p.tp_grid), problem);
    } else if (std::string problem = tensor_parallel_problem(model, p.tp); !problem.empty()) {
      add("tp", std::to_string(p.tp), problem);
    }
    if (p.sequence_parallel)
      if (std::string problem = sequence_parallel_problem(seq, p.tp); !problem.empty())
        add("sequence_parallel", "true", problem);
    if (std::string problem =
            moe_tensor_parallel_problem(model, p.tp_grid.any() ? 1 : p.tp, p.sequence_parallel);
        !problem.empty())
      add("sequence_parallel", p.sequence_parallel ? "true" : "false", problem);
    if (p.seq_len)
      if (std::string problem = seq_len_problem(model, *p.seq_len); !problem.empty())
        add("seq_len", std::to_string(*p.seq_len), problem);
    if (p.schedule == Schedule::kInterleaved && p.pp > 1 && p.micro_batches() % p.pp != 0)
      add("global_batch", std::to_string(p.global_batch),
          fmt::format("the interleaved schedule needs micro-batches per replica ({}) divisible "
                      "by pp ({})",
                      p.micro_batches(), p.pp));
  } else {
    // Under SUPER's branch split the tp ranks keep the channels whole.
    if (std::string problem = tensor_parallel_problem(model, p.branch_parallel ? 1 : p.tp);
        !problem.empty())
      add("tp", std::to_string(p.tp), problem);
    if (std::string problem = tensor_grid_model_problem(model, p.tp_grid, p.micro_batch);
        !problem.empty())
      add("tp_grid", tensor_grid_text(p.tp_grid), problem);
    if (p.seq_len) add("seq_len", std::to_string(*p.seq_len), seq_len_problem(model, *p.seq_len));
    if (p.sequence_parallel)
      add("sequence_parallel", "true",
          "applies to transformers (their sequence): use false for MLPs and CNNs");
    // The simulator and the executor re-run transformer blocks only (models::layer_recompute);
    // an MLP's or a CNN's layers keep their activations.
    if (p.recompute != Recompute::kNone)
      add("recompute", std::string(enum_name(recompute_names(), p.recompute)),
          "applies to transformer blocks only: use \"none\" for MLPs and CNNs");
  }
  diag.throw_if_any();
}

std::string compression_layout_problem(const Plan& p) {
  // A ZeRO shard is reduce-scattered, and the hooks compress only DDP's all-reduce.
  if (p.zero != 0)
    return "applies to the all-reduce of DDP (zero 0): ZeRO's reduce-scatter is not compressed";
  if (p.dp < 2) return "needs dp > 1: there is no gradient exchange";
  if (p.cp > 1)
    return "runs without context parallelism (cp 1): its exchange over dp x cp is not modelled";
  if (p.spatial.any())
    return "runs without a spatial split: the ranks splitting a sample sum their gradients with "
           "the replicas (dp x spatial), an exchange not modelled compressed";
  if (p.ep > 1)
    return "runs without expert parallelism (ep 1): the expert gradients' exchange over the "
           "expert replicas is not modelled compressed";
  return "";
}

std::string compression_problem(const Plan& plan, const GradientCompression& compression) {
  if (std::string layout = compression_layout_problem(plan); !layout.empty()) return layout;
  if (compression.kind == CompressionKind::kPowersgd) return powersgd_problem(plan.tp_grid);
  if (compression.kind == CompressionKind::kSparcml)
    return sparcml_problem(plan.dp, compression.sparse_algorithm);
  return "";
}

std::string sparcml_problem(int64_t dp, SparseAlgorithm algorithm) {
  if (algorithm == SparseAlgorithm::kSplitAllGather ||
      std::has_single_bit(static_cast<uint64_t>(dp)))
    return "";
  return fmt::format(
      "needs dp a power of two: SparCML's recursive doubling pairs the ranks by one bit of "
      "their index a round (dp is {})",
      dp);
}

bool selects_topk(CompressionKind kind) {
  return kind == CompressionKind::kTopk || kind == CompressionKind::kSparcml;
}

std::string powersgd_problem(const TensorGrid& grid) {
  if (grid.any())
    return "runs without tp_grid: the grid's weight blocks are sharded over z, not matrices a "
           "rank holds";
  return "";
}

std::string tensor_parallel_problem(const ModelSpec& model, int64_t tp) {
  if (tp == 1) return "";
  if (model.kind() == ModelKind::kCnn) return channel_split_problem(model.cnn(), tp);
  if (!model.is_transformer())
    return "tensor parallelism applies to transformers (heads) and CNNs (channels): use tp = 1 "
           "for MLPs";
  const TransformerSpec& t = model.transformer();
  std::vector<std::string> parts;
  if (t.heads % tp != 0) parts.push_back(fmt::format("the {} attention heads", t.heads));
  if (t.kv_heads % tp != 0) parts.push_back(fmt::format("the {} key/value heads", t.kv_heads));
  if (t.ffn_hidden % tp != 0) parts.push_back(fmt::format("ffn_hidden ({})", t.ffn_hidden));
  // Experts split over tp as the dense MLP is (Megatron-LM's expert tensor parallelism = tp).
  if (t.moe && t.moe->expert_ffn_hidden % tp != 0)
    parts.push_back(fmt::format("moe/expert_ffn_hidden ({})", t.moe->expert_ffn_hidden));
  if (parts.empty()) return "";
  std::string list = parts.front();
  for (size_t i = 1; i < parts.size(); ++i)
    list += (i + 1 == parts.size() ? " and " : ", ") + parts[i];
  return "must divide " + list;
}

std::string sequence_parallel_problem(int64_t seq_len, int64_t tp) {
  if (tp <= 1 || seq_len % tp == 0) return "";
  return fmt::format("needs tp ({}) to divide the sequence length ({})", tp, seq_len);
}

std::string seq_len_problem(const ModelSpec& model, int64_t seq_len) {
  if (!model.is_transformer()) return "applies to transformers only";
  const TransformerSpec& t = model.transformer();
  if (t.position_embedding == PositionEmbedding::kLearned && seq_len > t.max_positions)
    return fmt::format("must be <= the model's max_positions ({})", t.max_positions);
  if (seq_len > kMaxSeqLen) return fmt::format("must be <= {} (2^24)", kMaxSeqLen);
  return "";
}

}  // namespace sextant::spec
