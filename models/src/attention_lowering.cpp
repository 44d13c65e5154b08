// The attention core of a transformer block on one rank: unfused or a flash kernel, and context
// parallelism's algorithms around it (ring, all-gather, all-to-all).
#include <algorithm>
#include <optional>

#include "sextant/models/flash_flops.hpp"
#include "transformer_lowering.hpp"

namespace sextant::models {

namespace {

// Context parallelism's transfers, on the ranks splitting each sequence.
Op context_op(OpId name, CollectiveKind kind, int64_t bytes) {
  Op op = comm_op(name, kind, bytes);
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
  op.id = OpId::kAttnCore;
  op.name = op_name(OpId::kAttnCore);
  op.op_class = OpClass::kAttention;
  op.causal = m.architecture == spec::Architecture::kDecoder;
  op.dropout = m.dropout;
  op.flops = flash_attention_executed_flops(x.b * heads, sq, sk, x.d, false, false);
  op.kernel_flops = flash_attention_executed_flops(x.b * heads, sq, sk, x.d, op.causal, false);
  op.bytes = 2 * x.b * (sq + sk) * heads * x.d * x.e + x.b * heads * sq * 4;
  op.shape = {x.b * heads, sq, sk, x.d};
  op.split = TpSplit::kHead;
  op.core_attention = true;
  op.fused_attention = true;
  return op;
}

// The flash-attn package takes q, k, v and returns the output batch-major; a sequence-major stack
// (Stack::code.layout) transposes them into it and the output back, and backward the output's
// gradient in and q's, k's and v's out: Transformer Engine 1.8 FlashAttention.forward on sbhd
// ([x.transpose(0, 1).contiguous() for x in (q, k, v)], output .view(b, s, -1).transpose(0, 1)
// .contiguous(); Megatron-Core 0.8 TEDotProductAttention does the same with rope fusion).
// Non-contiguous copies: the strided family's rate (TensorIterator's legacy elementwise_kernel,
// bench/eager_kernel_rates.py), each element read and written. The transpose of one sequence
// (b = 1) is a view; cuDNN reads either order through strides. Inside the attention module, so
// selective recompute re-runs them. The same op stands for each pass's copies.
std::optional<Op> layout_copies(const TransformerDims& x) {
  const bool flash_attn = x.attention == spec::AttentionKernel::kFlash2 ||
                          x.attention == spec::AttentionKernel::kFlash3;
  if (!flash_attn || x.code.layout != spec::ActivationLayout::kSbhd || x.b == 1)
    return std::nullopt;
  const int64_t heads = x.a / x.t, kv_heads = x.kv / x.t;
  const int64_t elements = x.tokens() * (2 * heads + 2 * kv_heads) * x.d;  // q, k, v, output
  Op copy = memory_op(OpId::kAttnLayoutCopy, OpClass::kElementwise, elements * 2 * x.e,
                      TpSplit::kHead, {x.tokens(), (2 * heads + 2 * kv_heads) * x.d});
  copy.memory_kernel = spec::MemoryKernel::kStrided;
  copy.kernels = 4;
  copy.core_attention = true;
  return copy;
}

}  // namespace

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
    Op gather = context_op(OpId::kCpKvAllGather, CollectiveKind::kAllGather, x.kv_bytes() * x.cp);
    before_fw.push_back(gather);
    before_bw.push_back(gather);
    after_bw.push_back(
        context_op(OpId::kCpKvReduceScatter, CollectiveKind::kReduceScatter, x.kv_bytes() * x.cp));
  }
  if (cp && algorithm == spec::ContextAlgorithm::kAllToAll) {
    before_fw.push_back(context_op(OpId::kCpQkvAllToAll, CollectiveKind::kAllToAll, qkv_bytes));
    after_fw.push_back(context_op(OpId::kCpOutAllToAll, CollectiveKind::kAllToAll, out_bytes));
    before_bw.push_back(context_op(OpId::kCpOutAllToAll, CollectiveKind::kAllToAll, out_bytes));
    after_bw.push_back(context_op(OpId::kCpQkvAllToAll, CollectiveKind::kAllToAll, qkv_bytes));
  }
  AttentionCore core;
  fw.insert(fw.end(), before_fw.begin(), before_fw.end());
  const std::optional<Op> copies = layout_copies(x);
  if (copies) fw.push_back(*copies);
  if (spec::is_fused_attention(x.attention)) {
    // FlashAttention (Dao et al. 2022, §3.1; FA2 §3.1.1): no s x s tensor is written; the kernel
    // keeps the output and the fp32 log-sum-exp per row, and the backward recomputes the scores:
    // 2.5x the forward's executed FLOPs (5 matmuls against 2).
    Op op = flash_core(m, x, heads, sq, sk);
    Op bwd = op;
    bwd.flops = 2 * op.flops;
    bwd.kernel_flops = flash_attention_executed_flops(op.shape[0], sq, sk, x.d, op.causal, true);
    bwd.bytes = 2 * op.bytes;
    // Before the main backward kernel, D = rowsum(dO * O); after it, the fp32 dQ accumulator is
    // converted to 16 bits (flash-attention's dot_do_o and convert_dq kernels, cuDNN's
    // compute_dot_do_o and convert_dq_to_16bits). Attention's own kernels, so attention's class
    // (as profilers group them; traces::kernel_class), memory-bound.
    const int64_t q_elements = x.b * sq * heads * x.d;
    Op prep = memory_op(OpId::kAttnCorePrep, OpClass::kAttention,
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
      Op merge = memory_op(OpId::kAttnCpMerge, OpClass::kElementwise,
                           q_elements * (e + 8) + x.b * heads * sq * 12, TpSplit::kHead,
                           {x.b * sq, heads * x.d});
      Op merge_bwd =
          memory_op(OpId::kAttnCpMerge, OpClass::kElementwise, (q_elements + kv_elements) * (e + 8),
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
          Op send = context_op(OpId::kCpKvSend, CollectiveKind::kSendRecv, x.kv_bytes());
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
        Op send = context_op(OpId::kCpKvSend, CollectiveKind::kSendRecv, bytes);
        send.beside_next = true;
        core.backward.push_back(send);
        // Backward runs the steps in reverse (TE): the rank's own, masked block last.
        core.backward.push_back(i + 1 == x.cp ? bwd : later_bwd);
        if (i > 0) core.backward.push_back(merge_bwd);
      }
      if (copies) core.backward.push_back(*copies);
      core.saved_bytes = x.b * heads * sq * 4;
      return core;
    }
    fw.push_back(op);
    fw.insert(fw.end(), after_fw.begin(), after_fw.end());
    core.backward = before_bw;
    core.backward.push_back(prep);
    core.backward.push_back(bwd);
    if (copies) core.backward.push_back(*copies);
    core.backward.insert(core.backward.end(), after_bw.begin(), after_bw.end());
    return core;
  }
  Op scores = batched_gemm(OpId::kAttnScores, x.b * heads, sq, sk, x.d, e);
  fw.push_back(scores);
  Op softmax =
      unfused(memory_op(OpId::kAttnSoftmax, OpClass::kElementwise, 2 * x.b * heads * sq * sk * e,
                        TpSplit::kHead, {x.b * heads, sq, sk}),
              passes.softmax, passes.softmax_kernels);
  softmax.core_attention = true;
  fw.push_back(softmax);
  Op attn_drop;
  if (m.dropout) {
    attn_drop =
        memory_op(OpId::kAttnDropout, OpClass::kElementwise, x.b * heads * sq * sk * (2 * e + 1),
                  TpSplit::kHead, {x.b * heads, sq, sk});
    attn_drop.core_attention = true;
    fw.push_back(attn_drop);
  }
  Op context = batched_gemm(OpId::kAttnContext, x.b * heads, sq, x.d, sk, e);
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

}  // namespace sextant::models
