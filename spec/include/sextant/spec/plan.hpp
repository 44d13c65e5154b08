// Plan: how a model is laid out on ranks. Degrees of data, tensor and pipeline parallelism, ZeRO
// stage, micro-batching, pipeline schedule, recompute, gradient buckets and collective overrides.
// The same JSON is written by `sextant plan` and read by `simulate` and `run`.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sextant/spec/collective.hpp"
#include "sextant/spec/dtype.hpp"
#include "sextant/spec/json_reader.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/per_op_plan.hpp"
#include "sextant/spec/stack.hpp"

namespace sextant::spec {

// kPipeDream2BW: PipeDream-2BW's asynchronous pipeline (Narayanan et al., ICML 2021, "Memory-
// Efficient Pipeline-Parallel DNN Training"): 1F1B without a flush between batches, two weight
// versions per stage, gradients one version stale (pipeline_schedule.hpp has its rules).
// kPipeDream: asynchronous PipeDream with weight stashing (spec/pipeline_schedule.hpp).
// kGems: GEMS' MAST, two replicas of the stages in opposite directions
// (spec/pipeline_schedule.hpp).
enum class Schedule { kGpipe, k1F1B, kInterleaved, kPipeDream2BW, kPipeDream, kGems };
EnumNames<Schedule> schedule_names();
// Whether the schedule runs batches back to back without a flush, each stage updating as its
// part of a batch ends (PipeDream-2BW, PipeDream): a training rule of its own.
bool asynchronous(Schedule schedule);
enum class Recompute { kNone, kSelective, kFull };
EnumNames<Recompute> recompute_names();

// Where a training state lives when it is offloaded from the device: host memory (pinned, over
// PCIe) or NVMe (staged through host memory), as DeepSpeed's offload_optimizer / offload_param
// "device": "cpu" | "nvme".
enum class OffloadTarget { kNone, kHost, kNvme };
EnumNames<OffloadTarget> offload_target_names();

// What a plan keeps off the device (ZeRO-Offload, Ren et al., USENIX ATC'21; ZeRO-Infinity,
// Rajbhandari et al., SC'21).
struct Offload {
  // fp32 master weights, Adam moments and the gradients of the rank's shard; the optimizer step
  // runs on the host CPU and the updated 16-bit parameters are copied back. Needs ZeRO >= 1.
  OffloadTarget optimizer = OffloadTarget::kNone;
  // The rank's 16-bit parameter shard; copied to the device before each ZeRO-3 all-gather.
  // Needs ZeRO 3.
  OffloadTarget params = OffloadTarget::kNone;
  // What the offloaded pipeline units (transformer blocks) keep for their backward: copied to
  // host memory after each unit's forward and back before its backward, overlapped with the
  // neighbouring units' compute (Megatron-LM's --cpu-offloading with Transformer Engine's
  // get_cpu_offload_context; DeepSpeed's cpu_checkpointing when recompute keeps only the input).
  // Host only, as those stacks do.
  OffloadTarget activations = OffloadTarget::kNone;
  // With activations offloaded: the first `activation_layers` units of each (virtual) stage chunk
  // (Megatron-LM's --cpu-offloading-num-layers), 0 for all of them. unit_activation_offload()
  // is the rule.
  int64_t activation_layers = 0;
  // With activations offloaded: how many layers below the one running backward have their reloads
  // issued (1: Transformer Engine's double buffer, the next layer's beside this one's backward).
  // KARMA (Wahib et al., SC'20 §III-C) reloads further ahead, so the swapped first layers come
  // back while the recomputed layers above them run; each layer ahead holds its activations on
  // the device early. Above 1 only where the stack runs KARMA's split (swap_and_recompute).
  int64_t prefetch_layers = 1;
  // Training state (optimizer, parameters) off the device: what ZeRO's sharding rules govern.
  bool state() const { return optimizer != OffloadTarget::kNone || params != OffloadTarget::kNone; }
  bool any() const { return state() || activations != OffloadTarget::kNone; }
  bool operator==(const Offload&) const = default;
};

// How the data-parallel gradient exchange is compressed: each rank encodes its gradient bucket,
// the encoded buckets are all-gathered and every rank decodes and sums them (GRACE, Xu et al.,
// ICDCS'21, "allgather" communicator; the exchange of the QSGD paper). Error feedback (Seide et
// al. 2014; Karimireddy et al., ICML'19) keeps what the encoding dropped and adds it to the next
// step's gradient. models/gradient_compression.hpp owns the wire format and the codec's work.
enum class CompressionKind {
  kNone,
  // QSGD (Alistarh et al., NeurIPS'17): stochastic rounding of |g| / ||g||_2 to 2^(bits-1) - 1
  // levels, a sign bit, and one fp32 norm per `bucket` elements.
  kQsgd,
  // Top-k sparsification (Aji & Heafield 2017; SparCML, Renggli et al., SC'19): the `ratio` * n
  // largest magnitudes as (int32 index, fp32 value) pairs.
  kTopk,
  // 1-bit (Seide et al., Interspeech'14; EF-SignSGD, Karimireddy et al.): a sign bit per element
  // and one fp32 scale, the mean magnitude, per `bucket` elements.
  kOnebit,
  // PowerSGD (Vogels et al., NeurIPS'19): each weight matrix M approximated as P Q^T of `rank`
  // columns, one power-iteration step warm-started from the last step's Q. Unlike the others it
  // is linear, so P and Q are all-reduced (not all-gathered) and its bytes do not grow with dp;
  // vectors and matrices it would not shrink go uncompressed (PyTorch's powerSGD_hook).
  kPowersgd,
  // SparCML (Renggli et al., SC'19): top-k's `ratio` * n pairs summed by a sparse all-reduce
  // (SparseAlgorithm below) instead of all-gathered, switching to a dense vector once the pairs
  // would outweigh it (DSAR). models/gradient_compression.hpp prices it.
  kSparcml,
};
EnumNames<CompressionKind> compression_kind_names();
// Whether the kind sends top-k's (index, value) pairs, chosen by `ratio`: topk and sparcml.
bool selects_topk(CompressionKind kind);

// SparCML's two sparse all-reduces (Renggli et al., SC'19, §5.2-5.3), the paper's choice by size:
enum class SparseAlgorithm {
  // SSAR_Recursive_double, for small data: log2(dp) rounds, each swapping the rank's union with
  // the partner whose index differs in one bit; dp a power of two.
  kRecursiveDoubling,
  // SSAR/DSAR_Split_allgather, for large data: the index space split into dp ranges, each rank's
  // pairs sent to the ranges' owners (an all-to-all), each range summed by its owner, and the
  // sums all-gathered, sparse or -- once a range's union outweighs it -- dense. Any dp.
  kSplitAllGather,
};
// "recursive_doubling", "split_allgather".
EnumNames<SparseAlgorithm> sparse_algorithm_names();

struct GradientCompression {
  CompressionKind kind = CompressionKind::kNone;
  int64_t bits = 4;      // qsgd: bits per element, sign included: 2, 4 or 8
  int64_t bucket = 512;  // qsgd, onebit: elements sharing one fp32 scale
  double ratio = 0.01;   // topk, sparcml: the fraction of elements sent, in (0, 1)
  SparseAlgorithm sparse_algorithm = SparseAlgorithm::kRecursiveDoubling;  // sparcml
  int64_t rank = 1;  // powersgd: columns of P and Q, 1 to kMaxPowerSgdRank (PyTorch's default 1)
  bool error_feedback = true;
  bool any() const { return kind != CompressionKind::kNone; }
  bool operator==(const GradientCompression&) const = default;
};

// Data-parallel training through co-located parameter servers with bounded staleness instead of
// an all-reduce (spec/parameter_server.hpp owns its rules).
struct ParameterServer {
  bool enabled = false;
  int64_t staleness = 0;  // steps a worker runs ahead of the updates it reads; 0: synchronous
  bool operator==(const ParameterServer&) const = default;
};

// How each sample's feature maps are split over ranks (spatial parallelism, Dryden et al.,
// IPDPS'19, "Improving strong-scaling of CNN training by exploiting finer-grained parallelism"):
// an h x w grid of ranks (d x h x w over a volume's planes, rows and columns), each holding a block
// of rows and columns of every convolutional layer's input and output, exchanging halos with its
// grid neighbours before each convolution and pooling window and all-reducing batch-norm
// statistics. CNNs only; spec/spatial_split.hpp owns the shard and halo sizes and the rule of
// which models split.
struct SpatialSplit {
  int64_t h = 1;  // ranks along the rows
  int64_t w = 1;  // ranks along the columns
  int64_t d = 1;  // ranks along a volume's depth (planes)
  int64_t ranks() const { return d * h * w; }
  bool any() const { return ranks() > 1; }
  bool operator==(const SpatialSplit&) const = default;
};
// "HxW", or "DxHxW" when the depth is split: the command line's and messages' form.
std::string spatial_text(const SpatialSplit& split);

// How a convolution between channel-split maps runs (Dryden et al., SC'19 §III; the rules and
// the byte rule choosing among them in spec/channel_split.hpp).
enum class ChannelAlgorithm {
  kWholeInput,   // the image, whole on every rank: no collective
  kStationaryX,  // reduce-scatter of the output (backward: all-gather of its gradient)
  kStationaryY,  // all-gather of the input (backward: reduce-scatter of its gradient)
  kStationaryW,  // all-gather of the input over the gather group, reduce-scatter of the output
                 // over the reduce group (backward: the twins, in the other order)
};
// "whole", "x", "y", "w".
EnumNames<ChannelAlgorithm> channel_algorithm_names();

// How the ranks splitting each sequence (context parallelism) compute attention over the whole
// sequence; spec/context_parallel.hpp owns the rules and the transfers.
enum class ContextAlgorithm {
  // Ring attention (Liu et al. 2023; Megatron-LM --cp-comm-type p2p, Transformer Engine's
  // AttnFuncWithCPAndKVP2P): key/value blocks travel around the ring, each step overlapped with
  // the attention of the block in hand.
  kRing,
  // All-gather of keys and values before attention (Llama 3, Dubey et al. 2024 §3.3.2;
  // --cp-comm-type all_gather), reduce-scatter of their gradients.
  kAllGather,
  // DeepSpeed-Ulysses (Jacobs et al. 2023; --cp-comm-type a2a): all-to-all from sequence-split
  // to head-split before attention and back after it.
  kAllToAll,
};
EnumNames<ContextAlgorithm> context_algorithm_names();

// AxoNN's 3D tensor parallelism (Singh et al., "A 4D Hybrid Algorithm to Scale Parallel Training
// to Thousands of GPUs", 2023; axonn/intra_layer/fully_connected.py): the tp ranks form an
// x * y * z grid. Each weight matrix is split in two dimensions over x and y (a layer's input
// features over one, its output features over the other, the roles swapping from one linear layer
// to the next so no activation is redistributed between them) and its block sharded again over
// z, like FSDP; each z slice of the grid takes micro_batch/z of the sequences.
// spec/tensor_grid.hpp owns the rules, the lowering the collectives.
struct TensorGrid {
  int64_t x = 1;  // ranks splitting the input features of the first linear layer of each pair
  int64_t y = 1;  // ranks splitting its output features (the attention heads, the MLP's ffn)
  int64_t z = 1;  // ranks sharding each weight block and splitting the sequences (depth)
  int64_t ranks() const { return x * y * z; }
  // Whether the plan uses the grid (Megatron-LM's 1D tensor parallelism otherwise).
  bool any() const { return ranks() > 1; }
  bool operator==(const TensorGrid&) const = default;
};

struct Plan {
  int64_t dp = 1;
  int64_t tp = 1;
  int64_t pp = 1;
  int zero = 0;  // 0 = DDP, 1 = optimizer state sharded, 2 = + gradients, 3 = + parameters (FSDP)
  bool sequence_parallel = false;
  // A CNN's tp ranks split its Inception modules' branches (SUPER; spec/branch_parallel.hpp)
  // instead of its channels.
  bool branch_parallel = false;
  int64_t micro_batch = 1;   // sequences (or samples) per micro-batch per replica
  int64_t global_batch = 1;  // sequences (or samples) per optimizer step, all replicas together
  Schedule schedule = Schedule::k1F1B;
  int64_t virtual_stages = 1;         // model chunks per pipeline rank (interleaved schedule)
  std::vector<int64_t> stage_layers;  // layers per (virtual) stage; empty = as even as possible
  Recompute recompute = Recompute::kNone;
  // With full recompute: only the first N layers of each (virtual) stage chunk are recomputed, the
  // others keep their activations (Megatron-LM --recompute-method block --recompute-num-layers N);
  // 0: every layer. With offload.activation_layers too, the N after the offloaded ones (KARMA).
  // unit_recompute() is the rule.
  int64_t recompute_layers = 0;
  // The software stack (attention kernel, fusion, overlap, ZeRO-3 implementation, ...); empty:
  // the default stack of the cluster kind (plan_stack).
  std::optional<Stack> stack;
  Offload offload;
  GradientCompression compression;   // of the data-parallel gradient exchange (DDP, zero 0)
  ParameterServer parameter_server;  // instead of the all-reduce (DDP, zero 0)
  SpatialSplit spatial{};            // each sample's feature maps over a grid of ranks (CNNs)
  // Context parallelism: each sequence split over `cp` ranks (transformers), which attend to the
  // whole sequence with `cp_algorithm`. spec/context_parallel.hpp owns its rules.
  int64_t cp = 1;
  ContextAlgorithm cp_algorithm = ContextAlgorithm::kRing;
  // Expert parallelism: the routed experts of a mixture-of-experts model split over `ep` of the
  // data-parallel ranks (Megatron-LM's expert-model-parallel group, carved out of dp), which
  // exchange their tokens with all-to-alls. spec/expert_parallel.hpp owns its rules.
  int64_t ep = 1;
  // 3D tensor parallelism: the tp ranks as an x * y * z grid (x * y * z = tp); unset ({1, 1, 1}):
  // Megatron-LM's 1D tensor parallelism.
  TensorGrid tp_grid{};
  // A CNN's channel split (tp > 1): the algorithm of each convolution reading split maps (every
  // one after the first, in the lowering's order: a bottleneck's conv1, conv2, conv3, then its
  // downsample), as the planner chose them by simulated time; empty: each the one moving fewest
  // bytes (spec::channel_algorithm).
  std::vector<ChannelAlgorithm> channel_algorithms;
  // Per-operator splits overriding the uniform layout's for named ops of every transformer block
  // (spec/per_op_plan.hpp); empty: the uniform layout.
  OpSplits per_op;
  std::optional<Dtype> dtype;      // compute dtype; default: the stack's precision, else bf16 on
                                   // GPUs and fp32 on CPUs
  std::optional<int64_t> seq_len;  // overrides the model's sequence length
  CollectiveAlgorithms collective_algorithms;  // overrides auto choice
  std::string model;                           // informational: what the plan was made for
  std::string cluster;                         // informational

