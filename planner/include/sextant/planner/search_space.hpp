// The legal plans for a model on a number of GPUs of a cluster: every factorisation dp*tp*pp with
// tensor parallelism inside a node (unless allowed across), ZeRO stages, sequence parallelism,
// micro-batch sizes that divide the per-replica batch, pipeline schedules with the chunk counts
// that divide the layers, recompute modes (full recompute of every layer or of the first N of
// each chunk), even or balanced layer splits, and the overlap flags of the software stack that
// apply to the layout (each can be turned off, TP overlap down to bulk or none). What cannot run
// is counted by reason.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/executor_support.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::planner {

struct Candidate;

// The most staleness bounds one search tries (Candidate::servers' two bits).
inline constexpr size_t kMaxSearchedServerBounds = 3;

// A user bound on a plan dimension, e.g. "tp<=8", "pp=1", "zero>=1", "mb<=4",
// "recompute_layers=0" (full recompute of every layer only), "offload=0" (no training state
// offloaded; 1: the optimizer, 2: the optimizer and the parameters, to host memory; activations:
// "act_offload"), "spatial<=4" (ranks
// splitting each sample of a CNN), "cp<=8" (ranks splitting each sequence of a transformer;
// spatial and cp bound the same dimension, the ranks splitting each sample, which a model splits
// one way only), "ep>=2" (ranks splitting a mixture of experts' routed experts), "grid=0"
// (Megatron-LM's 1D tensor parallelism only; "grid=1": AxoNN's 3D tensor grids only),
// "act_offload=0" (no activations offloaded to host memory; 1: only plans that offload them),
// "ops<=2" (`plan --per-op` splits at most two ops their own way; "ops=0": none).
struct Constraint {
  enum class Dim {
    kDp,
    kTp,
    kPp,
    kZero,
    kMicroBatch,
    kVpp,
    kRecomputeLayers,
    kOffload,
    kSpatial,
    kCp,
    kEp,
    kGrid,
    kActivationOffload,
    kOps  // the ops a per-op plan splits its own way (Plan::per_op): a bound on --per-op's moves
  };
  enum class Op { kLess, kLessEqual, kEqual, kGreaterEqual, kGreater };
  Dim dim;
  Op op;
  int64_t value;
  // Whether a uniform candidate may be ranked (an ops bound passes every one: it bounds the
  // per-op search that refines them).
  bool allows(const Candidate& candidate) const;
  // Whether a plan's per-op splits keep to an ops bound (other dimensions: true).
  bool allows_splits(const spec::Plan& plan) const;
};
// Parses "tp<=8"; throws InputError naming the flag and listing the dimensions.
Constraint parse_constraint(const std::string& text);

// The stack knobs a search may vary from the request's stack, of those its preset lists as
// "tunable" (a flag the software has, e.g.
// Megatron-LM's --tp-comm-overlap, --overlap-grad-reduce, --overlap-param-gather,
// --no-overlap-p2p-communication, --ddp-bucket-size): overlaps turned down, the gradient bucket
// a quarter and four times the stack's. What a knob given on the command line pins is left out.
struct StackTuning {
  bool tp_overlap = true;
  bool dp_overlap = true;
  bool param_gather_overlap = true;
  bool pp_overlap = true;
  bool dp_bucket_bytes = true;
};

