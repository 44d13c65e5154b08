// Lowering: ModelSpec -> per-layer forward and backward ops with FLOPs, bytes moved, parameters,
// activation bytes kept for backward, and tensor-parallel communication, for one micro-batch on
// one tensor-parallel rank. Conventions (docs/METRICS.md): FLOPs count matrix multiplications only
// (a multiply-add is 2 FLOPs), as Narayanan et al. (SC'21) and MFU do; memory-bound ops are costed
// by the bytes they read and write.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sextant/models/op_id.hpp"
#include "sextant/spec/collective.hpp"
#include "sextant/spec/dtype.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/stack.hpp"
#include "sextant/spec/trace.hpp"

namespace sextant::models {

// How an op's work is divided among the tp ranks of a tensor-parallel group (Megatron-LM).
enum class TpSplit {
  kReplicated,  // every rank does all of it (norms, residuals without sequence parallelism)
  kColumn,      // column-parallel linear: output features split
  kRow,         // row-parallel linear: input features split, partial sums all-reduced
  kHead,        // attention heads split
  kVocab,       // vocabulary split (embedding, logits, cross-entropy)
  kSequence,    // sequence split (norms, dropout, residuals under sequence parallelism)
};
std::string_view tp_split_name(TpSplit split);

// One matrix product (batch x (m x k) @ (k x n)) that a matrix op executes.
struct MatmulShape {
  int64_t batch = 1;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool operator==(const MatmulShape&) const = default;
};

// The group a communication op runs in: the layer group (spec::RankLayout::layer_group), the
// ranks splitting each sequence (RankLayout::cp_group, context parallelism), the ranks splitting
// the routed experts (RankLayout::ep_group, expert parallelism), one axis of a 3D tensor grid
// (RankLayout::grid_group, spec/tensor_grid.hpp), or the ranks splitting a CNN's samples
// spatially (RankLayout::spatial_group: halo exchanges and the all-reduces of partial sums), or
// the reduce or gather group of a CNN channel split's stationary-w convolution
// (RankLayout::channel_filter_group, spec/channel_split.hpp), or the data-parallel replicas (a
// per-op plan's collectives over its data axis, spec/per_op_plan.hpp).
enum class CommGroup : uint8_t {
  kLayer,
  kContext,
  kExpert,
  kGridX,
  kGridY,
  kGridZ,
  kSpatial,
  kFilterReduce,
  kChannelGather,
  kData  // the data-parallel replicas: a per-op plan's reshards over mesh axis "d"
};

struct Op {
  OpId id = OpId::kCount;  // the op's identity (op_id.hpp); kCount: none set
  std::string name;        // its name in both traces, e.g. "attn.qkv" (OpName::str)
  spec::OpClass op_class = spec::OpClass::kGemm;
  // FLOPs of this op on one rank for one micro-batch, counted as MFU and Narayanan et al. count
  // them (matrix products only, no causal halving, backward = 2x forward).
  double flops = 0;
  // FLOPs the kernel really executes when they differ (a causal flash kernel skips the masked
  // half; its backward recomputes the scores: 2.5x the forward); 0: `flops`.
  double kernel_flops = 0;
  int64_t bytes = 0;           // memory traffic (compute ops) or message size per rank (comm ops)
  std::vector<int64_t> shape;  // GEMM: {m, n, k}; batched GEMM and attention: {batch, m, n, k}
  std::vector<MatmulShape> matmuls;  // the products a GEMM-class op runs (backward: dgrad, wgrad)
  int kernels = 1;                   // kernel launches the op takes (0: fused into its neighbour)
  // A memory-bound op's kernel family (spec::MemoryKernel): the bandwidth its bytes move at. Of
  // `bytes`, `mixed_dtype_bytes` are moved by eager dynamic-casting kernels (kMixedDtype) whatever
  // the family, and `narrow_bytes` by a kernel of only `narrow_blocks` thread blocks.
  spec::MemoryKernel memory_kernel = spec::MemoryKernel::kGeneric;
  int64_t mixed_dtype_bytes = 0;
  int64_t narrow_bytes = 0;
  int64_t narrow_blocks = 0;
  TpSplit split = TpSplit::kReplicated;
  bool core_attention = false;   // recomputed by selective recompute (Korthikanti et al. 2022)
  bool fused_attention = false;  // one fused (flash) attention kernel: shape {b*heads, s, s, d}
  bool causal = false;           // fused attention under a causal mask
  bool dropout = false;          // fused attention applying dropout to its probabilities
  double executed_flops() const { return kernel_flops > 0 ? kernel_flops : flops; }
  // Communication ops only: collective within `group` (a halo exchange with the spatial grid's
  // neighbours is a kSendRecv in the spatial group).
  spec::CollectiveKind collective = spec::CollectiveKind::kAllReduce;
  CommGroup group = CommGroup::kLayer;
  // A ring attention step's transfer (context parallelism): it runs beside the compute op after
  // it, which does not wait for it; the op after that one does.
  bool beside_next = false;
  // A tensor-parallel collective next to the experts' grouped GEMMs (expert parallelism over tp):
  // Transformer Engine's GEMM/communication overlap does not cover it.
  bool no_tp_overlap = false;
  // The most loaded rank's work over the balanced rank's this op counts (a dropless mixture of
  // experts under expert parallelism: models/moe_load.hpp): its time scales by it, its FLOPs and
  // bytes stay the balanced rank's (what every rank sends, and what a trace of it sums to).
  double load_factor = 1;
  // The bytes a collective's time is priced by: the most loaded rank's.
  int64_t costed_bytes() const {
    return load_factor == 1
               ? bytes
               : static_cast<int64_t>(std::llround(static_cast<double>(bytes) * load_factor));
  }
  bool is_comm() const { return spec::is_communication(op_class); }
  // What selective recompute re-runs (Korthikanti et al. 2022): the attention core, with the
  // context-parallel transfers that feed it.
  bool in_core() const { return core_attention || (is_comm() && group == CommGroup::kContext); }
  bool operator==(const Op&) const = default;
};

// Whether an fp8 recipe runs op `id`'s GEMMs in fp8: the transformer block's dense linears and
// its experts' (Transformer Engine's modules in Megatron-Core, torchao's Float8Linear in
// TorchTitan). Every other matrix product keeps the 16-bit compute dtype: the logits (Megatron-Core
// builds its output layer as tensor_parallel.ColumnParallelLinear outside the fp8 context,
// megatron/core/models/gpt/gpt_model.py and transformer_block.py; TorchTitan's float8 converter
// filters "output" / "lm_head", torchtitan/components/quantization/float8.md), the MoE router and
// unfused attention's batched products.
bool fp8_recipe_quantizes(OpId id);

enum class LayerKind { kEmbedding, kBlock, kHead, kMlpLinear, kCnn };

// A weight one rank holds, viewed as the matrix PowerSGD compresses: a tensor of shape
// [rows, ...] as rows x (elements / rows), PyTorch's powerSGD_hook view (tensor.view(rows, -1)).
struct WeightMatrix {
  int64_t rows = 0;
  int64_t cols = 0;
  bool operator==(const WeightMatrix&) const = default;
};

// A convolution of a CNN layer over whole maps, per sample: what a per-op split of it would move
// and save (models/conv_split_bound.hpp).
struct ConvShape {
  std::string unit;    // within its layer: "conv", "conv2", "downsample"
  int64_t input = 0;   // elements of the map it reads
  int64_t output = 0;  // elements of the map it writes
  int64_t params = 0;  // its filters, bias and batch-norm scale and shift
  bool operator==(const ConvShape&) const = default;
};

struct Layer {
  std::string name;  // "embedding", "block3", "head", "fc0", "conv1"
  LayerKind kind = LayerKind::kBlock;
  std::vector<Op> forward;
  std::vector<Op> backward;  // in execution order
  int64_t params = 0;        // parameters held by one tp rank
  int64_t params_total = 0;  // parameters of the layer (all tp ranks, counted once)
  // Of those, the routed experts' of a mixture-of-experts block (a token reaches top_k of them).
  int64_t routed_expert_params_total = 0;
  // Of `params`, the routed experts' this rank holds (experts/ep of them): under expert
  // parallelism their gradients are summed over the expert replicas only (gradient_buckets).
  int64_t expert_params = 0;
  // Parameters every tp rank holds whole that see only its rows under sequence parallelism
  // (norms, row-parallel biases, learned positions): their gradients are partial sums, all-reduced
  // over the tp group once per step (Megatron-LM finalize_model_grads, _allreduce_layernorm_grads).
  int64_t sp_partial_params = 0;
  // Of `params`, those whose op read every replica's rows (a per-op split of a CNN's classifier,
  // cnn_fc_graph.hpp): each replica's gradient is whole, its shard or a copy, and not summed over
  // the replicas (gradient_buckets leaves them out).
  int64_t replica_whole_params = 0;
  // Of `params`, the weights of two or more dimensions, as the executor's parameters hold them
  // (exec's ParamSpec shapes), in no particular order; the rest are vectors (norms, biases).
  // Listed for dense layers (a mixture of experts' and a tensor grid's are not).
  std::vector<WeightMatrix> matrices;
  // A CNN layer's convolutions, in forward order (empty for other layers); add_convolution records
  // one by its op's name ("layer12.conv2": unit "conv2").
  std::vector<ConvShape> convolutions;
  void add_convolution(const std::string& op_name, int64_t input, int64_t output, int64_t weights);
  // Activation bytes one rank keeps for the backward pass, per micro-batch:
  int64_t saved_bytes = 0;            // no recompute
  int64_t saved_bytes_selective = 0;  // selective recompute (LoweringOptions::selective)
  // The ops selective recompute re-runs before the layer's backward, in order: the forward's
  // attention core (Op::in_core) under Megatron's policy, TorchTitan's per-op list under its own.
  int64_t saved_bytes_full = 0;  // only the layer input kept (full recompute)
  std::vector<Op> selective_forward;
  // ZeRO-3 keeps its gathered parameters from its forward to its backward, so its backward gathers
  // nothing (Stack::reshard_after_forward; LoweringOptions::zero3).
  bool kept_for_backward = false;
  // Bytes of the activation this layer hands to the next one, per micro-batch and rank (what a
  // pipeline stage boundary after this layer sends; sequence-split under sequence parallelism).
  int64_t output_bytes = 0;
  int64_t saved_bytes_for(spec::Recompute r) const;
  // Whether `other` does the same work: every field but the name equal (a transformer's blocks;
  // what is priced per layer can be priced once for a run of them). A field added to Layer
  // joins the comparison in lowering.cpp.
  bool same_work_as(const Layer& other) const;
  // The modules holding its parameters, one per GEMM or convolution of its forward (at least
  // one): what DeepSpeed's ZeRO-3 fetches one at a time (norm weights and biases stay below
  // stage3_param_persistence_threshold, unsharded).
  int64_t parameter_modules() const;
  double forward_flops() const;
  double backward_flops() const;
};

struct LoweringOptions {
  int64_t micro_batch = 1;
  int64_t seq_len = 0;  // 0 = the model's
  spec::Dtype dtype = spec::Dtype::kBf16;
  int64_t tp = 1;
  bool sequence_parallel = false;
  // The software stack's kernels (Plan::stack): how attention runs and how much is fused.
  spec::AttentionKernel attention = spec::AttentionKernel::kUnfused;
  spec::Fusion fusion = spec::Fusion::kFused;
  spec::CrossEntropy cross_entropy = spec::CrossEntropy::kFused;
  bool autocast = false;          // 16-bit compute by torch.autocast over fp32 parameters
  bool fused_rms_norm = true;     // one RMSNorm kernel (Stack::fused_rms_norm); false: eager ops
  bool bias_grad_kernel = false;  // bias gradients as reductions of their own (Stack's knob)
  spec::ModelCode code{};         // how the stack's model code writes a block (Stack::code)
  // ZeRO-3 as PyTorch FSDP2 runs it (Stack::grad_copy_in): at the end of each layer's backward its
  // gradients are copied into the reduce-scatter buffer in the reduce dtype, on the compute
  // stream; bytes read and written per parameter (0: no copy).
  int64_t grad_copy_in_bytes = 0;
  // ZeRO-3 (Plan::zero 3): which units keep their parameters from forward to backward (the
  // stack's policy; `pipelined`: the plan has pipeline stages), and the bytes read and written per
  // parameter on the compute stream each time a unit is unsharded (Stack::param_copy_out): an
  // fsdp.param_copy_out op first in its forward, and first in its backward where it is gathered
  // again (0: none).
  bool zero3 = false;
  spec::ReshardAfterForward reshard_after_forward = spec::ReshardAfterForward::kAll;
  bool pipelined = false;
  int64_t param_copy_bytes = 0;
  // GEMMs in fp8 under Transformer Engine's recipe: each linear's input and output gradient are
  // cast (and transposed) to fp8 by kernels of their own (transformer blocks' dense layers).
  bool fp8_gemms = false;
  // What selective recompute re-runs and keeps (the stack's policy).
  spec::SelectiveRecompute selective = spec::SelectiveRecompute::kAttentionCore;
  int64_t vocab_multiple = 1;  // the vocabulary padded to a multiple of this x tp (vocabulary.hpp)
  bool dropout = true;         // false: the model's dropout is not run (Stack::dropout)
  // CNNs: each sample's feature maps split over a grid of ranks (Plan::spatial); the ops are
  // those of the most loaded rank, with its halo exchanges and statistic all-reduces.
  spec::SpatialSplit spatial{};
  // Transformers: each sequence split over `cp` ranks (Plan::cp, spec/context_parallel.hpp); the
  // ops are one rank's, on its s/cp tokens, with its attention's transfers.
  int64_t cp = 1;
  spec::ContextAlgorithm cp_algorithm = spec::ContextAlgorithm::kRing;
  // Mixtures of experts: the routed experts split over `ep` ranks (Plan::ep,
  // spec/expert_parallel.hpp); the ops are one rank's, with its dispatch and combine all-to-alls.
  int64_t ep = 1;
  // Transformers: the tp ranks as a 3D grid (Plan::tp_grid, spec/tensor_grid.hpp; x*y*z = tp);
  // the ops are one rank's, on its micro_batch/z sequences, with the grid's collectives.
  spec::TensorGrid tp_grid{};
  // CNNs under a channel split: the plan's algorithm for each convolution reading split maps
  // (Plan::channel_algorithms); empty: each the byte rule's.
  std::vector<spec::ChannelAlgorithm> channel_algorithms{};
  // Transformers: per-op splits overriding the uniform layout's in every dense block
  // (Plan::per_op, spec/per_op_plan.hpp) on the mesh of `dp` replicas by `tp` ranks.
  int64_t dp = 1;
  spec::OpSplits per_op{};
  // CNNs: the tp ranks split Inception modules' branches (Plan::branch_parallel,
  // spec/branch_parallel.hpp) and keep every map whole. The ops are tp rank `branch_rank`'s (the
  // executor's), or with -1 each module's most loaded rank's (the simulator's and the planner's:
  // the join waits for it).
  bool branch_parallel = false;
  int64_t branch_rank = -1;
};

struct LoweredModel {
  std::vector<Layer> layers;  // in forward order; embedding and head are layers of their own
  // Index range of the layers a pipeline splits ("the model's layers"); the first pipeline stage
  // also holds layers before `split_begin`, the last one the layers from `split_end` on.
  size_t split_begin = 0;
  size_t split_end = 0;
  // sequences*seq_len (transformers; seq_len/cp under context parallelism, micro_batch/z
  // sequences on a tensor grid: one rank's) or samples
  int64_t tokens_per_micro_batch = 0;
  int64_t samples_per_micro_batch = 0;
  spec::Dtype dtype = spec::Dtype::kBf16;
  // Parameters of one rank's shard of an embedding table tied to the output layer (0 if untied):
  // with pipeline stages the first and the last stage each hold it and sum its gradients.
  int64_t tied_table_params = 0;
  // Rows of the embedding table / output layer each tensor-parallel rank holds, padding included
  // (models::vocab_shard); 0 for models without a vocabulary.
  int64_t vocab_shard = 0;
  // Whether tp ranks each send their own part of an activation crossing a pipeline stage: a CNN's
  // channel blocks (behind its first fc every rank holds the same whole logits, and sending them
  // whole is what it does). A transformer's are whole on every rank unless sequence parallelism
  // splits them (Plan::sequence_parallel says so).
  bool tp_splits_activations = false;
  // Some convolution of a CNN channel split runs stationary-w (spec/channel_split.hpp): its
  // reduce and gather groups are communicators of their own (CommGroup::kFilterReduce,
  // kChannelGather).
  bool stationary_w = false;
  // The algorithm each convolution reading channel-split maps runs, in order (the plan's, or the
  // byte rule's: the list a plan may carry as Plan::channel_algorithms); empty without tp.
  std::vector<spec::ChannelAlgorithm> channel_algorithms;
};

// Lowers `model` for one micro-batch on one rank of a tensor-parallel group. Throws InputError if
// tp does not divide what it must (heads, ffn_hidden).
LoweredModel lower(const spec::ModelSpec& model, const LoweringOptions& options);

// The ops full recompute re-runs before a layer's backward: its forward but the parameter
// copies that lead it (the parameters are still whole from the backward's own gather).
std::span<const Op> recomputed_forward(const Layer& layer);

// Layers in [split_begin, split_end): the count a pipeline splits.
int64_t pipeline_layer_count(const LoweredModel& lowered);

// The lowered layers each local chunk of pipeline stage `stage` holds: chunk v of the stage is
// global chunk v*pp + stage; the first chunk also holds the layers before split_begin (embedding),
// the last one those from split_end on (head). Shared by the simulator and the executor.
struct StageLayers {
  std::vector<size_t> chunk_begin;  // per local chunk: range of lowered layer indices
  std::vector<size_t> chunk_end;
};
StageLayers stage_layers(const spec::Plan& plan, const LoweredModel& lowered, int64_t stage);

// The recompute mode of each lowered layer under `plan` (spec::unit_recompute for the layers a
// pipeline splits, plan.recompute for the embedding and head around them). Full and selective
// recompute re-run blocks only (the simulator's and the executor's passes).
std::vector<spec::Recompute> layer_recompute(const spec::Plan& plan, const LoweredModel& lowered);
// Whether each lowered layer's activations are offloaded to the host under `plan`
// (spec::unit_activation_offload for the layers a pipeline splits; never the embedding or head).
std::vector<bool> layer_activation_offload(const spec::Plan& plan, const LoweredModel& lowered);

// Megatron's scatter/gather of pipeline transfers (Narayanan et al., SC'21 §4.1): with tensor
// parallelism and no sequence parallelism every tp rank holds the whole activation, so each sends
// 1/tp of it and the receivers all-gather it over their tp group. The parts an activation (or
// its gradient) of `elements` per rank travels in: tp, or 1 when each rank sends its own
// (sequence parallelism or a CNN's channel split already splits it; Megatron too sends whole what
// tp does not divide).
int64_t pipeline_transfer_parts(const spec::Plan& plan, const LoweredModel& lowered,
                                int64_t elements);

// A gradient bucket of one pipeline stage: gradients reduced together over the data-parallel
// group (all-reduced, or reduce-scattered and later all-gathered under ZeRO-1/2).
struct GradientBucket {
  std::vector<size_t> layers;  // lowered layer indices, in backward order
  int64_t params = 0;          // gradients it reduces, per rank (a tied table's copy included)
  std::vector<WeightMatrix> matrices;  // of those, its layers' weight matrices (Layer::matrices)
  bool after_tied_sum = false;         // holds a tied table: reduced once the end stages summed it
  // Holds routed experts' gradients under expert parallelism: reduced over the expert replicas
  // (spec::RankLayout::expert_replica_group), not the replicas.
  bool experts = false;
};
// The buckets of stage `stage` (PyTorch DDP, Megatron-LM's grad buffer): its layers in backward
// order (last local chunk first), consecutive layers in one bucket until it holds at least
// `bucket_bytes` of gradients of `grad_bytes` each. With pipeline stages a layer holding a tied
// embedding table is left to a last bucket of its own, reduced after the first and the last stage
// have summed the table's gradients. Buckets close when a layer's backward of the last
// micro-batch completes them. The one rule the simulator prices and the executor runs.
std::vector<GradientBucket> gradient_buckets(const spec::Plan& plan, const LoweredModel& lowered,
                                             int64_t stage, int64_t bucket_bytes,
                                             int64_t grad_bytes);

// Parameters one rank of pipeline stage `stage` holds, updates and keeps state for: its layers',
// plus, with several stages, the last stage's own copy of a tied embedding table for the output
// projection (Megatron-LM; the executor's ParamStore holds the same copy).
int64_t stage_params(const spec::Plan& plan, const LoweredModel& lowered, int64_t stage);
// Of those, the routed experts' parameters whose state is summed and sharded over the expert
// replicas (plan.ep > 1); 0 without expert parallelism.
int64_t stage_expert_params(const spec::Plan& plan, const LoweredModel& lowered, int64_t stage);

// ZeRO's shards, the one rule the simulator prices and the executor runs. A span of `params`
// parameters sharded over `ranks` gives rank r the elements from r x ceil(params / ranks): every
// shard is ceil(params / ranks) long, the last one padded (DeepSpeed pads each partition to equal
// size, stage_1_and_2.py; FSDP pads each flat parameter to a multiple of the world size).
int64_t zero_shard(int64_t params, int64_t ranks);
// The parameters one rank of stage `stage` updates and keeps optimizer state for, padding
// included (the optimizer runs over its whole padded partition): without ZeRO or replicas the
// stage's; under ZeRO-1/2 its shard of each gradient bucket (`buckets`, gradient_buckets: the
// spans reduce-scattered), over the expert replicas for routed experts; under ZeRO-3 its shard of
// each layer's parameters (FSDP's flat parameter per layer), the routed experts' apart.
int64_t zero_updated_params(const spec::Plan& plan, const LoweredModel& lowered, int64_t stage,
                            const std::vector<GradientBucket>& buckets);

}  // namespace sextant::models