  // The ranks splitting each sample: a CNN's spatial grid or a transformer's context-parallel
  // ranks (never both: the one splits feature maps, the other sequences).
  int64_t sample_split() const { return spatial.ranks() * cp; }
  int64_t world_size() const { return dp * tp * pp * sample_split(); }
  // Ranks holding the same parameters, whose weight gradients are summed every step: the
  // data-parallel replicas, times the ranks splitting each sample (each computes a partial
  // weight gradient from its part of the feature maps or of the sequence; Megatron-LM's
  // data-and-context-parallel group). dp when no sample is split.
  int64_t replicas() const {
    return dp * sample_split() * (schedule == Schedule::kGems ? 2 : 1);  // GEMS: and its mirror
  }
  // Ranks holding the same routed experts, whose expert gradients are summed (Megatron-LM's
  // expert-data-parallel group): the replicas, less the ep ranks the experts are split over.
  int64_t expert_replicas() const { return replicas() / ep; }
  int64_t micro_batches() const {
    return global_batch / (dp * micro_batch);
  }  // per replica, per step
  int64_t chunks() const { return pp * virtual_stages; }
  // Compact name for logs: dp4.tp2.pp2.z1.mb2 (+ .sp, schedule, .split for a custom layer split,
  // recompute, offload, gradient compression, the spatial split, context and expert parallelism,
  // the tensor grid, .chan for convolution algorithms of its own, when they apply).
  std::string name() const;
};

inline constexpr std::string_view kPlanSchema = "sextant.plan/1";

// Decodes and checks the rules inside a plan (not yet against a model or a GPU count).
Plan plan_from_json(const Json& json, const std::string& source);
Json to_json(const Plan& plan);
Plan read_plan_file(const std::string& path);
// A compression from the command line: kind[:knob=value,...], e.g. "qsgd:bits=4,bucket=256",
// "topk:ratio=0.001,error_feedback=false", "onebit", "powersgd:rank=2", decoded and checked as a
// plan's "compression" object is. Throws InputError naming `source` (the flag).
GradientCompression compression_from_text(const std::string& text, const std::string& source);
// The compressions a search tries for one --compression text: the one it names, or for a
// SparCML that names no algorithm both of them, as SparCML's library chooses by size (Renggli
// et al., SC'19 §5): the search keeps the faster.
std::vector<GradientCompression> searched_compressions(const std::string& text,
                                                       const std::string& source);
// compression_from_text's form of `c`, every knob its kind reads: "sparcml:ratio=0.01,
// algorithm=split_allgather,error_feedback=true".
std::string compression_text(const GradientCompression& c);

// The stack `plan` runs under: its own, or the default one of the cluster kind and model family.
Stack plan_stack(const Plan& plan, bool gpu_cluster, ModelKind model = ModelKind::kTransformer);

// What is wrong with overriding `model`'s sequence length with `seq_len` (not a transformer, a
// learned position table shorter than it, longer than kMaxSeqLen of limits.hpp), or "" when nothing
// is. The one rule for plans and for plan searches.
std::string seq_len_problem(const ModelSpec& model, int64_t seq_len);

// What keeps `plan`'s layout from compressing its gradient exchange, or "" when nothing does
// (whatever plan.compression says). The compressions model the all-reduce of whole gradients over
// the dp replicas, as PyTorch DDP's communication hooks (PowerSGD) and DeepSpeed's 1-bit Adam do:
// not ZeRO's reduce-scatter of shards, not an exchange over dp x cp or dp x spatial ranks, not
// the expert gradients of ep groups. The one rule for plans, the search and the crossover sweep.
std::string compression_layout_problem(const Plan& plan);
// What keeps `plan`'s layout from exchanging its gradients with `compression`: the layout rule
// above, for PowerSGD powersgd_problem and for SparCML sparcml_problem; "" when nothing does.
std::string compression_problem(const Plan& plan, const GradientCompression& compression);
// What keeps SparCML (CompressionKind::kSparcml) by `algorithm` off `dp` replicas, or "": its
// recursive doubling needs a power of two.
std::string sparcml_problem(int64_t dp, SparseAlgorithm algorithm);

// What keeps PowerSGD (CompressionKind::kPowersgd) off a layout with `grid`, or "" when nothing:
// it compresses the weight matrices a rank holds whole (models::Layer::matrices: a mixture of
// experts' router and experts too), which a 3D tensor grid's z-sharded blocks are not.
std::string powersgd_problem(const TensorGrid& grid);

// What is wrong with splitting `model` over `tp` tensor-parallel ranks (Megatron-LM: whole heads
// and key/value heads per rank, an even share of the MLP; transformers only), or "" when nothing
// is. The one rule for plans, plan searches, the lowering and the executor.
std::string tensor_parallel_problem(const ModelSpec& model, int64_t tp);
// What is wrong with sequence parallelism over `tp` ranks for sequences of `seq_len` tokens (each
// rank takes an equal share of the rows: tp must divide the sequence), or "".
std::string sequence_parallel_problem(int64_t seq_len, int64_t tp);

// Checks the plan against a model and a rank count; throws InputError naming `source` with every
// broken rule (dp*tp*pp*spatial != ranks, heads not divisible by tp, more stages than layers, ...).
void validate_plan(const Plan& plan, const ModelSpec& model, int64_t ranks,
                   const std::string& source);

// The recompute mode of each of a model's `units` pipeline units (transformer blocks) under
// `plan`: plan.recompute, except that with full recompute of the first `recompute_layers` units of
// each chunk (Megatron-LM's block method: TransformerBlock._checkpointed_forward checkpoints layers
// 0..N-1 of the block each model chunk builds) the chunk's later units are not recomputed. When
// the plan also offloads the activations of the first `activation_layers` units
// (swaps_and_recomputes), the recomputed units are the `recompute_layers` after those: KARMA's
// split (Wahib et al., SC'20), swapping the first layers, whose backward comes last and leaves
// their copies the most compute to hide behind, and recomputing later ones. The one rule the
// simulator, the planner and the executor ask.
std::vector<Recompute> unit_recompute(const Plan& plan, int64_t units);
// Whether `plan` swaps the first layers of each chunk and recomputes the next (KARMA's split):
// activations offloaded for the first activation_layers > 0 units, full recompute of
// recompute_layers > 0.
bool swaps_and_recomputes(const Plan& plan);

// Whether each of a model's `units` pipeline units has its activations offloaded to the host under
// `plan` (Offload::activations): the first `activation_layers` units of each chunk, or every unit
// when it is 0; none when nothing is offloaded. The one rule the simulator, the planner and the
// executor ask.
std::vector<bool> unit_activation_offload(const Plan& plan, int64_t units);

// A plan as its stack runs it. Under a stack whose ZeRO-2 is FSDP's (Stack::zero2 kFsdp: the
// parameters sharded outside each micro-batch's passes, gathered before its forward and kept
// through its backward), a ZeRO-2 plan over replicas is ZeRO-3 with every unit kept for its
// backward (reshard_after_forward none): one all-gather a unit and micro-batch, a reduce-scatter
// a unit and micro-batch, the gathered units held from forward to backward. Any other plan runs
// as written. The one rule the simulator and the planner ask before they price a plan.
struct PlanAsRun {
  Plan plan;
  Stack stack;
};
PlanAsRun as_run(const Plan& plan, const Stack& stack);

// Layers of each (virtual) stage in pipeline order: plan.stage_layers or an even split whose
// remainder goes to the later stages (the first stage also holds the embedding).
std::vector<int64_t> stage_layer_counts(const Plan& plan, int64_t layers);
// The layers of the plan's largest (virtual) stage chunk: the most recompute_layers can name.
int64_t largest_stage_chunk(const Plan& plan, int64_t layers);

}  // namespace sextant::spec