struct SearchRequest {
  spec::ModelSpec model;
  spec::ClusterSpec cluster;
  int64_t gpus = 1;
  int64_t global_batch = 1;
  std::optional<int64_t> seq_len;
  std::vector<Constraint> constraints;
  bool allow_tp_across_nodes = false;
  std::optional<spec::Dtype> dtype;
  std::optional<spec::Stack> stack;  // empty: the cluster kind's default stack
  StackTuning tuning;
  // Compressed gradient exchanges the search may choose for DDP layouts (zero 0, dp > 1), beside
  // the uncompressed one. They change what the model learns (models/gradient_compression.hpp):
  // the user opts in, the planner ranks them on time alone.
  std::vector<spec::GradientCompression> compressions;
  // PipeDream-2BW's asynchronous pipeline beside the flushing schedules when pp > 1: it also
  // changes what the model learns (gradients one weight version stale), so the user opts in.
  bool asynchronous_pipelines = false;
  // GEMS' MAST beside the other schedules on even pp: synchronous, but each candidate is priced
  // by the simulator (the closed form holds one direction), so the user asks for it.
  bool gems = false;
  // Parameter servers beside the all-reduce for DDP layouts, one per staleness bound listed (at
  // most kMaxSearchedServerBounds; spec/parameter_server.hpp): stale ones change what the model
  // learns, so the user opts in.
  std::vector<int64_t> parameter_server_staleness;
  // Set: only plans Sextant's executor runs so (spec::executor_problems), for searches whose plans
  // are run by it (`plan --verify`, `tune`); the rest count as rejected.
  std::optional<spec::ExecutorRun> executor;
};

// One configuration of a search in 28 bytes: what varies between the plans of a search (model,
// cluster, batch, dtype and sequence length are the request's). Enumeration::fill makes it a plan.
struct Candidate {
  int32_t dp = 1, tp = 1, pp = 1;
  int32_t micro_batch = 1;
  int16_t virtual_stages = 1;
  int16_t recompute_layers = 0;
  uint8_t zero : 2 = 0;
  uint8_t schedule : 3 = 0;   // spec::Schedule
  uint8_t recompute : 2 = 0;  // spec::Recompute
  bool sequence_parallel : 1 = false;
  // log2 of the ranks splitting each sample (Enumeration::sample_splits[spatial].ranks()): what
  // the spatial and cp constraints bound.
  uint8_t split_log2 : 5 = 0;
  // What lives in host memory (clusters with a host section): 0 nothing, 1 the optimizer
  // (ZeRO-Offload), 2 the optimizer and the parameters (ZeRO-Infinity, ZeRO-3).
  uint8_t offload : 2 = 0;
  // The activations of all transformer blocks but the last on the host (Megatron-LM's
  // --cpu-offloading with --cpu-offloading-num-layers layers - 1; Enumeration::fill).
  bool offload_activations : 1 = false;
  uint8_t ep_log2 : 4 = 0;  // log2 of the ranks splitting the routed experts (Plan::ep)
  // Under KARMA's split: the swapped blocks reloaded as the backward begins, a window of the
  // recomputed blocks above them (spec::Offload::prefetch_layers), else the double buffer's one.
  bool reload_ahead : 1 = false;
  bool balanced : 1 = false;  // layers split by balanced_split, else evenly
  // 0: the data-parallel exchange without servers, else 1 + index into Enumeration::servers.
  uint8_t servers : 2 = 0;
  uint8_t stack = 0;        // index into Enumeration::stacks (at most 3 x 2 x 2 x 2 x 3 variants)
  uint8_t compression = 0;  // 0: none, else 1 + index into SearchRequest::compressions
  uint8_t spatial = 0;      // index into Enumeration::sample_splits ([0]: unsplit)
  uint8_t grid =
      0;  // index into Enumeration::grids ([0]: 1D tensor parallelism)  // With reload_ahead: the
          // reload window when the planner narrowed it to fit the device
  // (size_reload_windows in planner.cpp); 0: the recomputed blocks' count.
  uint8_t reload_window = 0;
};
static_assert(sizeof(Candidate) == 28, "a search holds millions of candidates");

// What a layout rule counts when it refuses (Enumeration::rejected_units): the enumeration is
// a tree, and a rule that cuts it early refuses a whole branch, which counts once in the unit of
// its level; the configurations under it are never enumerated.
inline constexpr const char* kLayouts = "layouts";                 // (sample split, dp, tp, pp)
inline constexpr const char* kMicroBatches = "micro-batch sizes";  // of a layout (and tp grid)
inline constexpr const char* kSchedules = "schedules";             // of a micro-batch size
inline constexpr const char* kZeroStages = "ZeRO stages";          // of a schedule
inline constexpr const char* kSequenceSplits = "sequence-parallel settings";  // of a ZeRO stage
inline constexpr const char* kConfigurations = "configurations";              // whole candidates

