// The software stack a plan runs under: attention kernel, kernel fusion, communication overlap,
// ZeRO-3 implementation, gradient precision and allocator behaviour. The same layout trains at
// different speeds and memory under Megatron-LM, Megatron-Core, DeepSpeed, PyTorch FSDP,
// TorchTitan or llm.c, so the stack is part of the plan. Named presets are data files
// (stacks/*.json, schema sextant.stack/1) whose every knob cites the stack's own documentation
// or source (docs/FORMATS.md); a plan names a preset and may override single knobs.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sextant/spec/dtype.hpp"
#include "sextant/spec/json_reader.hpp"
#include "sextant/spec/model_spec.hpp"

namespace sextant::spec {

// How the attention core (softmax(QK^T)V) is computed.
enum class AttentionKernel {
  kUnfused,  // scores GEMM, (fused) softmax, dropout, context GEMM: s^2 tensors in memory
  kFlash2,   // FlashAttention-2 (Dao 2023)
  kFlash3,   // FlashAttention-3 (Shah et al. 2024), Hopper only
  kCudnn,    // cuDNN fused flash attention (Transformer Engine's backend on Hopper)
  kSdpa,     // PyTorch scaled_dot_product_attention: the cluster file says which kernel it picks
};
EnumNames<AttentionKernel> attention_kernel_names();
bool is_fused_attention(AttentionKernel kernel);

// How much the memory-bound ops around the GEMMs are fused.
enum class Fusion {
  kEager,     // one kernel per PyTorch primitive (composed RMSNorm, SiLU then multiply, ...)
  kFused,     // hand-written fused kernels per op (Megatron/Transformer Engine/apex)
  kCompiled,  // torch.compile / hand-fused programs: also norm fused with the residual add
};
EnumNames<Fusion> fusion_names();

// How the language-model loss (softmax cross-entropy over the vocabulary) runs.
enum class CrossEntropy {
  kEager,     // logits.float() then F.cross_entropy: log_softmax and nll in fp32, 3 kernels
  kMegatron,  // Megatron's vocab-parallel cross-entropy in PyTorch ops on fp32 logits: 6 passes
  kFused,     // one kernel reads the 16-bit logits and writes the fp32 softmax (apex xentropy,
              // Megatron-Core --cross-entropy-loss-fusion)
  kCompiled,  // one pass over the 16-bit logits, gradient written in place (llm.c, Inductor)
};
EnumNames<CrossEntropy> cross_entropy_names();
// The cross-entropy a stack that names none runs: the one its fusion level implies.
CrossEntropy default_cross_entropy(Fusion fusion);

// Tensor-parallel communication overlapped with the GEMMs next to it.
enum class TpOverlap {
  kNone,       // every TP collective waits for its producer and blocks its consumer
  kBulk,       // backward collectives run beside the independent weight-gradient GEMM
  kPipelined,  // also forward all-gather/reduce-scatter split into chunks pipelined with the GEMM
};
EnumNames<TpOverlap> tp_overlap_names();

// What ZeRO-3 (fully sharded parameters) does.
enum class Zero3Impl {
  kFsdp,       // flat parameters per layer: one all-gather / reduce-scatter per layer, prefetched
  kDeepspeed,  // parameters gathered per tensor by module hooks, coalesced within a bucket
};
EnumNames<Zero3Impl> zero3_impl_names();

// How ZeRO-2 (sharded gradients and optimizer state) keeps the parameters between micro-batches.
enum class Zero2Impl {
  // Whole on every rank, all-gathered once a step after the update (DeepSpeed's stage 2,
  // Megatron-FSDP's optim_grads; Megatron's distributed optimizer keeps whole gradients: ZeRO-1).
  kDeepspeed,
  // Sharded outside each micro-batch's forward and backward: gathered before the forward, kept
  // through the backward, sharded again after it (PyTorch FSDP's SHARD_GRAD_OP, FSDP2's
  // reshard_after_forward=False, TorchTitan's "never" policy): ZeRO-3's units with every unit
  // kept for its backward (as_run in plan.hpp).
  kFsdp,
};
EnumNames<Zero2Impl> zero2_impl_names();

// What `--recompute selective` re-runs under this stack's software.
enum class SelectiveRecompute {
  // Megatron-LM's --recompute-granularity selective (Korthikanti et al. 2022 §5): the attention
  // core only (its s^2 tensors; under a flash kernel the kernel's forward).
  kAttentionCore,
  // TorchTitan's per-op selective activation checkpointing (torchtitan/distributed/
  // activation_checkpoint.py, selective_ac_option "op"): every op's output recomputed except the
  // attention kernel's and every other matmul's (the 1st, 3rd, ... of a block: wq, wv, w1, w2).
  kSaveMatmuls,
};
EnumNames<SelectiveRecompute> selective_recompute_names();

// Which ZeRO-3 units free their gathered parameters after the forward, so that the backward
// gathers them again (FSDP's reshard_after_forward per fully_shard call); a unit that keeps them
// is not gathered for its backward.
enum class ReshardAfterForward {
  kAll,     // every unit (DeepSpeed's ZeRO-3, Megatron-FSDP)
  kBlocks,  // the blocks: FSDP's root unit (embedding, final norm, head) keeps its parameters
  // TorchTitan before v0.2 and scripts like it: also the last block keeps them
  kBlocksButLast,
  // TorchTitan's "default" policy since v0.2: every unit but the final norm and output layer;
  // under pipeline parallelism none (no unit is gathered again for a micro-batch's backward)
  kAllButHead,
  kNone,  // no unit: FSDP's SHARD_GRAD_OP (ShardingStrategy docs: "does not reshard them after
          // the forward, and only reshards them after the backward computation")
};
EnumNames<ReshardAfterForward> reshard_after_forward_names();
// The part of a model a ZeRO-3 unit wraps, as the policies above tell units apart.
enum class ShardUnit { kEmbedding, kBlock, kLastBlock, kHead };
// Whether ZeRO-3 gathers a unit's parameters again for its backward under `policy`.
bool regathers_for_backward(ReshardAfterForward policy, ShardUnit unit, bool pipelined);

// How the stack's model code writes a transformer block where PyTorch runs it primitive by
// primitive (Fusion::kEager). Compiled code fuses the casts and sums but keeps the complex rotary
// multiply and repeat_kv's copies as kernels; fused kernels run none of these. The embedding's
// backward is ATen's wherever a PyTorch stack runs it.
enum class Projections {
  kFused,     // one GEMM for q, k and v, one for a gated MLP's gate and up (Megatron's linear_qkv)
  kSeparate,  // a linear per matrix (TorchTitan's wq, wk, wv and w1, w3; Hugging Face's Llama)
};
EnumNames<Projections> projections_names();
enum class RopeKernel {
  kRotateHalf,  // Hugging Face's q * cos + rotate_half(q) * sin, in the tensors' dtype
  kComplex,     // Meta's and TorchTitan's apply_rotary_emb: fp32 copy, complex multiply, cast back
};
EnumNames<RopeKernel> rope_kernel_names();
enum class GqaKv {
  kNative,  // the attention kernel reads the shared key/value heads as they are
  kRepeat,  // repeat_kv copies them to one per query head first (TorchTitan, Hugging Face)
};
EnumNames<GqaKv> gqa_kv_names();
enum class EmbeddingBackward {
  kScatter,  // one pass adding each token's gradient row into the table's gradient
  kSorted,   // ATen's embedding_dense_backward: zero-filled table, sort, segment sums, scatter
};
EnumNames<EmbeddingBackward> embedding_backward_names();
// The order of the dimensions the model code keeps activations in. The flash-attn package takes
// q, k, v and returns the output batch-major ([b, s, heads, d] or packed [b*s, heads, d]), so a
// sequence-major stack transposes them in and out around it; cuDNN's fused attention reads
// either order through strides.
enum class ActivationLayout {
  kBshd,  // batch-major [b, s, h] (Hugging Face, TorchTitan, llm.c)
  kSbhd,  // sequence-major [s, b, h] (Megatron-LM and Megatron-Core)
};
EnumNames<ActivationLayout> activation_layout_names();
struct ModelCode {
  Projections projections = Projections::kFused;
  RopeKernel rope = RopeKernel::kRotateHalf;
  GqaKv gqa_kv = GqaKv::kNative;
  EmbeddingBackward embedding_backward = EmbeddingBackward::kScatter;
  ActivationLayout layout = ActivationLayout::kBshd;
  bool operator==(const ModelCode&) const = default;
  // One number per combination (a cache key).
  int key() const {
    return static_cast<int>(projections) | static_cast<int>(rope) << 2 |
           static_cast<int>(gqa_kv) << 4 | static_cast<int>(embedding_backward) << 6 |
           static_cast<int>(layout) << 8;
  }
};

// Host (CPU) time to issue one GPU kernel, by pass: the framework's Python, dispatcher and
// launch call, per kernel the lowering counts (models::Op::kernels; eager PyTorch launches more,
// the figures are a pass's host time over the lowering's kernels for it). The GPU cannot start a
// kernel before the host has issued it, so a step of short kernels runs at the host's pace
// (sim/host_issue.hpp). 0: not modelled.
struct HostLaunch {
  double forward_us = 0;   // forward passes and recomputed forwards (the training script's thread)
  double backward_us = 0;  // backward passes (autograd's engine thread)
  bool operator==(const HostLaunch&) const = default;
};

struct Stack {
  std::string preset;       // the preset the knobs came from ("" when none)
  std::string description;  // informational
  AttentionKernel attention = AttentionKernel::kUnfused;
  Fusion fusion = Fusion::kFused;
  CrossEntropy cross_entropy = CrossEntropy::kFused;
  TpOverlap tp_overlap = TpOverlap::kNone;
  // Gradient buckets are reduced while backward still runs (DDP, Megatron --overlap-grad-reduce);
  // under ZeRO-3 a layer's reduce-scatter runs beside the next layer's backward (false: the
  // backward waits for it).
  bool dp_overlap = true;
  // ZeRO-1/2 (distributed optimizer): the updated parameters are all-gathered during the next
  // forward pass instead of after the optimizer step (Megatron --overlap-param-gather).
  bool param_gather_overlap = false;
  // Stage-to-stage sends run beside compute; false: compute waits for each send to finish.
  bool pp_overlap = true;
  int64_t dp_bucket_bytes = 25 * (int64_t{1} << 20);  // gradient bucket, in bytes of grad_dtype
  Zero3Impl zero3 = Zero3Impl::kFsdp;
  Zero2Impl zero2 = Zero2Impl::kDeepspeed;  // default: stack files written before the knob
  int64_t zero3_prefetch = 1;               // layers whose parameters are gathered ahead of use
  // Compute precision when the plan gives none (fp8: GEMMs at the fp8 rate, tensors in bf16).
  std::optional<Dtype> precision;
  // Dtype gradients are accumulated and reduced in; empty: the compute dtype.
  std::optional<Dtype> grad_dtype;
  // 16-bit compute through torch.autocast over fp32 parameters: every forward casts the weights,
  // norms and the residual stream stay fp32, GEMM inputs are cast from them.
  bool autocast = false;
  // RMSNorm as one kernel forward and two backward (PyTorch's nn.RMSNorm on CUDA, apex,
  // Transformer Engine); false: eager elementwise ops (Hugging Face's LlamaRMSNorm). Default:
  // fused unless the fusion level is eager.
  bool fused_rms_norm = true;
  // The training script clips the global gradient norm (max norm 1.0 in every preset that does):
  // a norm pass and a scaling pass over the gradients before the update
  // (models::optimizer_bytes_per_param). Default false: stack files written before the knob.
  bool grad_clip = false;
  // A linear's bias gradient is a kernel of its own, a sum of the output gradient over the tokens
  // (autograd's reduction of a broadcast bias, Megatron's grad_output.sum(0), llm.c's
  // matmul_backward_bias_kernel); false: computed with the weight gradient, in the GEMM op (a
  // cuBLASLt bias-gradient epilogue, Sextant's executor). Default false: stack files written
  // before the knob.
  bool bias_grad_kernel = false;
  // ZeRO-3 copies each layer's gradients into its reduce-scatter buffer, cast to the reduce dtype,
  // on the compute stream before the reduce-scatter (PyTorch FSDP2's
  // foreach_reduce_scatter_copy_in). Default false: stack files written before the knob.
  bool grad_copy_in = false;
  // ZeRO-3 copies each unit's gathered parameters out of the all-gather buffer into their own
  // tensors on the compute stream before the unit runs (PyTorch FSDP2's
  // foreach_all_gather_copy_out); with one rank it casts the shard to the compute dtype and
  // copies that instead. Default false: stack files written before the knob.
  bool param_copy_out = false;
  // Default all: stack files written before the knob.
  ReshardAfterForward reshard_after_forward = ReshardAfterForward::kAll;
  // Memory the allocator holds beyond live tensors, as a fraction of the activations and
  // transient buffers (caching-allocator fragmentation).
  double allocator_reserve = 0;
  // The vocabulary is padded to a multiple of vocab_multiple x tp rows (Megatron's
  // --make-vocab-size-divisible-by), so that every rank's logits GEMM has aligned shapes; the
  // padding rows are never a target. 1: the model's vocabulary as it is, split ceil(V / tp).
  int64_t vocab_multiple = 1;
  // Whether the software runs the model's dropout; false: it trains the model without dropout
  // (Sextant's executor and llm.c implement none), and the simulator prices what runs.
  bool dropout = true;
  SelectiveRecompute selective_recompute = SelectiveRecompute::kAttentionCore;
  // Default fused, rotate-half, native, scatter: stack files written before the knobs.
  ModelCode code;
  // Default none: stack files written before the knob.
  HostLaunch host_launch_us;
  // The knobs the software exposes as flags that a plan search may vary (tunable_knob_names();
  // presets only, never part of a plan's stack: the plan runs the values it names).
  std::vector<std::string> tunable;
  // Per knob, where its value comes from (presets cite the stack's documentation or source).
  std::map<std::string, std::string> sources;

