// Lowering of transformers (Megatron-LM layout), MLPs and CNNs into per-rank ops.
//
// Transformer block ops and the activations they keep follow Korthikanti et al., "Reducing
// Activation Recomputation in Large Transformer Models" (2022), §4: with 16-bit activations a
// block keeps sbh(34 + 5as/h) bytes; 10sbh of them (norm inputs, the inputs of the QKV and FC1
// GEMMs, the two dropout masks) are replicated across tensor-parallel ranks unless sequence
// parallelism splits them; the 5as²b bytes of the attention core are what selective recompute
// drops; full recompute keeps only the 2sbh-byte block input.
#include "sextant/models/lowering.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "sextant/models/vocabulary.hpp"
#include "sextant/spec/channel_split.hpp"
#include "sextant/spec/context_parallel.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/expert_parallel.hpp"
#include "sextant/spec/spatial_split.hpp"
#include "sextant/spec/tensor_grid.hpp"

namespace sextant::models {

using spec::CollectiveKind;
using spec::OpClass;

std::string_view tp_split_name(TpSplit split) {
  switch (split) {
    case TpSplit::kReplicated:
      return "replicated";
    case TpSplit::kColumn:
      return "column";
    case TpSplit::kRow:
      return "row";
    case TpSplit::kHead:
      return "head";
    case TpSplit::kVocab:
      return "vocab";
    case TpSplit::kSequence:
      return "sequence";
  }
  return "?";
}

bool Layer::same_work_as(const Layer& o) const {
  return kind == o.kind && params == o.params && params_total == o.params_total &&
         routed_expert_params_total == o.routed_expert_params_total &&
         expert_params == o.expert_params && sp_partial_params == o.sp_partial_params &&
         saved_bytes == o.saved_bytes && saved_bytes_selective == o.saved_bytes_selective &&
         saved_bytes_full == o.saved_bytes_full && output_bytes == o.output_bytes &&
         forward == o.forward && backward == o.backward;
}

int64_t Layer::saved_bytes_for(spec::Recompute r) const {
  switch (r) {
    case spec::Recompute::kNone:
      return saved_bytes;
    case spec::Recompute::kSelective:
      return saved_bytes_selective;
    case spec::Recompute::kFull:
      return saved_bytes_full;
  }
  return saved_bytes;
}

double Layer::forward_flops() const {
  double f = 0;
  for (const Op& op : forward) f += op.flops;
  return f;
}

double Layer::backward_flops() const {
  double f = 0;
  for (const Op& op : backward) f += op.flops;
  return f;
}

int64_t pipeline_layer_count(const LoweredModel& lowered) {
  return static_cast<int64_t>(lowered.split_end - lowered.split_begin);
}

StageLayers stage_layers(const spec::Plan& plan, const LoweredModel& lowered, int64_t stage) {
  const int64_t units = pipeline_layer_count(lowered);
  std::vector<int64_t> counts = spec::stage_layer_counts(plan, units);
  std::vector<size_t> begin_of(counts.size() + 1);
  begin_of[0] = lowered.split_begin;
  for (size_t c = 0; c < counts.size(); ++c)
    begin_of[c + 1] = begin_of[c] + static_cast<size_t>(counts[c]);
  StageLayers out;
  const int64_t chunks = plan.chunks();
  for (int64_t v = 0; v < plan.virtual_stages; ++v) {
    int64_t c = v * plan.pp + stage;
    size_t b = begin_of[static_cast<size_t>(c)];
    size_t e = begin_of[static_cast<size_t>(c + 1)];
    if (c == 0) b = 0;
    if (c == chunks - 1) e = lowered.layers.size();
    out.chunk_begin.push_back(b);
    out.chunk_end.push_back(e);
  }
  return out;
}

std::vector<spec::Recompute> layer_recompute(const spec::Plan& plan, const LoweredModel& lowered) {
  std::vector<spec::Recompute> modes(lowered.layers.size(), plan.recompute);
  const std::vector<spec::Recompute> units =
      spec::unit_recompute(plan, pipeline_layer_count(lowered));
  std::copy(units.begin(), units.end(),
            modes.begin() + static_cast<std::ptrdiff_t>(lowered.split_begin));
  return modes;
}

std::vector<GradientBucket> gradient_buckets(const spec::Plan& plan, const LoweredModel& lowered,
                                             int64_t stage, int64_t bucket_bytes,
                                             int64_t grad_bytes) {
  const StageLayers layers = stage_layers(plan, lowered, stage);
  const bool tied_across_stages = plan.pp > 1 && lowered.tied_table_params > 0;
  const bool own_experts = plan.ep > 1;
  auto holds_tied_table = [&](size_t l) {
    return tied_across_stages &&
           ((stage == 0 && l == 0) || (stage == plan.pp - 1 && l + 1 == lowered.layers.size()));
  };
  std::vector<GradientBucket> out;
  GradientBucket open, experts, tied;
  experts.experts = true;
  tied.after_tied_sum = true;
  // (A layer without parameters joins the dense bucket all the same: the bucket is complete after
  // its backward, as DDP's hooks see it.)
  auto fill = [&](GradientBucket& bucket, size_t l, int64_t params) {
    if (params == 0 && bucket.experts) return;
    bucket.layers.push_back(l);
    bucket.params += params;
    if (bucket.params * grad_bytes >= bucket_bytes) {
      const bool kind = bucket.experts;
      out.push_back(std::move(bucket));
      bucket = GradientBucket();
      bucket.experts = kind;
    }
  };
  for (size_t v = layers.chunk_begin.size(); v-- > 0;) {
    for (size_t l = layers.chunk_end[v]; l-- > layers.chunk_begin[v];) {
      if (holds_tied_table(l)) {
        tied.layers.push_back(l);
        tied.params += lowered.layers[l].params + (stage == 0 ? 0 : lowered.tied_table_params);
        continue;
      }
      const int64_t expert = own_experts ? lowered.layers[l].expert_params : 0;
      fill(open, l, lowered.layers[l].params - expert);
      fill(experts, l, expert);
    }
  }
  if (!open.layers.empty()) out.push_back(std::move(open));
  if (!experts.layers.empty()) out.push_back(std::move(experts));
  if (!tied.layers.empty()) out.push_back(std::move(tied));
  return out;
}

int64_t pipeline_transfer_parts(const spec::Plan& plan, const LoweredModel& lowered,
                                int64_t elements) {
  // On a tensor grid the x*y ranks of a z slice hold the activation whole (their layer group).
  const int64_t holders = plan.tp_grid.any() ? plan.tp_grid.x * plan.tp_grid.y : plan.tp;
  return holders > 1 && !plan.sequence_parallel && !lowered.tp_splits_activations &&
                 elements % holders == 0
             ? holders
             : 1;
}

int64_t stage_params(const spec::Plan& plan, const LoweredModel& lowered, int64_t stage) {
  const StageLayers layers = stage_layers(plan, lowered, stage);
  int64_t params = 0;
  for (size_t v = 0; v < layers.chunk_begin.size(); ++v)
    for (size_t l = layers.chunk_begin[v]; l < layers.chunk_end[v]; ++l)
      params += lowered.layers[l].params;
  if (plan.pp > 1 && stage == plan.pp - 1) params += lowered.tied_table_params;
  return params;
}

int64_t stage_expert_params(const spec::Plan& plan, const LoweredModel& lowered, int64_t stage) {
  if (plan.ep <= 1) return 0;
  const StageLayers layers = stage_layers(plan, lowered, stage);
  int64_t params = 0;
  for (size_t v = 0; v < layers.chunk_begin.size(); ++v)
    for (size_t l = layers.chunk_begin[v]; l < layers.chunk_end[v]; ++l)
      params += lowered.layers[l].expert_params;
  return params;
}

namespace {

// Builders for the three kinds of op. Sizes are element counts; `e` is bytes per element.
Op gemm(std::string name, int64_t m, int64_t n, int64_t k, int64_t e, TpSplit split) {
  Op op;
  op.name = std::move(name);
  op.op_class = OpClass::kGemm;
  op.flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  op.bytes = (m * k + k * n + m * n) * e;
  op.shape = {m, n, k};
  op.matmuls = {{1, m, n, k}};
  op.split = split;
  return op;
}

// Batched GEMM of the attention core: `batch` independent (m x k) @ (k x n) products.
Op batched_gemm(std::string name, int64_t batch, int64_t m, int64_t n, int64_t k, int64_t e) {
  Op op;
  op.name = std::move(name);
  op.op_class = OpClass::kAttention;
  op.flops = 2.0 * static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n) *
             static_cast<double>(k);
  op.bytes = batch * (m * k + k * n + m * n) * e;
  op.shape = {batch, m, n, k};
  op.matmuls = {{batch, m, n, k}};
  op.split = TpSplit::kHead;
  op.core_attention = true;
  return op;
}

Op memory_op(std::string name, OpClass op_class, int64_t bytes, TpSplit split,
             std::vector<int64_t> shape = {}) {
  Op op;
  op.name = std::move(name);
  op.op_class = op_class;
  op.bytes = bytes;
  op.split = split;
  op.shape = std::move(shape);
  return op;
}

Op comm_op(std::string name, CollectiveKind kind, int64_t bytes) {
  Op op;
  op.name = std::move(name);
  switch (kind) {
    case CollectiveKind::kAllToAll:
      op.op_class = OpClass::kAllToAll;
      break;
    case CollectiveKind::kAllReduce:
      op.op_class = OpClass::kAllReduce;
      break;
    case CollectiveKind::kReduceScatter:
      op.op_class = OpClass::kReduceScatter;
      break;
    case CollectiveKind::kAllGather:
      op.op_class = OpClass::kAllGather;
      break;
    case CollectiveKind::kSendRecv:  // a halo exchange with the spatial grid's neighbours
      op.op_class = OpClass::kSend;
      break;
    default:
      SEXTANT_CHECK(false, "unexpected collective in a layer");
  }
  op.collective = kind;
  op.bytes = bytes;
  return op;
}

// Backward of a GEMM: data gradient and weight gradient, each as costly as the forward. For
// Y[m,n] = X[m,k] W[k,n]: dX = dY W^T is an (m, k, n) product, dW = X^T dY a (k, n, m) one.
Op gemm_backward(const Op& fwd) {
  Op op = fwd;
  op.flops = 2 * fwd.flops;
  op.bytes = 2 * fwd.bytes;
  op.matmuls.clear();
  for (const MatmulShape& f : fwd.matmuls) {
    op.matmuls.push_back({f.batch, f.m, f.k, f.n});
    op.matmuls.push_back({f.batch, f.k, f.n, f.m});
  }
  op.kernels = 2 * fwd.kernels;
  return op;
}

Op memory_backward(const Op& fwd, double factor) {
  Op op = fwd;
  op.bytes = static_cast<int64_t>(static_cast<double>(fwd.bytes) * factor);
  return op;
}

// Scales a memory-bound op to the kernels a less fused stack runs for it: `passes` times the
// bytes of the fused kernel, in `kernels` launches.
Op unfused(Op op, double passes, int kernels) {
  op.bytes = static_cast<int64_t>(static_cast<double>(op.bytes) * passes);
  op.kernels = kernels;
  return op;
}

struct TransformerDims {
  // s: the tokens of each sequence on this rank (the sequence over cp under context parallelism).
  int64_t b, s, h, a, kv, d, f, V, t, e;
  int64_t cp;  // ranks splitting each sequence (spec/context_parallel.hpp)
  spec::ContextAlgorithm cp_algorithm;
  int64_t ep;           // ranks splitting the routed experts (spec/expert_parallel.hpp)
  int64_t vocab_shard;  // rows of the vocabulary a tp rank holds, padding included
  bool sp;
  spec::AttentionKernel attention;
  spec::Fusion fusion;
  spec::CrossEntropy cross_entropy;
  // torch.autocast over fp32 parameters (PyTorch's autocast op lists: matmuls run in 16 bits,
  // layer_norm and the ops that take fp32 inputs in fp32): the residual stream and the norms are
  // fp32, a GEMM input coming from them is cast first, every forward casts the weights.
  bool autocast;
  int64_t residual_bytes() const { return autocast ? 4 : e; }  // per residual-stream element
  bool eager() const { return fusion == spec::Fusion::kEager; }
  bool compiled() const { return fusion == spec::Fusion::kCompiled; }
  int64_t tokens() const { return b * s; }
  // Tokens handled by a replicated-or-sequence-split op on one rank.
  int64_t norm_tokens() const { return sp ? tokens() / t : tokens(); }
  TpSplit norm_split() const { return sp ? TpSplit::kSequence : TpSplit::kReplicated; }
  // The rank's keys and values (its tokens, its tp share of the key/value heads).
  int64_t kv_bytes() const { return 2 * tokens() * kv / t * d * e; }
};

// The collective that joins the outputs of a row-parallel (or vocab-parallel) op.
void add_tp_reduce(std::vector<Op>& ops, const TransformerDims& x, const std::string& prefix) {
  if (x.t == 1) return;
  int64_t bytes = x.tokens() * x.h * x.e;
  if (x.sp) {
    ops.push_back(comm_op(prefix + ".reduce_scatter", CollectiveKind::kReduceScatter, bytes));
  } else {
    ops.push_back(comm_op(prefix + ".all_reduce", CollectiveKind::kAllReduce, bytes));
  }
}

// The all-gather in front of a column-parallel op under sequence parallelism.
void add_sp_gather(std::vector<Op>& ops, const TransformerDims& x, const std::string& prefix) {
  if (x.t == 1 || !x.sp) return;
  ops.push_back(
      comm_op(prefix + ".all_gather", CollectiveKind::kAllGather, x.tokens() * x.h * x.e));
}

// How a stack's fusion level runs the memory-bound ops of a block, as multiples of the bytes of
// the one fused kernel (Megatron/Transformer Engine/apex) and launches, from the kernels each
// implementation calls:
// - eager RMSNorm (Llama reference and TorchTitan's `_norm(x.float()).type_as(x) * weight`):
//   cast to fp32, pow, mean, add+rsqrt, multiply, cast back, multiply by the weight = 36 bytes per
//   element against the fused kernel's 4 (bf16 read + write): 9x, 7 kernels.
// - eager LayerNorm: PyTorch's native kernel, as fused (its backward is two kernels).
// - eager SwiGLU: silu(gate) then gate * up: 5 element passes against the fused kernel's 3.
// - eager rotary embedding: complex or rotate-half arithmetic on fp32 copies: ~4x, 4 kernels.
// - eager unfused softmax: scale, mask fill and softmax as three kernels.
// - eager residual with dropout: dropout kernel, then add (5 passes against 3).
// - compiled (Inductor; llm.c's fused_residual_forward): each norm is fused into the residual
//   add before it, so it writes its output without reading the residual stream again.
// Autocast's extra kernels: the cast of an fp32 activation to 16 bits in front of a GEMM (read 4,
// write e bytes per element), and the cast of a layer's fp32 weights in every forward.
Op autocast_cast(const std::string& name, int64_t elements, int64_t e, TpSplit split) {
  return memory_op(name, OpClass::kElementwise, elements * (4 + e), split, {elements});
}

struct FusionPasses {
  double norm = 1, act = 1, rope = 1, softmax = 1, residual = 1;
  int norm_kernels = 1, act_kernels = 1, rope_kernels = 1, softmax_kernels = 1,
      residual_kernels = 1;
  // The activation's backward as a multiple of its (unfused) forward's bytes, and its kernels;
  // 0: the fused kernel's (read x and dy, write dx).
  double act_backward = 0;
  int act_backward_kernels = 0;
  // Bytes per element of the activation's input that its implementation keeps for backward
  // (0: the fused kernel's, its 16-bit input).
  int64_t act_saved = 0;
};

// Hugging Face's NewGELUActivation in eager PyTorch, per element of its input (transformers
// activations.py: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 *
// torch.pow(x, 3.0))))). Each operator is a kernel. `e` is the input's bytes (the GEMM output);
// `c` the chain's: under torch.autocast `pow` is on the fp32 list (PyTorch autocast op reference,
// "CUDA ops that can autocast to float32"), so x is cast to fp32 for it and type promotion keeps
// everything after it fp32 (c = 4), and FC2's addmm casts the fp32 result back to 16 bits;
// without autocast c = e. Forward, in evaluation order (read + write bytes):
//   [cast x -> fp32: e + c]  t1 = 0.5 * x: 2e   t2 = pow(x, 3): 2c   t3 = 0.044715 * t2: 2c
//   t4 = x + t3: e + 2c   t5 = k * t4: 2c   t6 = tanh(t5): 2c   t7 = 1 + t6: 2c
//   t8 = t1 * t7: e + 2c   [FC2's cast of t8 to 16 bits: c + e]
//   = 14c + 4e (+ 2(c + e)), 8 kernels (+ 2).
// Backward (autograd's formulas; a gradient is cast to its input's dtype where they differ):
//   [cast dy -> fp32: e + c]  d t1 = g * t7: 3c [+ cast c + e]  d t7 = g * t1: 2c + e
//   tanh_backward(g, t6): 3c   d t4 = k * g: 2c   d x from t4 [cast: c + e]   d t2 = 0.044715 * g:
//   2c   pow_backward = g * (3 * x32.pow(2)): 2c + 2c + 3c   [d x from the cast: c + e]
//   d x from t1 = 0.5 * g: 2e   the three gradients of x summed: 2 x 3e
//   = 19c + 9e (+ 4(c + e)), 11 kernels (+ 4).
// Kept for backward: x32 (pow's input; x itself without autocast), t6 (tanh's output) and t1, t7
// (the product's operands): 3c + e against the fused kernel's e.
struct ComposedActivation {
  int64_t forward = 0, backward = 0, saved = 0;  // bytes per element
  int forward_kernels = 0, backward_kernels = 0;
};
ComposedActivation gelu_new_eager(int64_t e, bool autocast) {
  const int64_t c = autocast ? 4 : e;
  const int64_t casts = autocast ? 1 : 0;
  return {14 * c + 4 * e + casts * 2 * (c + e), 19 * c + 9 * e + casts * 4 * (c + e), 3 * c + e,
          8 + 2 * static_cast<int>(casts), 11 + 4 * static_cast<int>(casts)};
}

FusionPasses fusion_passes(const spec::TransformerSpec& m, const TransformerDims& x) {
  FusionPasses p;
  if (x.eager()) {
    if (m.norm == spec::Norm::kRmsNorm) {
      p.norm = 9;
      p.norm_kernels = 7;
    }
    if (m.activation == spec::Activation::kSwiglu) {
      p.act = 5.0 / 3.0;
      p.act_kernels = 2;
    }
    if (m.activation == spec::Activation::kGeluNew) {
      const ComposedActivation g = gelu_new_eager(x.e, x.autocast);
      p.act = static_cast<double>(g.forward) / static_cast<double>(2 * x.e);  // fused: read+write e
      p.act_kernels = g.forward_kernels;
      p.act_backward = static_cast<double>(g.backward) / static_cast<double>(g.forward);
      p.act_backward_kernels = g.backward_kernels;
      p.act_saved = g.saved;
    }
    p.rope = 4;
    p.rope_kernels = 4;
    p.softmax = 3;
    p.softmax_kernels = 3;
    if (m.dropout) {
      p.residual = 5.0 / 3.0;
      p.residual_kernels = 2;
    }
  } else if (x.compiled()) {
    p.norm = 0.5;
    p.norm_kernels = 0;
  }
  return p;
}

// The attention core of one rank for one micro-batch: unfused (scores GEMM, softmax, dropout,
// context GEMM, keeping the s x s probabilities) or one fused flash kernel. Appends the forward
// ops to `fw`, returns the backward ops in execution order and the bytes kept for backward.
struct AttentionCore {
  std::vector<Op> backward;
  int64_t saved_bytes = 0;  // kept for backward per rank (recomputed by selective recompute)
};

// Context parallelism's transfers, on the ranks splitting each sequence.
Op context_op(std::string name, CollectiveKind kind, int64_t bytes) {
  Op op = comm_op(std::move(name), kind, bytes);
  op.group = CommGroup::kContext;
  return op;
}

// The flash kernel over `sq` query and `sk` key rows of `heads` heads: FLOPs as the FlashAttention
// benchmarks count them (FA2 §4.1), forward 4*b*sq*sk*heads*d, the executed ones halved under a
// causal mask (a rank's share of the masked work is half its blocks' under context parallelism's
// load balance too: Megatron-LM's 2*cp chunks); reads q, k, v, writes the output and the fp32
// log-sum-exp.
Op flash_core(const spec::TransformerSpec& m, const TransformerDims& x, int64_t heads, int64_t sq,
              int64_t sk) {
  Op op;
  op.name = "attn.core";
  op.op_class = OpClass::kAttention;
  op.flops = 4.0 * static_cast<double>(x.b * heads) * static_cast<double>(sq) *
             static_cast<double>(sk) * static_cast<double>(x.d);
  op.causal = m.architecture == spec::Architecture::kDecoder;
  op.kernel_flops = op.causal ? op.flops / 2 : op.flops;
  op.bytes = 2 * x.b * (sq + sk) * heads * x.d * x.e + x.b * heads * sq * 4;
  op.shape = {x.b * heads, sq, sk, x.d};
  op.split = TpSplit::kHead;
  op.core_attention = true;
  op.fused_attention = true;
  return op;
}

AttentionCore attention_core(const spec::TransformerSpec& m, const TransformerDims& x,
                             const FusionPasses& passes, std::vector<Op>& fw) {
  const int64_t e = x.e;
  const int64_t mask = m.dropout ? 1 : 0;
  const bool cp = x.cp > 1;
  const spec::ContextAlgorithm algorithm = x.cp_algorithm;
  // The attention each rank computes: its heads, query rows and key rows. Context parallelism
  // (spec/context_parallel.hpp): all-gather attends the rank's s/cp queries to all s keys;
  // all-to-all (Ulysses) hands each rank heads/cp heads of the whole sequence; ring attends its
  // queries to one block of s/cp keys per step, cp steps.
  int64_t heads = x.a / x.t;
  int64_t sq = x.s;
  int64_t sk = x.s;
  if (cp && algorithm == spec::ContextAlgorithm::kAllGather) sk = x.s * x.cp;
  if (cp && algorithm == spec::ContextAlgorithm::kAllToAll) {
    heads /= x.cp;
    sq = sk = x.s * x.cp;
  }
  // The transfers around the core (TE context_parallel.py): all-gather gathers the keys and
  // values before it and again in backward (AttnFuncWithCPAndKVAllGather keeps only its own),
  // then reduce-scatters their gradients; Ulysses all-to-alls q, k, v to head-split before it and
  // the output back after it, and the gradients the other way in backward.
  const int64_t qkv_bytes = x.tokens() * (x.a + 2 * x.kv) / x.t * x.d * e;
  const int64_t out_bytes = x.tokens() * x.a / x.t * x.d * e;
  std::vector<Op> before_fw, after_fw, before_bw, after_bw;
  if (cp && algorithm == spec::ContextAlgorithm::kAllGather) {
    Op gather = context_op("cp.kv_all_gather", CollectiveKind::kAllGather, x.kv_bytes() * x.cp);
    before_fw.push_back(gather);
    before_bw.push_back(gather);
    after_bw.push_back(
        context_op("cp.kv_reduce_scatter", CollectiveKind::kReduceScatter, x.kv_bytes() * x.cp));
  }
  if (cp && algorithm == spec::ContextAlgorithm::kAllToAll) {
    before_fw.push_back(context_op("cp.qkv_all_to_all", CollectiveKind::kAllToAll, qkv_bytes));
    after_fw.push_back(context_op("cp.out_all_to_all", CollectiveKind::kAllToAll, out_bytes));
    before_bw.push_back(context_op("cp.out_all_to_all", CollectiveKind::kAllToAll, out_bytes));
    after_bw.push_back(context_op("cp.qkv_all_to_all", CollectiveKind::kAllToAll, qkv_bytes));
  }
  AttentionCore core;
  fw.insert(fw.end(), before_fw.begin(), before_fw.end());
  if (spec::is_fused_attention(x.attention)) {
    // FlashAttention (Dao et al. 2022, §3.1; FA2 §3.1.1): no s x s tensor is written; the kernel
    // keeps the output and the fp32 log-sum-exp per row, and the backward recomputes the scores:
    // 2.5x the forward's executed FLOPs (5 matmuls against 2).
    Op op = flash_core(m, x, heads, sq, sk);
    Op bwd = op;
    bwd.flops = 2 * op.flops;
    bwd.kernel_flops = 2.5 * op.kernel_flops;
    bwd.bytes = 2 * op.bytes;
    // Before the main backward kernel, D = rowsum(dO * O); after it, the fp32 dQ accumulator is
    // converted to 16 bits (flash-attention's dot_do_o and convert_dq kernels, cuDNN's
    // compute_dot_do_o and convert_dq_to_16bits). Attention's own kernels, so attention's class
    // (as profilers group them; traces::kernel_class), memory-bound.
    const int64_t q_elements = x.b * sq * heads * x.d;
    Op prep = memory_op("attn.core_prep", OpClass::kAttention,
                        q_elements * (2 * e + 4 + e) + x.b * heads * sq * 4, TpSplit::kHead,
                        {x.b * sq, heads * x.d});
    prep.kernels = 2;
    core.saved_bytes = x.b * heads * sq * 4;  // the log-sum-exp
    if (cp && algorithm == spec::ContextAlgorithm::kRing) {
      // Ring attention (TE AttnFuncWithCPAndKVP2P): step i attends the rank's queries to the key
      // block in hand while the block moves on to the next rank, cp - 1 transfers of the rank's
      // keys and values forward. Backward the buffer travelling the ring holds the keys and
      // values and the key/value gradient accumulated so far: the first step sends the keys and
      // values, the middle ones both, the last the gradient only, back to its owner (2(cp - 1)
      // key/value sizes). After each step but the first, the block's output is merged into the
      // running one by the log-sum-exp (flash_attn_fwd_out_correction: read the step's output and
      // its lse, read and write the fp32 output); backward, each step's dq and dkv are added to
      // the running fp32 gradients.
      const int64_t kv_elements = x.kv_bytes() / e;
      Op merge = memory_op("attn.cp_merge", OpClass::kElementwise,
                           q_elements * (e + 8) + x.b * heads * sq * 12, TpSplit::kHead,
                           {x.b * sq, heads * x.d});
      Op merge_bwd =
          memory_op("attn.cp_merge", OpClass::kElementwise, (q_elements + kv_elements) * (e + 8),
                    TpSplit::kHead, {x.b * sq, heads * x.d});
      merge.core_attention = merge_bwd.core_attention = true;
      // Under the causal mask only the first step (the rank's own keys) is masked; every later
      // one is a dense half of its block (the rank's queries against one chunk of the keys, or
      // its second chunk of queries against both: TE's step i > 0), the same executed FLOPs at
      // the kernel's unmasked throughput.
      Op later = op;
      later.causal = false;
      for (int64_t i = 0; i < x.cp; ++i) {
        if (i + 1 < x.cp) {
          Op send = context_op("cp.kv_send", CollectiveKind::kSendRecv, x.kv_bytes());
          send.beside_next = true;
          fw.push_back(send);
        }
        fw.push_back(i == 0 ? op : later);
        if (i > 0) fw.push_back(merge);
      }
      Op later_bwd = bwd;
      later_bwd.causal = false;
      core.backward.push_back(prep);
      for (int64_t i = 0; i < x.cp; ++i) {
        const int64_t bytes = i == 0 || i + 1 == x.cp ? x.kv_bytes() : 2 * x.kv_bytes();
        Op send = context_op("cp.kv_send", CollectiveKind::kSendRecv, bytes);
        send.beside_next = true;
        core.backward.push_back(send);
        // Backward runs the steps in reverse (TE): the rank's own, masked block last.
        core.backward.push_back(i + 1 == x.cp ? bwd : later_bwd);
        if (i > 0) core.backward.push_back(merge_bwd);
      }
      core.saved_bytes = x.b * heads * sq * 4;
      return core;
    }
    fw.push_back(op);
    fw.insert(fw.end(), after_fw.begin(), after_fw.end());
    core.backward = before_bw;
    core.backward.push_back(prep);
    core.backward.push_back(bwd);
    core.backward.insert(core.backward.end(), after_bw.begin(), after_bw.end());
    return core;
  }
  Op scores = batched_gemm("attn.scores", x.b * heads, sq, sk, x.d, e);
  fw.push_back(scores);
  Op softmax =
      unfused(memory_op("attn.softmax", OpClass::kElementwise, 2 * x.b * heads * sq * sk * e,
                        TpSplit::kHead, {x.b * heads, sq, sk}),
              passes.softmax, passes.softmax_kernels);
  softmax.core_attention = true;
  fw.push_back(softmax);
  Op attn_drop;
  if (m.dropout) {
    attn_drop =
        memory_op("attn.dropout", OpClass::kElementwise, x.b * heads * sq * sk * (2 * e + 1),
                  TpSplit::kHead, {x.b * heads, sq, sk});
    attn_drop.core_attention = true;
    fw.push_back(attn_drop);
  }
  Op context = batched_gemm("attn.context", x.b * heads, sq, x.d, sk, e);
  fw.push_back(context);
  fw.insert(fw.end(), after_fw.begin(), after_fw.end());
  core.backward = before_bw;
  core.backward.push_back(gemm_backward(context));
  if (m.dropout) core.backward.push_back(memory_backward(attn_drop, 1.0));
  core.backward.push_back(memory_backward(softmax, 1.5));
  core.backward.push_back(gemm_backward(scores));
  core.backward.insert(core.backward.end(), after_bw.begin(), after_bw.end());
  // The softmax output, and with dropout its mask and output (Korthikanti et al.: 5as^2b bytes).
  core.saved_bytes = x.b * heads * sq * sk * (e + mask * (1 + e));
  return core;
}

// The MLP of a mixture-of-experts block on one rank (Megatron-LM's MoE layer with its all-to-all
// token dispatcher, experts split over tp as the dense MLP is): the router's GEMM and top-k over
// every token, each token copied to its top_k experts (permute), under expert parallelism the
// copies sent to their experts' ranks (dispatch all-to-all), the experts' two GEMMs over the
// tokens each takes (grouped: one product per expert), the results sent back (combine), the
// copies weighted and summed back (unpermute), and the shared experts beside them as a dense MLP.
// Appends the forward ops to `fw`; returns the backward ops (in execution order), the parameters
// and the activation bytes kept.
struct MoeMlp {
  std::vector<Op> backward;
  int64_t params = 0, params_total = 0;  // on one tp rank; of the layer's MLP
  int64_t routed_total = 0;              // of the routed experts
  int64_t expert = 0;                    // of the routed experts on this rank
  int64_t sp_partial = 0;                // whose gradients are partial sums over tp
  int64_t weight_elements = 0;           // its GEMM weights on one tp rank (autocast casts them)
  int64_t saved_split = 0;               // kept bytes split over tp (the whole layer's)
  int64_t saved_replicated = 0;          // kept bytes every tp rank holds whole
};

// Tokens the experts of one rank compute for `tokens` routed tokens: top_k copies of each, padded
// (or cut) to the experts' capacity when the model sets a capacity factor (GShard, Switch); the
// router assumed balanced when dropless.
double expert_tokens(const spec::MoeSpec& moe, int64_t tokens) {
  const double copies = static_cast<double>(tokens * moe.top_k);
  return moe.capacity_factor > 0 ? copies * moe.capacity_factor : copies;
}

// Whether a MoE block's token dispatcher runs over tensor parallelism (expert parallelism with
// tp > 1, sequence parallel: Megatron-LM's MoEAlltoAllTokenDispatcher): each tp rank routes its
// own s/tp tokens, exchanges their copies over ep, all-gathers the rows over tp for the experts'
// column- and row-parallel GEMMs and reduce-scatters their output, in place of the MLP's own
// sequence-parallel gather and reduce-scatter.
bool dispatches_over_tp(const TransformerDims& x) {
  return x.ep > 1 && x.t > 1;
}

MoeMlp moe_mlp(const spec::TransformerSpec& m, const TransformerDims& x, const FusionPasses& passes,
               std::vector<Op>& fw) {
  const spec::MoeSpec& moe = *m.moe;
  const int64_t T = x.tokens(), e = x.e, h = x.h, E = moe.experts, k = moe.top_k;
  const int64_t local = E / x.ep;  // routed experts on this rank (spec::expert_model_problem)
  const bool over_tp = dispatches_over_tp(x);
  // The tokens this rank routes: all T of its tp group, or its s/tp share when the dispatcher
  // runs over tp (spec::expert_parallel_problem asks for sequence parallelism there).
  const int64_t Tr = over_tp ? x.norm_tokens() : T;
  const int64_t gate = m.activation == spec::Activation::kSwiglu ? 2 : 1;
  const int64_t fe = moe.expert_ffn_hidden / x.t;  // each expert's width on this rank
  const int64_t bias = m.bias ? 1 : 0;
  // Rows this rank routes (padded to capacity), and the useful ones (each token's k copies).
  // Under expert parallelism a rank sends its rows to the ep ranks and receives as many for its
  // local experts (balanced routing: the auxiliary load-balancing loss's aim, GShard §2.2); over
  // tp the experts compute the rows of every tp rank (M = tp x Mr).
  const int64_t Mr = static_cast<int64_t>(std::ceil(expert_tokens(moe, Tr)));
  const int64_t M = over_tp ? Mr * x.t : Mr;
  const int64_t routed = T * k;
  const int64_t per_expert = std::max<int64_t>(1, M / local);
  MoeMlp out;
  Op router = gemm("moe.router", Tr, E, h, e, TpSplit::kReplicated);
  // Softmax over the experts and the top-k in fp32 (Megatron's router), the top_k weights and
  // indices written.
  Op route = memory_op("moe.route", OpClass::kElementwise, Tr * E * 8 + Tr * k * 8,
                       TpSplit::kReplicated, {Tr, E});
  route.kernels = 2;
  Op permute = memory_op("moe.permute", OpClass::kElementwise, Tr * h * e + Mr * h * e,
                         TpSplit::kReplicated, {Mr, h});
  // A grouped GEMM over the experts: FLOPs count the routed copies (model FLOPs), the kernel
  // computes the padded rows too.
  auto expert_gemm = [&](std::string name, int64_t n, int64_t kdim, TpSplit split) {
    Op op = gemm(std::move(name), M, n, kdim, e, split);
    op.flops =
        2.0 * static_cast<double>(routed) * static_cast<double>(n) * static_cast<double>(kdim);
    op.kernel_flops =
        2.0 * static_cast<double>(M) * static_cast<double>(n) * static_cast<double>(kdim);
    op.bytes = (M * kdim + local * kdim * n + M * n) * e;  // every local expert's weights read
    op.matmuls = {{local, per_expert, n, kdim}};
    return op;
  };
  Op fc1 = expert_gemm("moe.fc1", gate * fe, h, TpSplit::kColumn);
  Op act = unfused(memory_op("moe.act", OpClass::kElementwise, (gate + 1) * M * fe * e,
                             TpSplit::kColumn, {M, gate * fe}),
                   passes.act, passes.act_kernels);
  Op fc2 = expert_gemm("moe.fc2", h, fe, TpSplit::kRow);
  // The copies weighted by the router and summed into their tokens, with the shared experts'
  // output added.
  Op unpermute = memory_op("moe.unpermute", OpClass::kElementwise,
                           Mr * h * e + Tr * k * 4 + Tr * h * e * (moe.shared_experts > 0 ? 2 : 1),
                           TpSplit::kReplicated, {Tr, h});
  const int64_t fs = moe.shared_experts * moe.expert_ffn_hidden / x.t;  // shared width per rank
  Op shared_fc1 = gemm("moe.shared_fc1", T, gate * fs, h, e, TpSplit::kColumn);
  Op shared_act = unfused(memory_op("moe.shared_act", OpClass::kElementwise,
                                    (gate + 1) * T * fs * e, TpSplit::kColumn, {T, gate * fs}),
                          passes.act, passes.act_kernels);
  Op shared_fc2 = gemm("moe.shared_fc2", T, h, fs, e, TpSplit::kRow);
  const bool shared = moe.shared_experts > 0;
  // The all-to-alls of expert parallelism (GShard; Megatron's MoEAlltoAllTokenDispatcher): each
  // rank's Mr rows of h out and as many back, in the ep group.
  auto expert_exchange = [&](std::string name) {
    Op op = comm_op(std::move(name), CollectiveKind::kAllToAll, Mr * h * e);
    op.group = CommGroup::kExpert;
    return op;
  };
  // The dispatcher's tensor-parallel gather and reduce-scatter of `rows` rows (output size, as
  // the sequence-parallel collectives count).
  auto tp_exchange = [&](std::string name, CollectiveKind kind, int64_t rows) {
    Op op = comm_op(std::move(name), kind, rows * h * e);
    op.no_tp_overlap = true;
    return op;
  };
  const bool exchange = x.ep > 1;
  const Op dispatch = expert_exchange("moe.dispatch");
  const Op combine = expert_exchange("moe.combine");
  const Op gather = tp_exchange("moe.all_gather", CollectiveKind::kAllGather, M);
  const Op scatter = tp_exchange("moe.reduce_scatter", CollectiveKind::kReduceScatter, M);
  const Op shared_gather = tp_exchange("moe.shared_all_gather", CollectiveKind::kAllGather, T);
  const Op shared_scatter =
      tp_exchange("moe.shared_reduce_scatter", CollectiveKind::kReduceScatter, T);
  fw.insert(fw.end(), {router, route, permute});
  if (exchange) fw.push_back(dispatch);
  if (over_tp) fw.push_back(gather);
  fw.insert(fw.end(), {fc1, act, fc2});
  if (over_tp) fw.push_back(scatter);
  if (exchange) fw.push_back(combine);
  if (shared) {
    if (over_tp) fw.push_back(shared_gather);
    fw.insert(fw.end(), {shared_fc1, shared_act, shared_fc2});
    if (over_tp) fw.push_back(shared_scatter);
  }
  fw.push_back(unpermute);

  auto act_backward = [&](const Op& a) {
    if (passes.act_backward > 0) {
      Op op = memory_backward(a, passes.act_backward);
      op.kernels = passes.act_backward_kernels;
      return op;
    }
    return memory_backward(a, (2.0 * gate + 1) / (gate + 1));
  };
  auto expert_backward = [](const Op& f) {
    Op op = gemm_backward(f);
    op.kernel_flops = 2 * f.kernel_flops;
    return op;
  };
  // Backward runs each tensor-parallel collective's conjugate (a gather's gradient is
  // reduce-scattered, a reduce-scatter's gathered), named by what it does.
  auto conjugate = [](const Op& c, const Op& as) {
    Op op = as;
    op.bytes = c.bytes;
    return op;
  };
  std::vector<Op>& bw = out.backward;
  bw.push_back(memory_backward(unpermute, 1.0));  // and the router weights' gradient
  if (shared) {
    if (over_tp) bw.push_back(conjugate(shared_scatter, shared_gather));
    bw.insert(bw.end(),
              {gemm_backward(shared_fc2), act_backward(shared_act), gemm_backward(shared_fc1)});
    if (over_tp) bw.push_back(conjugate(shared_gather, shared_scatter));
  }
  // The outputs' gradients go back to the experts' ranks, the inputs' to the tokens' ranks.
  if (exchange) bw.push_back(combine);
  if (over_tp) bw.push_back(conjugate(scatter, gather));
  bw.insert(bw.end(), {expert_backward(fc2), act_backward(act), expert_backward(fc1)});
  if (over_tp) bw.push_back(conjugate(gather, scatter));
  if (exchange) bw.push_back(dispatch);
  bw.insert(bw.end(),
            {memory_backward(permute, 1.0), memory_backward(route, 1.0), gemm_backward(router)});

  // Parameters: the router whole on every rank; each expert (routed and shared) split over tp as
  // the dense MLP is, its second bias whole; the routed ones split over ep.
  const int64_t f = moe.expert_ffn_hidden, n_experts = E + moe.shared_experts;
  const int64_t held = local + moe.shared_experts;  // experts on this rank
  const int64_t expert_rank = (h * gate * f + bias * gate * f + f * h) / x.t + bias * h;
  out.params_total = h * E + n_experts * (h * gate * f + bias * gate * f + f * h + bias * h);
  out.params = h * E + held * expert_rank;
  out.expert = local * expert_rank;
  out.routed_total = E * (h * gate * f + bias * gate * f + f * h + bias * h);
  out.weight_elements = h * E + held * (h * gate * f + f * h) / x.t;
  // Routing its own tokens, a tp rank's router gradient is a partial sum (Megatron-LM marks the
  // router weight sequence-parallel: all-reduced over tp with the norms).
  out.sp_partial = over_tp ? h * E : 0;
  // Kept for backward: the router's probabilities and the experts' input rows (every tp rank
  // routes and holds them whole), the experts' activation and second GEMM inputs (split over
  // tp), and the experts' outputs the weighted sum's backward reads; the shared experts' as a
  // dense MLP's.
  const int64_t act_saved = passes.act_saved > 0 ? passes.act_saved : gate * e;
  out.saved_replicated = Tr * E * 4 + M * h * e + Mr * h * e;
  // (Bytes of the whole layer's tensors: the caller takes a tp rank's share.)
  out.saved_split = M * f * (act_saved + e) + T * moe.shared_experts * f * (act_saved + e);
  return out;
}

Layer transformer_block(const spec::TransformerSpec& m, const TransformerDims& x, int64_t index,
                        bool moe_layer) {
  Layer layer;
  layer.name = fmt::format("block{}", index);
  layer.kind = LayerKind::kBlock;
  const int64_t T = x.tokens();
  const int64_t Tn = x.norm_tokens();
  const int64_t e = x.e;
  const int64_t qkv_out = (x.h + 2 * x.kv * x.d) / x.t;
  const int64_t gate = m.activation == spec::Activation::kSwiglu ? 2 : 1;
  const int64_t ffn = x.f / x.t;
  const OpClass norm = OpClass::kNorm;
  const FusionPasses passes = fusion_passes(m, x);
  // A norm's backward is its forward's passes over 1.5x the bytes; eager LayerNorm's backward is
  // PyTorch's two kernels (input gradient, weight and bias gradients).
  const int norm_bwd_kernels = passes.norm_kernels == 0 ? 0
                               : x.eager() && m.norm == spec::Norm::kLayerNorm
                                   ? 2
                                   : passes.norm_kernels;

  const int64_t r = x.residual_bytes();
  std::vector<Op>& fw = layer.forward;
  // Autocast casts each fp32 weight of the layer's GEMMs to 16 bits in every forward (6 bytes a
  // parameter at fp32 -> bf16) and each 16-bit weight gradient back to fp32 in backward.
  // (The MoE MLP's ops are built where they run; their weights are counted here first.)
  std::vector<Op> moe_forward;
  const std::optional<MoeMlp> moe =
      moe_layer ? std::optional<MoeMlp>(moe_mlp(m, x, passes, moe_forward)) : std::nullopt;
  // A MoE block whose dispatcher runs over tp gathers and scatters its own rows.
  const bool own_mlp_collectives = moe && dispatches_over_tp(x);
  const int64_t weight_elements =
      (x.h * (x.h + 2 * x.kv * x.d) + x.h * x.h) / x.t +
      (moe ? moe->weight_elements : (x.h * gate * x.f + x.f * x.h) / x.t);
  Op weight_cast = autocast_cast("autocast.weights", weight_elements, e, TpSplit::kColumn);
  weight_cast.kernels = 4;
  if (x.autocast) fw.push_back(weight_cast);
  Op attn_norm = unfused(memory_op("attn.norm", norm, 2 * Tn * x.h * r, x.norm_split(), {Tn, x.h}),
                         passes.norm, passes.norm_kernels);
  fw.push_back(attn_norm);
  Op attn_cast = autocast_cast("attn.cast", Tn * x.h, e, x.norm_split());
  if (x.autocast) fw.push_back(attn_cast);
  add_sp_gather(fw, x, "attn");
  Op qkv = gemm("attn.qkv", T, qkv_out, x.h, e, TpSplit::kColumn);
  fw.push_back(qkv);
  // Rotary embeddings rotate q and k in place: read and write both once.
  const bool rotary = m.position_embedding == spec::PositionEmbedding::kRope;
  Op rope =
      unfused(memory_op("attn.rope", OpClass::kElementwise, 2 * T * (x.h + x.kv * x.d) / x.t * e,
                        TpSplit::kColumn, {T, (x.h + x.kv * x.d) / x.t}),
              passes.rope, passes.rope_kernels);
  if (rotary) fw.push_back(rope);
  AttentionCore core = attention_core(m, x, passes, fw);
  Op proj = gemm("attn.proj", T, x.h, x.h / x.t, e, TpSplit::kRow);
  fw.push_back(proj);
  add_tp_reduce(fw, x, "attn");
  // Bias, dropout and residual add, fused as Megatron does: read two tensors, write one.
  // Reads the residual and the 16-bit branch output, writes the residual.
  Op attn_res =
      unfused(memory_op("attn.residual", OpClass::kElementwise,
                        Tn * x.h * (2 * r + e + (m.dropout ? 1 : 0)), x.norm_split(), {Tn, x.h}),
              passes.residual, passes.residual_kernels);
  fw.push_back(attn_res);
  Op mlp_norm = unfused(memory_op("mlp.norm", norm, 2 * Tn * x.h * r, x.norm_split(), {Tn, x.h}),
                        passes.norm, passes.norm_kernels);
  fw.push_back(mlp_norm);
  Op mlp_cast = autocast_cast("mlp.cast", Tn * x.h, e, x.norm_split());
  if (x.autocast) fw.push_back(mlp_cast);
  if (!own_mlp_collectives) add_sp_gather(fw, x, "mlp");
  Op fc1 = gemm("mlp.fc1", T, gate * ffn, x.h, e, TpSplit::kColumn);
  Op act = unfused(memory_op("mlp.act", OpClass::kElementwise, (gate + 1) * T * ffn * e,
                             TpSplit::kColumn, {T, gate * ffn}),
                   passes.act, passes.act_kernels);
  Op fc2 = gemm("mlp.fc2", T, x.h, ffn, e, TpSplit::kRow);
  if (moe) {
    fw.insert(fw.end(), moe_forward.begin(), moe_forward.end());
  } else {
    fw.insert(fw.end(), {fc1, act, fc2});
  }
  if (!own_mlp_collectives) add_tp_reduce(fw, x, "mlp");
  Op mlp_res =
      unfused(memory_op("mlp.residual", OpClass::kElementwise,
                        Tn * x.h * (2 * r + e + (m.dropout ? 1 : 0)), x.norm_split(), {Tn, x.h}),
              passes.residual, passes.residual_kernels);
  fw.push_back(mlp_res);

  // Backward, in execution order. Under tensor parallelism the gradient entering a
  // column-parallel GEMM's input is a partial sum: all-reduced (or reduce-scattered with sequence
  // parallelism); the row-parallel GEMM's output gradient is all-gathered with sequence
  // parallelism (the conjugates of the forward collectives, Megatron's f and g operators).
  std::vector<Op>& bw = layer.backward;
  auto norm_backward = [&](const Op& fwd) {
    Op op = memory_backward(fwd, 1.5);
    op.kernels = norm_bwd_kernels;
    return op;
  };
  // A residual's backward (bias gradient, and the branch's gradient added to the stream's) runs
  // once the branch's norm has given its gradient back, as the executor runs it.
  if (!own_mlp_collectives) add_sp_gather(bw, x, "mlp");
  if (moe) {
    bw.insert(bw.end(), moe->backward.begin(), moe->backward.end());
  } else {
    bw.push_back(gemm_backward(fc2));
    if (passes.act_backward > 0) {
      Op act_bwd = memory_backward(act, passes.act_backward);
      act_bwd.kernels = passes.act_backward_kernels;
      bw.push_back(act_bwd);
    } else {
      bw.push_back(memory_backward(act, (2.0 * gate + 1) / (gate + 1)));
    }
    bw.push_back(gemm_backward(fc1));
  }
  if (!own_mlp_collectives) add_tp_reduce(bw, x, "mlp");
  if (x.autocast) bw.push_back(memory_backward(mlp_cast, 1.0));  // the 16-bit gradient to fp32
  bw.push_back(norm_backward(mlp_norm));
  bw.push_back(memory_backward(mlp_res, 2.0 / 3.0));
  add_sp_gather(bw, x, "attn");
  bw.push_back(gemm_backward(proj));
  bw.insert(bw.end(), core.backward.begin(), core.backward.end());
  if (rotary) bw.push_back(memory_backward(rope, 1.0));  // the inverse rotation of dq and dk
  bw.push_back(gemm_backward(qkv));
  add_tp_reduce(bw, x, "attn");
  if (x.autocast) bw.push_back(memory_backward(attn_cast, 1.0));
  bw.push_back(norm_backward(attn_norm));
  bw.push_back(memory_backward(attn_res, 2.0 / 3.0));
  if (x.autocast) bw.push_back(memory_backward(weight_cast, 1.0));

  // Parameters. Column-parallel weights and biases are split; row-parallel biases and norms are
  // replicated on every tp rank.
  const int64_t norm_params = m.norm == spec::Norm::kLayerNorm ? 2 * x.h : x.h;
  const int64_t qkv_full = x.h + 2 * x.kv * x.d;
  const int64_t bias = m.bias ? 1 : 0;
  const int64_t attention_total = x.h * qkv_full + bias * qkv_full + x.h * x.h + bias * x.h;
  const int64_t attention_rank =
      (x.h * qkv_full + bias * qkv_full) / x.t + x.h * x.h / x.t + bias * x.h;
  layer.params_total =
      attention_total + 2 * norm_params +
      (moe ? moe->params_total : x.h * gate * x.f + bias * gate * x.f + x.f * x.h + bias * x.h);
  layer.params =
      attention_rank + 2 * norm_params +
      (moe ? moe->params
           : (x.h * gate * x.f + bias * gate * x.f) / x.t + x.f * x.h / x.t + bias * x.h);
  if (moe) {
    layer.routed_expert_params_total = moe->routed_total;
    layer.expert_params = moe->expert;
  }
  if (x.sp)
    layer.sp_partial_params = 2 * norm_params + 2 * bias * x.h + (moe ? moe->sp_partial : 0);

  // Activations kept for backward (Korthikanti et al. 2022, §4.1), per rank, counted in
  // elements times bytes per element (masks are one byte). With 16-bit activations, no GQA,
  // ffn = 4h and unfused attention these add up to the paper's sbh(34 + 5as/h); a flash kernel
  // keeps the log-sum-exp instead of the 5as^2b bytes of the attention core.
  const int64_t sbh = T * x.h;
  const int64_t mask = m.dropout ? 1 : 0;
  // Split by sequence parallelism, replicated by plain tensor parallelism: the inputs of the two
  // norms, of the QKV GEMM and of FC1 (4sbh elements), and the two output dropout masks.
  // (Under autocast the two norm inputs are fp32; the GEMM inputs are the 16-bit casts.)
  const int64_t replicated = 2 * sbh * r + 2 * sbh * e + 2 * mask * sbh;
  // Split by tensor parallelism: Q, K and V (K and V are kv/a of Q under grouped-query
  // attention), the attention projection input, the activation input and the FC2 input.
  // An eager composed activation keeps its intermediates instead of its input (act_saved).
  // A MoE layer keeps its experts' instead (moe_mlp), some of them on every tp rank whole.
  const int64_t act_input = passes.act_saved > 0 ? T * x.f * passes.act_saved : gate * T * x.f * e;
  const int64_t mlp_split = moe ? moe->saved_split : act_input + T * x.f * e;
  const int64_t split = sbh * e + 2 * sbh * x.kv / x.a * e + sbh * e + mlp_split;
  const int64_t rep_per_rank =
      (x.sp ? replicated / x.t : replicated) + (moe ? moe->saved_replicated : 0);
  layer.saved_bytes = rep_per_rank + split / x.t + core.saved_bytes;
  layer.saved_bytes_selective = rep_per_rank + split / x.t;
  layer.saved_bytes_full = x.sp ? sbh * e / x.t : sbh * e;
  layer.output_bytes = x.norm_tokens() * x.h * e;
  return layer;
}

// One linear layer Y[m, n] = X[m, k] W[k, n] of a 3D tensor grid (spec/tensor_grid.hpp, AxoNN's
// AsyncLinear): the rank holds the (k/inner) x (n/outer) block of W, sharded again over z.
// Forward: the block all-gathered over z, the rank's product, its partial output all-reduced over
// the inner axis. Backward: the block gathered again (AxoNN keeps no copy), both products, the
// input gradient all-reduced over the outer axis, the weight gradient reduce-scattered over z.
// Collective bytes as elsewhere: an all-gather's gathered output, a reduce-scatter's whole input.
struct GridLinear {
  std::vector<Op> forward;
  std::vector<Op> backward;
};
GridLinear grid_linear(const std::string& name, int64_t tokens, int64_t k, int64_t n, int64_t inner,
                       int64_t outer, CommGroup inner_group, CommGroup outer_group,
                       const spec::TensorGrid& g, int64_t e, TpSplit split) {
  auto grid_comm = [](std::string op_name, CollectiveKind kind, int64_t bytes, CommGroup group) {
    Op op = comm_op(std::move(op_name), kind, bytes);
    op.group = group;
    return op;
  };
  const int64_t block = k / inner * (n / outer);
  GridLinear out;
  Op gather =
      grid_comm(name + ".weight_gather", CollectiveKind::kAllGather, block * e, CommGroup::kGridZ);
  Op product = gemm(name, tokens, n / outer, k / inner, e, split);
  if (g.z > 1) out.forward.push_back(gather);
  out.forward.push_back(product);
  if (inner > 1)
    out.forward.push_back(grid_comm(name + ".all_reduce", CollectiveKind::kAllReduce,
                                    tokens * (n / outer) * e, inner_group));
  if (g.z > 1) out.backward.push_back(gather);
  out.backward.push_back(gemm_backward(product));
  if (outer > 1)
    out.backward.push_back(grid_comm(name + ".all_reduce", CollectiveKind::kAllReduce,
                                     tokens * (k / inner) * e, outer_group));
  if (g.z > 1)
    out.backward.push_back(grid_comm(name + ".grad_scatter", CollectiveKind::kReduceScatter,
                                     block * e, CommGroup::kGridZ));
  return out;
}

// A transformer block on a 3D tensor grid (Megatron-AxoNN's ParallelAttention and ParallelMLP
// over axonn.intra_layer.Tensor_Parallel_Linear): the norms and residuals on the whole hidden
// vector of the slice's T = b/z * s tokens (every rank of the slice alike), QKV and FC1 with their
// inputs split over x and outputs over y (the heads, the ffn), the attention core on heads/y,
// the output projection and FC2 with x and y swapped, each followed by an all-gather of the
// x-split output over x (its backward: a slice, no transfer); the slice taken before QKV and FC1
// costs nothing forward and all-gathers the input gradient over x backward. `x` holds the
// slice's dims (b = micro_batch/z; t, its x*y ranks, only for the vocabulary).
Layer grid_block(const spec::TransformerSpec& m, const TransformerDims& x,
                 const spec::TensorGrid& g) {
  Layer layer;
  layer.kind = LayerKind::kBlock;
  const int64_t T = x.tokens();
  const int64_t e = x.e;
  const int64_t r = x.residual_bytes();
  const int64_t qkv_full = x.h + 2 * x.kv * x.d;
  const int64_t gate = m.activation == spec::Activation::kSwiglu ? 2 : 1;
  // The attention core and the fusion passes of a rank holding heads/y of the heads.
  TransformerDims heads = x;
  heads.t = g.y;
  const FusionPasses passes = fusion_passes(m, heads);
  const int norm_bwd_kernels = passes.norm_kernels == 0 ? 0
                               : x.eager() && m.norm == spec::Norm::kLayerNorm
                                   ? 2
                                   : passes.norm_kernels;
  const CommGroup X = CommGroup::kGridX;
  const CommGroup Y = CommGroup::kGridY;
  GridLinear qkv =
      grid_linear("attn.qkv", T, x.h, qkv_full, g.x, g.y, X, Y, g, e, TpSplit::kColumn);
  GridLinear proj = grid_linear("attn.proj", T, x.h, x.h, g.y, g.x, Y, X, g, e, TpSplit::kRow);
  GridLinear fc1 =
      grid_linear("mlp.fc1", T, x.h, gate * x.f, g.x, g.y, X, Y, g, e, TpSplit::kColumn);
  GridLinear fc2 = grid_linear("mlp.fc2", T, x.f, x.h, g.y, g.x, Y, X, g, e, TpSplit::kRow);
  auto gather_x = [&](const std::string& prefix, std::vector<Op>& ops) {
    if (g.x == 1) return;
    Op op = comm_op(prefix + ".all_gather", CollectiveKind::kAllGather, T * x.h * e);
    op.group = X;
    ops.push_back(op);
  };

  std::vector<Op>& fw = layer.forward;
  const int64_t weight_elements =
      (x.h * qkv_full + x.h * x.h + gate * x.h * x.f + x.f * x.h) / (g.x * g.y);
  Op weight_cast = autocast_cast("autocast.weights", weight_elements, e, TpSplit::kColumn);
  weight_cast.kernels = 4;
  if (x.autocast) fw.push_back(weight_cast);
  Op attn_norm = unfused(
      memory_op("attn.norm", OpClass::kNorm, 2 * T * x.h * r, TpSplit::kReplicated, {T, x.h}),
      passes.norm, passes.norm_kernels);
  fw.push_back(attn_norm);
  Op attn_cast = autocast_cast("attn.cast", T * x.h / g.x, e, TpSplit::kReplicated);
  if (x.autocast) fw.push_back(attn_cast);
  fw.insert(fw.end(), qkv.forward.begin(), qkv.forward.end());
  const bool rotary = m.position_embedding == spec::PositionEmbedding::kRope;
  Op rope =
      unfused(memory_op("attn.rope", OpClass::kElementwise, 2 * T * (x.h + x.kv * x.d) / g.y * e,
                        TpSplit::kColumn, {T, (x.h + x.kv * x.d) / g.y}),
              passes.rope, passes.rope_kernels);
  if (rotary) fw.push_back(rope);
  AttentionCore core = attention_core(m, heads, passes, fw);
  fw.insert(fw.end(), proj.forward.begin(), proj.forward.end());
  gather_x("attn", fw);
  const int64_t residual_bytes = T * x.h * (2 * r + e + (m.dropout ? 1 : 0));
  Op attn_res = unfused(memory_op("attn.residual", OpClass::kElementwise, residual_bytes,
                                  TpSplit::kReplicated, {T, x.h}),
                        passes.residual, passes.residual_kernels);
  fw.push_back(attn_res);
  Op mlp_norm = unfused(
      memory_op("mlp.norm", OpClass::kNorm, 2 * T * x.h * r, TpSplit::kReplicated, {T, x.h}),
      passes.norm, passes.norm_kernels);
  fw.push_back(mlp_norm);
  Op mlp_cast = autocast_cast("mlp.cast", T * x.h / g.x, e, TpSplit::kReplicated);
  if (x.autocast) fw.push_back(mlp_cast);
  fw.insert(fw.end(), fc1.forward.begin(), fc1.forward.end());
  const int64_t ffn = x.f / g.y;
  Op act = unfused(memory_op("mlp.act", OpClass::kElementwise, (gate + 1) * T * ffn * e,
                             TpSplit::kColumn, {T, gate * ffn}),
                   passes.act, passes.act_kernels);
  fw.push_back(act);
  fw.insert(fw.end(), fc2.forward.begin(), fc2.forward.end());
  gather_x("mlp", fw);
  Op mlp_res = unfused(memory_op("mlp.residual", OpClass::kElementwise, residual_bytes,
                                 TpSplit::kReplicated, {T, x.h}),
                       passes.residual, passes.residual_kernels);
  fw.push_back(mlp_res);

  // Backward in execution order, as transformer_block's.
  std::vector<Op>& bw = layer.backward;
  auto norm_backward = [&](const Op& fwd) {
    Op op = memory_backward(fwd, 1.5);
    op.kernels = norm_bwd_kernels;
    return op;
  };
  bw.insert(bw.end(), fc2.backward.begin(), fc2.backward.end());
  if (passes.act_backward > 0) {
    Op act_bwd = memory_backward(act, passes.act_backward);
    act_bwd.kernels = passes.act_backward_kernels;
    bw.push_back(act_bwd);
  } else {
    bw.push_back(memory_backward(act, (2.0 * gate + 1) / (gate + 1)));
  }
  bw.insert(bw.end(), fc1.backward.begin(), fc1.backward.end());
  gather_x("mlp", bw);
  if (x.autocast) bw.push_back(memory_backward(mlp_cast, 1.0));
  bw.push_back(norm_backward(mlp_norm));
  bw.push_back(memory_backward(mlp_res, 2.0 / 3.0));
  bw.insert(bw.end(), proj.backward.begin(), proj.backward.end());
  bw.insert(bw.end(), core.backward.begin(), core.backward.end());
  if (rotary) bw.push_back(memory_backward(rope, 1.0));
  bw.insert(bw.end(), qkv.backward.begin(), qkv.backward.end());
  gather_x("attn", bw);
  if (x.autocast) bw.push_back(memory_backward(attn_cast, 1.0));
  bw.push_back(norm_backward(attn_norm));
  bw.push_back(memory_backward(attn_res, 2.0 / 3.0));
  if (x.autocast) bw.push_back(memory_backward(weight_cast, 1.0));

  // Parameters: each weight matrix's block sharded over z (1/tp of it per rank); the biases split
  // as their layer's outputs (QKV and FC1 over y, the projection and FC2 over x), the norms
  // whole. Those the z slices hold alike see only their slice's tokens: partial sums over z
  // (AxoNN's needs_depth_parallel_gradient_sync), summed with the norms once per step.
  const int64_t tp = g.x * g.y * g.z;
  const int64_t norm_params = m.norm == spec::Norm::kLayerNorm ? 2 * x.h : x.h;
  const int64_t bias = m.bias ? 1 : 0;
  const int64_t weights = x.h * qkv_full + x.h * x.h + gate * x.h * x.f + x.f * x.h;
  const int64_t biases_total = bias * (qkv_full + x.h + gate * x.f + x.h);
  const int64_t biases_rank = bias * (qkv_full / g.y + x.h / g.x + gate * x.f / g.y + x.h / g.x);
  layer.params_total = weights + biases_total + 2 * norm_params;
  layer.params = weights / tp + biases_rank + 2 * norm_params;
  if (g.z > 1) layer.sp_partial_params = biases_rank + 2 * norm_params;

  // Kept for backward: the norm inputs and dropout masks whole, the inputs of QKV and FC1 split
  // over x, Q, K and V, the projection's input, the activation's and FC2's input split over y,
  // and the attention core's.
  const int64_t mask = m.dropout ? 1 : 0;
  const int64_t whole = 2 * T * x.h * r + 2 * mask * T * x.h;
  const int64_t act_input = passes.act_saved > 0 ? T * ffn * passes.act_saved : gate * T * ffn * e;
  const int64_t split =
      2 * T * x.h / g.x * e + T * qkv_full / g.y * e + T * x.h / g.y * e + act_input + T * ffn * e;
  layer.saved_bytes = whole + split + core.saved_bytes;
  layer.saved_bytes_selective = whole + split;
  layer.saved_bytes_full = T * x.h * e;
  layer.output_bytes = T * x.h * e;
  return layer;
}

Layer transformer_embedding(const spec::TransformerSpec& m, const TransformerDims& x) {
  Layer layer;
  layer.name = "embedding";
  layer.kind = LayerKind::kEmbedding;
  const int64_t T = x.tokens();
  const int64_t e = x.e;
  // Vocabulary-parallel lookup: each rank gathers the rows it owns, zeros elsewhere.
  const int64_t r = x.residual_bytes();  // fp32 tables under autocast
  Op lookup =
      memory_op("embed.lookup", OpClass::kEmbedding, 2 * T * x.h * r, TpSplit::kVocab, {T, x.h});
  layer.forward.push_back(lookup);
  add_tp_reduce(layer.forward, x, "embed");
  bool has_positions = m.position_embedding == spec::PositionEmbedding::kLearned;
  Op pos;
  if (has_positions || m.type_vocab > 0) {
    pos = memory_op("embed.position", OpClass::kElementwise, 3 * x.norm_tokens() * x.h * r,
                    x.norm_split(), {x.norm_tokens(), x.h});
    layer.forward.push_back(pos);
  }
  Op enorm;
  if (m.architecture == spec::Architecture::kEncoder) {
    enorm = memory_op("embed.norm", OpClass::kNorm, 2 * x.norm_tokens() * x.h * e, x.norm_split(),
                      {x.norm_tokens(), x.h});
    layer.forward.push_back(enorm);
  }
  if (m.architecture == spec::Architecture::kEncoder) {
    layer.backward.push_back(memory_backward(enorm, 1.5));
  }
  if (has_positions || m.type_vocab > 0) layer.backward.push_back(memory_backward(pos, 2.0 / 3.0));
  add_sp_gather(layer.backward, x, "embed");
  layer.backward.push_back(memory_backward(lookup, 1.0));  // scatter-add into the table

  const int64_t norm_params = m.norm == spec::Norm::kLayerNorm ? 2 * x.h : x.h;
  int64_t shared = (has_positions ? m.max_positions * x.h : 0) + m.type_vocab * x.h +
                   (m.architecture == spec::Architecture::kEncoder ? norm_params : 0);
  layer.params_total = x.V * x.h + shared;
  layer.params = x.vocab_shard * x.h + shared;
  if (x.sp) layer.sp_partial_params = shared;
  layer.saved_bytes = layer.saved_bytes_selective = layer.saved_bytes_full =
      m.architecture == spec::Architecture::kEncoder ? x.norm_tokens() * x.h * e : 0;
  layer.output_bytes = x.norm_tokens() * x.h * e;
  return layer;
}

Layer transformer_head(const spec::TransformerSpec& m, const TransformerDims& x) {
  Layer layer;
  layer.name = "head";
  layer.kind = LayerKind::kHead;
  const int64_t T = x.tokens();
  const int64_t e = x.e;
  const int64_t vocab_shard = x.vocab_shard;
  const bool decoder = m.architecture == spec::Architecture::kDecoder;
  const int64_t norm_params = m.norm == spec::Norm::kLayerNorm ? 2 * x.h : x.h;
  const FusionPasses passes = fusion_passes(m, x);
  const int64_t r = x.residual_bytes();
  // Autocast casts the output weights (the embedding table when tied) in every forward and the
  // norm's fp32 output in front of the logits GEMM.
  Op weight_cast = autocast_cast("autocast.weights", vocab_shard * x.h, e, TpSplit::kVocab);
  Op head_cast = autocast_cast("head.cast", x.norm_tokens() * x.h, e, x.norm_split());
  if (x.autocast) layer.forward.push_back(weight_cast);
  Op fnorm;
  if (decoder) {
    fnorm = unfused(memory_op("head.norm", OpClass::kNorm, 2 * x.norm_tokens() * x.h * r,
                              x.norm_split(), {x.norm_tokens(), x.h}),
                    passes.norm, passes.norm_kernels);
    layer.forward.push_back(fnorm);
  }
  if (x.autocast) layer.forward.push_back(head_cast);
  add_sp_gather(layer.forward, x, "head");
  Op logits = gemm("head.logits", T, vocab_shard, x.h, e, TpSplit::kVocab);
  layer.forward.push_back(logits);
  // Cross-entropy over the rank's vocabulary shard, priced by the stack's implementation. The
  // base op is one fused pass: read the 16-bit logits, write the fp32 softmax the backward uses.
  Op loss = memory_op("head.loss", OpClass::kLoss, T * vocab_shard * (e + 4), TpSplit::kVocab,
                      {T, vocab_shard});
  const double fused_bytes = static_cast<double>(e + 4);
  double backward_factor = 1.0;
  switch (x.cross_entropy) {
    case spec::CrossEntropy::kEager:
      // logits.float() (2 + 4 bytes), log_softmax in fp32 (4 + 4), nll: 14 bytes per logit.
      loss = unfused(loss, 14.0 / fused_bytes, 3);
      break;
    case spec::CrossEntropy::kMegatron:
      // Megatron-LM gpt_model.py: vocab_parallel_cross_entropy(output.float(), labels), whose
      // forward (mpu/cross_entropy.py, tensor_parallel/cross_entropy.py) makes six passes over
      // the fp32 logits: the cast (e + 4 bytes), max (4), sub_ (4 + 4), exp (4 + 4), sum (4) and
      // div_ into the saved softmax (4 + 4): e + 36 bytes per logit. Its backward multiplies the
      // softmax in place by the loss gradient (4 + 4) and the cast's backward writes the 16-bit
      // gradient (4 + e): e + 12 bytes, in two kernels.
      loss = unfused(loss, static_cast<double>(e + 36) / fused_bytes, 6);
      backward_factor = static_cast<double>(e + 12) / static_cast<double>(e + 36);
      break;
    case spec::CrossEntropy::kFused:
      break;
    case spec::CrossEntropy::kCompiled:
      // One fused pass over the 16-bit logits (llm.c fused_classifier, Inductor).
      loss = unfused(loss, static_cast<double>(e) / fused_bytes, 1);
      break;
  }
  layer.forward.push_back(loss);
  if (x.t > 1) {
    // Vocabulary-parallel cross-entropy (Megatron-LM tensor_parallel/cross_entropy.py): the max
    // logit of each token first (each shard's sum of exponentials is relative to it), then the
    // sums of exponentials and the target logits together: fp32 values per token.
    layer.forward.push_back(comm_op("head.loss_all_reduce", CollectiveKind::kAllReduce, T * 4));
    layer.forward.push_back(comm_op("head.loss_all_reduce", CollectiveKind::kAllReduce, 2 * T * 4));
  }
  Op loss_backward = memory_backward(loss, backward_factor);
  if (x.cross_entropy == spec::CrossEntropy::kMegatron) loss_backward.kernels = 2;
  layer.backward.push_back(loss_backward);
  layer.backward.push_back(gemm_backward(logits));
  add_tp_reduce(layer.backward, x, "head");
  if (x.autocast) layer.backward.push_back(memory_backward(head_cast, 1.0));
  if (decoder) layer.backward.push_back(memory_backward(fnorm, 1.5));
  if (x.autocast) layer.backward.push_back(memory_backward(weight_cast, 1.0));

  int64_t pooler = m.pooler ? x.h * x.h + x.h : 0;
  int64_t out_proj = m.tied_embeddings ? 0 : x.V * x.h;
  layer.params_total = (decoder ? norm_params : 0) + out_proj + pooler;
  // With tied embeddings and pipeline stages the last stage keeps its own copy of the table
  // (Megatron-LM); that copy is memory, not a new parameter: stage_params adds it.
  layer.params = (decoder ? norm_params : 0) + (m.tied_embeddings ? 0 : vocab_shard * x.h) + pooler;
  if (x.sp && decoder) layer.sp_partial_params = norm_params;
  // Kept: norm input, logits input, fp32 softmax of the logits shard.
  layer.saved_bytes = (decoder ? x.norm_tokens() * x.h * e : 0) + T * x.h * e + T * vocab_shard * 4;
  layer.saved_bytes_selective = layer.saved_bytes;
  layer.saved_bytes_full = layer.saved_bytes;
  layer.output_bytes = T * 4;  // the loss per token (fp32)
  return layer;
}

LoweredModel lower_transformer(const spec::ModelSpec& model, const LoweringOptions& o) {
  spec::TransformerSpec m = model.transformer();
  m.dropout = m.dropout && o.dropout;  // a stack that runs no dropout trains the model without
  TransformerDims x{};
  const spec::TensorGrid& grid = o.tp_grid;
  // On a tensor grid each z slice takes micro_batch/z sequences; its x*y ranks hold the
  // vocabulary (the embedding and output layer, vocabulary-parallel over them).
  x.b = grid.any() ? o.micro_batch / grid.z : o.micro_batch;
  const int64_t seq = o.seq_len > 0 ? o.seq_len : m.seq_len;
  x.cp = o.cp;
  x.cp_algorithm = o.cp_algorithm;
  x.s = seq / std::max<int64_t>(o.cp, 1);
  x.ep = std::max<int64_t>(o.ep, 1);
  x.h = m.hidden;
  x.a = m.heads;
  x.kv = m.kv_heads;
  x.d = m.head_dim();
  x.f = m.ffn_hidden;
  x.V = m.vocab;
  x.t = grid.any() ? grid.x * grid.y : o.tp;
  x.vocab_shard = vocab_shard(m.vocab, x.t, o.vocab_multiple);
  x.e = spec::dtype_bytes(o.dtype);
  x.sp = o.sequence_parallel && o.tp > 1;
  x.attention = o.attention;
  x.fusion = o.fusion;
  x.cross_entropy = o.cross_entropy;
  x.autocast = o.autocast && x.e < 4;
  std::string source = fmt::format("model {}", model.name);
  if (grid.any()) {
    // The grid's rules (spec/tensor_grid.hpp) on the options' layout.
    spec::Plan shape;
    shape.tp = o.tp;
    shape.tp_grid = grid;
    shape.sequence_parallel = o.sequence_parallel;
    shape.cp = o.cp;
    shape.ep = o.ep;
    std::string problem = spec::tensor_grid_problem(shape);
    if (problem.empty()) problem = spec::tensor_grid_model_problem(model, grid, o.micro_batch);
    if (!problem.empty())
      throw InputError(source, "/tp_grid", spec::tensor_grid_text(grid), problem);
  } else if (std::string problem = spec::tensor_parallel_problem(model, o.tp); !problem.empty()) {
    throw InputError(source, "/tp", std::to_string(o.tp), problem);
  }
  if (o.cp > 1) {
    spec::Plan split;
    split.tp = o.tp;
    split.sequence_parallel = o.sequence_parallel;
    split.cp = o.cp;
    split.cp_algorithm = o.cp_algorithm;
    if (std::string problem = spec::context_parallel_problem(model, seq, split); !problem.empty())
      throw InputError(source, "/cp", std::to_string(o.cp), problem);
    if (std::string problem = spec::context_attention_problem(o.cp, o.cp_algorithm, o.attention);
        !problem.empty())
      throw InputError(
          source, "/cp_algorithm",
          std::string(spec::enum_name(spec::context_algorithm_names(), o.cp_algorithm)), problem);
  }
  if (std::string problem = spec::expert_model_problem(model, x.ep); !problem.empty())
    throw InputError(source, "/ep", std::to_string(x.ep), problem);
  if (x.sp)
    if (std::string problem = spec::sequence_parallel_problem(x.s, o.tp); !problem.empty())
      throw InputError(source, "/sequence_parallel", "true", problem);
  LoweredModel out;
  out.dtype = o.dtype;
  out.tokens_per_micro_batch = x.b * x.s;
  out.samples_per_micro_batch = x.b;
  out.layers.reserve(static_cast<size_t>(m.layers) + 2);
  out.layers.push_back(transformer_embedding(m, x));
  // The blocks are alike but for their names (and, in a mixture of experts, the dense first
  // ones): one of each kind is lowered, the others are its copies (the planner lowers a model per
  // (tp, micro-batch, sequence parallelism, stack), 96 blocks for GPT-3 175B, and building each
  // op again was a third of its estimate phase).
  const int64_t dense_layers = m.moe ? m.moe->dense_layers : m.layers;
  std::optional<Layer> dense, expert;
  for (int64_t i = 0; i < m.layers; ++i) {
    std::optional<Layer>& kind = i < dense_layers ? dense : expert;
    if (!kind)
      kind = grid.any() ? grid_block(m, x, grid) : transformer_block(m, x, 0, i >= dense_layers);
    out.layers.push_back(*kind);
    out.layers.back().name = fmt::format("block{}", i);
  }
  out.layers.push_back(transformer_head(m, x));
  if (grid.z > 1) {
    // The z slices hold the embedding and output layer alike and see only their own tokens.
    out.layers.front().sp_partial_params = out.layers.front().params;
    out.layers.back().sp_partial_params = out.layers.back().params;
  }
  out.split_begin = 1;
  out.split_end = out.layers.size() - 1;
  if (m.tied_embeddings) out.tied_table_params = x.vocab_shard * x.h;
  out.vocab_shard = x.vocab_shard;
  return out;
}

LoweredModel lower_mlp(const spec::ModelSpec& model, const LoweringOptions& o) {
  const spec::MlpSpec& m = model.mlp();
  const int64_t B = o.micro_batch;
  const int64_t e = spec::dtype_bytes(o.dtype);
  LoweredModel out;
  out.dtype = o.dtype;
  out.tokens_per_micro_batch = B;
  out.samples_per_micro_batch = B;
  const size_t n = m.widths.size() - 1;
  for (size_t i = 0; i < n; ++i) {
    Layer layer;
    layer.name = fmt::format("fc{}", i);
    layer.kind = LayerKind::kMlpLinear;
    const int64_t in = m.widths[i];
    const int64_t outw = m.widths[i + 1];
    Op fc = gemm(layer.name, B, outw, in, e, TpSplit::kReplicated);
    layer.forward.push_back(fc);
    const bool last = i + 1 == n;
    Op post = last ? memory_op("loss", OpClass::kLoss, B * outw * (e + 4), TpSplit::kReplicated,
                               {B, outw})
                   : memory_op(layer.name + ".act", OpClass::kElementwise, 2 * B * outw * e,
                               TpSplit::kReplicated, {B, outw});
    layer.forward.push_back(post);
    layer.backward.push_back(memory_backward(post, last ? 1.0 : 1.5));
    layer.backward.push_back(gemm_backward(fc));
    layer.params_total = layer.params = in * outw + (m.bias ? outw : 0);
    layer.saved_bytes = (B * in + B * outw) * e;
    layer.saved_bytes_selective = layer.saved_bytes;
    layer.saved_bytes_full = B * in * e;
    layer.output_bytes = B * outw * e;
    out.layers.push_back(std::move(layer));
  }
  out.split_begin = 0;
  out.split_end = out.layers.size();
  return out;
}

// A feature map: channels and the whole map's rows and columns (a rank of a spatial split holds
// a block of it).
struct Feature {
  int64_t c, h, w;
};

// How a CNN layer's maps are split: the plan's grid for the layers before the adaptive pool that
// ends the split (spec::spatial_layer_end), none after it.
struct MapSplit {
  spec::SpatialSplit grid;
  // Pixels per sample of the most loaded rank's block of an h x w map.
  int64_t block(int64_t h, int64_t w) const {
    return spec::shard_extent(h, grid.h) * spec::shard_extent(w, grid.w);
  }
};

// What lowering a CNN carries from op to op: how its channels are split over the plan's tp ranks
// (spec/channel_split.hpp: whether the map entering the next op is still whole on every rank),
// and how each forward collective runs backward (its twin; nullopt: not at all; absent from the
// map: again as it was), with the halos that bring in a layer's own input (the first layer's
// need no gradient back).
struct CnnState {
  int64_t tp = 1;
  bool whole = true;
  std::map<std::string, std::optional<Op>> backward;
  std::set<std::string> input_halos;
  // Channels of a `channels`-channel map one rank holds.
  int64_t held(int64_t channels) const { return whole ? channels : channels / tp; }
};

// A spatially split layer's exchange with its grid neighbours before `window` slides over `in`:
// the parts of its window input other ranks hold (spec::halo_elements, the most loaded rank's) of
// every channel of every sample, whole in the compute dtype. Backward sends the halo's share of
// the input gradient back to its owner, the same bytes the other way (add_cnn_backward).
// `reads_layer_input`: the window reads the layer's input (its halo gradient is dropped in the
// first layer). Returns the halo's elements per sample and channel (none unsplit).
int64_t add_halo(Layer& layer, const std::string& name, Feature in, const spec::Window& window,
                 const MapSplit& split, bool reads_layer_input, CnnState& st, int64_t B,
                 int64_t e) {
  if (!split.grid.any()) return 0;
  const int64_t elements = spec::halo_elements(window, split.grid);
  if (elements > 0) {
    layer.forward.push_back(
        comm_op(name + ".halo", CollectiveKind::kSendRecv, B * in.c * elements * e));
    if (reads_layer_input) st.input_halos.insert(name + ".halo");
  }
  return elements;
}

// Appends a convolution (+ batch norm + ReLU) to `layer`; returns the output map.
Feature add_conv(Layer& layer, const std::string& name, Feature in, int64_t out_c, int64_t k,
                 int64_t stride, int64_t pad, bool bias, bool bn, bool relu, int64_t B, int64_t e,
                 const MapSplit& split, CnnState& cs, bool reads_layer_input) {
  Feature o{out_c, spec::window_output(in.h, k, stride, pad),
            spec::window_output(in.w, k, stride, pad)};
  const int64_t in_pixels =
      split.block(in.h, in.w) + add_halo(layer, name, in, {in.h, in.w, o.h, o.w, k, stride, pad},
                                         split, reads_layer_input, cs, B, e);
  const int64_t out_pixels = split.block(o.h, o.w);
  // An implicit GEMM: M = B*Ho*Wo output pixels (of the rank's block), N = Cout, K = Cin*k*k;
  // split over tp, N = Cout/tp (whole input, stationary-y) or K = Cin/tp * k*k (stationary-x).
  int64_t n = out_c, cin = in.c, read_c = in.c, write_c = out_c, saved_c = in.c;
  std::optional<Op> after;  // stationary-x's reduce-scatter of the partial sums
  if (cs.tp > 1) {
    const int64_t in_map = B * in.c * in_pixels * e, out_map = B * out_c * out_pixels * e;
    switch (spec::channel_algorithm(cs.whole, in.c * in.h * in.w, out_c * o.h * o.w)) {
      case spec::ChannelAlgorithm::kWholeInput:
        n = write_c = out_c / cs.tp;
        break;
      case spec::ChannelAlgorithm::kStationaryX: {
        cin = read_c = saved_c = in.c / cs.tp;
        const Op reduce =
            comm_op(name + ".filter_reduce_scatter", CollectiveKind::kReduceScatter, out_map);
        cs.backward[reduce.name] =
            comm_op(name + ".filter_all_gather", CollectiveKind::kAllGather, out_map);
        after = reduce;
        break;
      }
      case spec::ChannelAlgorithm::kStationaryY: {
        n = write_c = out_c / cs.tp;
        const Op gather = comm_op(name + ".channel_all_gather", CollectiveKind::kAllGather, in_map);
        cs.backward[gather.name] =
            comm_op(name + ".channel_reduce_scatter", CollectiveKind::kReduceScatter, in_map);
        layer.forward.push_back(gather);
        break;
      }
    }
  }
  Op conv = gemm(name, B * out_pixels, n, cin * k * k, e, TpSplit::kReplicated);
  conv.op_class = OpClass::kConv;
  conv.bytes = (B * read_c * in_pixels + n * cin * k * k + B * write_c * out_pixels) * e;
  layer.forward.push_back(conv);
  if (after) layer.forward.push_back(*after);
  cs.whole = cs.tp == 1;
  o.c = out_c;
  const int64_t held_c = cs.held(out_c);
  layer.params += n * cin * k * k + (bias ? held_c : 0);
  layer.params_total += out_c * in.c * k * k + (bias ? out_c : 0) + (bn ? 2 * out_c : 0);
  int64_t out_bytes = B * held_c * out_pixels * e;
  layer.saved_bytes += B * saved_c * in_pixels * e;
  if (bn) {
    // Split ranks all-reduce each channel's partial sum and sum of squares (forward) and the sums
    // of the output gradient and of its product with the normalized input (backward), in fp32,
    // so the statistics are those of the whole maps (Dryden et al. §III-B).
    if (split.grid.any())
      layer.forward.push_back(
          comm_op(name + ".bn_allreduce", CollectiveKind::kAllReduce, 2 * out_c * 4));
    layer.forward.push_back(memory_op(name + ".bn", OpClass::kNorm, 2 * out_bytes,
                                      TpSplit::kReplicated, {B, held_c, o.h, o.w}));
    layer.params += 2 * held_c;
    layer.saved_bytes += out_bytes;
  }
  if (relu) {
    layer.forward.push_back(memory_op(name + ".relu", OpClass::kElementwise, 2 * out_bytes,
                                      TpSplit::kReplicated, {B, held_c, o.h, o.w}));
    layer.saved_bytes += out_bytes;
  }
  return o;
}

// Backward of a CNN layer: each forward op reversed, GEMM-like ops twice the forward cost, a
// communication op as it was (the halo's gradient goes back, the statistics' gradients are
// all-reduced with as many bytes; a channel split's collective becomes its twin in `cs`). Without
// `input_gradient` (the first layer: the image needs none) no halo gradient goes back.
void add_cnn_backward(Layer& layer, bool input_gradient, const CnnState& cs) {
  for (auto it = layer.forward.rbegin(); it != layer.forward.rend(); ++it) {
    if (it->is_comm()) {
      if (!input_gradient && cs.input_halos.count(it->name) > 0) continue;
      if (auto twin = cs.backward.find(it->name); twin != cs.backward.end()) {
        if (twin->second) layer.backward.push_back(*twin->second);
        continue;
      }
      layer.backward.push_back(*it);
    } else if (it->op_class == OpClass::kConv || it->op_class == OpClass::kGemm) {
      layer.backward.push_back(gemm_backward(*it));
    } else {
      layer.backward.push_back(memory_backward(*it, 1.5));
    }
  }
}

LoweredModel lower_cnn(const spec::ModelSpec& model, const LoweringOptions& o) {
  const spec::CnnSpec& m = model.cnn();
  const int64_t B = o.micro_batch;
  const int64_t e = spec::dtype_bytes(o.dtype);
  const size_t split_end = spec::spatial_layer_end(m);
  LoweredModel out;
  out.dtype = o.dtype;
  out.tokens_per_micro_batch = B;
  out.samples_per_micro_batch = B;
  out.tp_splits_activations = o.tp > 1;
  Feature f{m.in_channels, m.height, m.width};
  CnnState cs;
  cs.tp = o.tp;
  int64_t flat = 0;
  int index = 0;
  for (size_t li = 0; li < m.layers.size(); ++li) {
    const spec::CnnLayer& l = m.layers[li];
    // The layers before the one ending the split run on blocks; that one reads blocks and
    // hands every rank the whole (pooled) map.
    const MapSplit split{li <= split_end ? o.spatial : spec::SpatialSplit{}};
    const MapSplit out_split{li < split_end ? o.spatial : spec::SpatialSplit{}};
    int64_t repeats = l.kind == spec::CnnLayerKind::kBottleneck ? l.blocks : 1;
    for (int64_t r = 0; r < repeats; ++r) {
      Layer layer;
      layer.kind = LayerKind::kCnn;
      layer.name = fmt::format("layer{}", index++);
      const int64_t input_bytes = B * cs.held(f.c) * split.block(f.h, f.w) * e;
      switch (l.kind) {
        case spec::CnnLayerKind::kConv:
          f = add_conv(layer, layer.name + ".conv", f, l.out_channels, l.kernel, l.stride,
                       l.padding, l.bias, l.batch_norm, l.relu, B, e, split, cs, true);
          break;
        case spec::CnnLayerKind::kMaxPool:
        case spec::CnnLayerKind::kAvgPool: {
          Feature o2{f.c, spec::window_output(f.h, l.kernel, l.stride, l.padding),
                     spec::window_output(f.w, l.kernel, l.stride, l.padding)};
          add_halo(layer, layer.name + ".pool", f,
                   {f.h, f.w, o2.h, o2.w, l.kernel, l.stride, l.padding}, split, true, cs, B, e);
          const int64_t c = cs.held(f.c);
          layer.forward.push_back(
              memory_op(layer.name + ".pool", OpClass::kPool,
                        B * c * (split.block(f.h, f.w) + split.block(o2.h, o2.w)) * e,
                        TpSplit::kReplicated, {B, c, o2.h, o2.w}));
          layer.saved_bytes += B * c * split.block(f.h, f.w) * e;
          f = o2;
          break;
        }
        case spec::CnnLayerKind::kAdaptiveAvgPool: {
          Feature o2{f.c, l.output, l.output};
          const int64_t c = cs.held(f.c);
          layer.forward.push_back(memory_op(layer.name + ".pool", OpClass::kPool,
                                            B * c * (split.block(f.h, f.w) + o2.h * o2.w) * e,
                                            TpSplit::kReplicated, {B, c, o2.h, o2.w}));
          // Each rank sums its block's share of every window; the all-reduce of those partial
          // sums is the whole map's pooled output on every rank. Forward only: the pooled
          // gradient is whole on every rank and each takes its block's share.
          if (split.grid.any()) {
            const Op sums = comm_op(layer.name + ".pool_allreduce", CollectiveKind::kAllReduce,
                                    B * o2.c * o2.h * o2.w * e);
            cs.backward[sums.name] = std::nullopt;
            layer.forward.push_back(sums);
          }
          f = o2;
          break;
        }
        case spec::CnnLayerKind::kFc: {
          // Behind a channel split each rank holds a block of the flattened rows: a partial
          // product, all-reduced (forward only: the output gradient is whole on every rank).
          int64_t in = flat > 0 ? flat : cs.held(f.c) * f.h * f.w;
          Op fc = gemm(layer.name + ".fc", B, l.out_features, in, e, TpSplit::kReplicated);
          layer.forward.push_back(fc);
          if (!cs.whole) {
            const Op sums = comm_op(layer.name + ".fc.all_reduce", CollectiveKind::kAllReduce,
                                    B * l.out_features * e);
            cs.backward[sums.name] = std::nullopt;
            layer.forward.push_back(sums);
            cs.whole = true;
          }
          layer.params += in * l.out_features + (l.bias ? l.out_features : 0);
          layer.params_total +=
              (flat > 0 ? flat : f.c * f.h * f.w) * l.out_features + (l.bias ? l.out_features : 0);
          layer.saved_bytes += B * in * e;
          if (l.relu) {
            layer.forward.push_back(memory_op(layer.name + ".relu", OpClass::kElementwise,
                                              2 * B * l.out_features * e, TpSplit::kReplicated,
                                              {B, l.out_features}));
            layer.saved_bytes += B * l.out_features * e;
          }
          flat = l.out_features;
          f = {l.out_features, 1, 1};
          break;
        }
        case spec::CnnLayerKind::kBottleneck: {
          // torchvision ResNet v1.5: the stride sits on the 3x3 convolution; the first block
          // projects the shortcut with a strided 1x1 convolution when the shape changes.
          int64_t stride = r == 0 ? l.stride : 1;
          Feature in = f;
          const bool in_whole = cs.whole;
          Feature a = add_conv(layer, layer.name + ".conv1", in, l.mid_channels, 1, 1, 0, false,
                               true, true, B, e, split, cs, true);
          Feature b2 = add_conv(layer, layer.name + ".conv2", a, l.mid_channels, 3, stride, 1,
                                false, true, true, B, e, split, cs, false);
          Feature c = add_conv(layer, layer.name + ".conv3", b2, l.out_channels, 1, 1, 0, false,
                               true, false, B, e, split, cs, false);
          if (stride != 1 || in.c != l.out_channels) {
            const bool out_whole = cs.whole;
            cs.whole = in_whole;  // the shortcut reads the block's input
            add_conv(layer, layer.name + ".downsample", in, l.out_channels, 1, stride, 0, false,
                     true, false, B, e, split, cs, true);
            cs.whole = out_whole;
          }
          int64_t out_bytes = B * cs.held(c.c) * split.block(c.h, c.w) * e;
          layer.forward.push_back(memory_op(layer.name + ".residual", OpClass::kElementwise,
                                            3 * out_bytes, TpSplit::kReplicated,
                                            {B, cs.held(c.c), c.h, c.w}));
          layer.saved_bytes += out_bytes;
          f = c;
          break;
        }
      }
      if (li + 1 == m.layers.size()) {
        layer.forward.push_back(
            memory_op("loss", OpClass::kLoss, B * f.c * (e + 4), TpSplit::kReplicated, {B, f.c}));
      }
      add_cnn_backward(layer, !out.layers.empty(), cs);
      layer.saved_bytes_selective = layer.saved_bytes;
      layer.saved_bytes_full = std::min(input_bytes, layer.saved_bytes);  // the layer input
      layer.output_bytes = B * cs.held(f.c) * out_split.block(f.h, f.w) * e;
      out.layers.push_back(std::move(layer));
    }
  }
  out.split_begin = 0;
  out.split_end = out.layers.size();
  return out;
}

}  // namespace

LoweredModel lower(const spec::ModelSpec& model, const LoweringOptions& options) {
  SEXTANT_CHECK(options.micro_batch > 0 && options.tp > 0, "bad lowering options");
  if (std::string problem = spec::spatial_split_problem(model, options.spatial); !problem.empty())
    throw InputError(fmt::format("model {}", model.name), "/spatial",
                     fmt::format("{}x{}", options.spatial.h, options.spatial.w), problem);
  if (std::string problem = spec::channel_with_spatial_problem(options.tp, options.spatial);
      !problem.empty())
    throw InputError(fmt::format("model {}", model.name), "/spatial",
                     fmt::format("{}x{}", options.spatial.h, options.spatial.w), problem);
  if (!model.is_transformer())
    if (std::string problem = spec::tensor_parallel_problem(model, options.tp); !problem.empty())
      throw InputError(fmt::format("model {}", model.name), "/tp", std::to_string(options.tp),
                       problem);
  switch (model.kind()) {
    case spec::ModelKind::kTransformer:
      return lower_transformer(model, options);
    case spec::ModelKind::kMlp:
      return lower_mlp(model, options);
    case spec::ModelKind::kCnn:
      return lower_cnn(model, options);
  }
  return {};
}

}  // namespace sextant::models