struct Enumeration {
  // The candidates; the stack variants they run (stacks[0] is the request's stack, the others
  // turn some of its overlap knobs down). 28 bytes each: a copy of a plan with its stack each
  // was most of the enumeration's time, and a search holds millions.
  std::vector<Candidate> candidates;
  std::vector<spec::Stack> stacks;
  std::vector<spec::GradientCompression> compressions;  // [0]: none, then the request's
  std::vector<spec::ParameterServer> servers;           // the request's parameter servers
  // How each sample may be split ([0]: not at all). A CNN's grids: for each power of two up to a
  // node, the squarest grid (h >= w) the model splits over (spec::spatial_split_problem). A
  // transformer's context-parallel degrees: powers of two leaving each rank at least
  // kMinContextTokens of every sequence, each with the algorithms the stack runs.
  struct SampleSplit {
    spec::SpatialSplit spatial{};
    int64_t cp = 1;
    spec::ContextAlgorithm cp_algorithm = spec::ContextAlgorithm::kRing;
    int64_t ranks() const { return spatial.ranks() * cp; }
  };
  std::vector<SampleSplit> sample_splits;
  // The 3D tensor grids a candidate's tp ranks may form ([0]: none, Megatron-LM's 1D tensor
  // parallelism): for each tp, every x * y * z = tp the model divides but the 1 x tp x 1 grid
  // (which is the 1D layout); 255 at most.
  std::vector<spec::TensorGrid> grids;
  // A CNN with multi-branch units (Inception modules, AmoebaNet cells) splits over tp ranks only
  // by their branches (SUPER, spec/branch_parallel.hpp; a channel split is refused for them): its
  // tp > 1 candidates are branch-parallel plans.
  bool branch_split = false;
  std::map<std::string, int64_t> rejected;            // reason -> count
  std::map<std::string, std::string> rejected_units;  // reason -> what it counts (kLayouts...)
  int64_t considered = 0;
  // Candidate i as a plan without its stack (into `out`, reusing its storage: the estimate
  // phase's hot path), or complete with its stack.
  void fill(size_t i, spec::Plan& out) const;
  spec::Plan plan(size_t i) const;
  const spec::Stack& stack_of(size_t i) const { return stacks[candidates[i].stack]; }
  size_t size() const { return candidates.size(); }

  // The request's part of every plan, and the balanced splits by chunk count.
  spec::Plan base;
  std::map<int64_t, std::vector<int64_t>> balanced_splits;
  int64_t units = 0;  // the model's pipeline units (transformer blocks)
};

// The fewest tokens of each sequence a context-parallel rank keeps in a search: ring attention
// hides a step's key/value transfer (linear in the block) behind the step's attention (quadratic
// in it) only while blocks are long; Megatron-LM/NeMo recommend context parallelism for sequences
// of 8K tokens and more. A pruning rule of the search (counted by --explain), not of plans.
inline constexpr int64_t kMinContextTokens = 4096;

// The knobs `used` sets otherwise than `requested`, for display ("" when none), e.g.
// "tp_overlap=bulk dp_overlap=off dp_bucket=40MB".
std::string tuned_knobs(const spec::Stack& requested, const spec::Stack& used);

// Checks the request (GPU count, batch, cluster size) and throws InputError with what is wrong.
void check_request(const SearchRequest& request);
Enumeration enumerate_plans(const SearchRequest& request);

// Layers per (virtual) stage that give the first and last stages fewer layers, to make up for the
// embedding and the head they also run. Empty when the even split is already the balanced one.
std::vector<int64_t> balanced_split(int64_t layers, int64_t chunks);

}  // namespace sextant::planner