  bool operator==(const Stack&) const = default;
};

inline constexpr std::string_view kStackSchema = "sextant.stack/1";

// The knob names of a stack (the keys of its JSON object besides schema, name, description,
// preset, tunable and sources); every shipped preset cites a source for each.
std::vector<std::string_view> stack_knob_names();
// The knobs a preset's "tunable" list may name (the overlap flags and the gradient bucket).
std::vector<std::string_view> tunable_knob_names();
bool is_tunable(const Stack& stack, std::string_view knob);

// A preset file (every knob required).
Stack stack_from_json(const Json& json, const std::string& source);
// A plan's "stack" value: a preset name, or an object with an optional "preset" and knobs that
// override it (without a preset, every knob is required). `pointer` locates it in the plan.
Stack stack_from_plan_json(const Json& json, const std::string& source, const std::string& pointer);
// `base` with the knobs present in the object `knobs` replaced (a flag or plan override).
Stack stack_with_overrides(const Stack& base, const Json& knobs, const std::string& source,
                           const std::string& pointer);
Json to_json(const Stack& stack);
// The stack as a sextant.stack/1 file (what `sextant stacks show --json` prints and --stack reads).
Json stack_file_json(const Stack& stack);
// The preset name, "NAME (modified)" when knobs were overridden, "custom" without a name.
std::string stack_label(const Stack& stack);

// The dtype gradients are held and reduced in: the stack's grad_dtype, else fp32 under autocast
// (fp32 parameters get fp32 gradients), else the compute dtype.
Dtype gradient_dtype(const Stack& stack, Dtype compute);
// The dtype parameters are held in: fp32 under autocast, else the compute dtype (mixed precision
// keeps fp32 master weights in the optimizer state).
Dtype parameter_dtype(const Stack& stack, Dtype compute);

// The stack Sextant's own executor runs (its kernels are always its own).
inline constexpr std::string_view kExecutorStack = "sextant";

// Shipped presets (stacks/*.json, compiled into the binary).
std::vector<std::string> builtin_stack_names();
// A shipped preset by name; throws InputError naming `source` and listing the valid names.
Stack builtin_stack(std::string_view name, const std::string& source = "--stack");
// The preset name, or a path to a sextant.stack/1 file.
Stack resolve_stack_preset(const std::string& name_or_path);

// The stack a plan without one runs under: Sextant's own executor on CPU clusters; on GPU
// clusters the Megatron-Core performance configuration for transformers (the most common
// large-model stack) and PyTorch DDP for CNNs and MLPs (which Megatron does not train).
std::string_view default_stack_name(bool gpu_cluster, ModelKind model = ModelKind::kTransformer);

}  // namespace sextant::spec
