// What the software stack changes in the lowering: a fused flash-attention core (FLOPs as
// FlashAttention counts them, the log-sum-exp instead of the s^2 tensors of Korthikanti et al.),
// and the memory passes of eager, fused and compiled kernels. Expected values worked by hand.
#include <gtest/gtest.h>

#include <algorithm>

#include "sextant/models/counts.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/optimizer_step.hpp"
#include "sextant/models/zoo.hpp"

namespace sextant::models {
namespace {

const Op& find(const std::vector<Op>& ops, const std::string& name) {
  for (const Op& op : ops)
    if (op.name == name) return op;
  ADD_FAILURE() << "no op " << name;
  static Op none;
  return none;
}

bool has(const std::vector<Op>& ops, const std::string& name) {
  for (const Op& op : ops)
    if (op.name == name) return true;
  return false;
}

LoweringOptions options(spec::AttentionKernel attention, spec::Fusion fusion, int64_t tp = 1,
                        bool sp = false, int64_t b = 4) {
  LoweringOptions o;
  o.micro_batch = b;
  o.dtype = spec::Dtype::kBf16;
  o.tp = tp;
  o.sequence_parallel = sp;
  o.attention = attention;
  o.fusion = fusion;
  o.cross_entropy = spec::default_cross_entropy(fusion);
  return o;
}

TEST(StackLowering, FlashAttentionCountsAndKeeps) {
  // The 22B model of Korthikanti et al.: s 2048, h 6144, a 64 (d 96), TP 8, b 4.
  spec::ModelSpec m = zoo_model("megatron-22b");
  const double s = 2048, b = 4, h = 6144, a = 64, d = 96, t = 8;
  LoweredModel flash = lower(m, options(spec::AttentionKernel::kCudnn, spec::Fusion::kFused, 8));
  const Layer& block = flash.layers[flash.split_begin];
  EXPECT_FALSE(has(block.forward, "attn.scores"));
  EXPECT_FALSE(has(block.forward, "attn.softmax"));
  const Op& core = find(block.forward, "attn.core");
  // Forward FLOPs as Narayanan et al. count them (4*b*s^2*h over the tp ranks); the causal kernel
  // executes half (FA2 §4.1); the backward 2.5x the executed forward (5 matmuls against 2).
  EXPECT_DOUBLE_EQ(core.flops, 4 * b * s * s * h / t);
  EXPECT_DOUBLE_EQ(core.executed_flops(), 2 * b * s * s * h / t);
  EXPECT_TRUE(core.causal);
  EXPECT_EQ(core.shape, (std::vector<int64_t>{4 * 8, 2048, 2048, 96}));
  const Op& core_bwd = find(block.backward, "attn.core");
  EXPECT_DOUBLE_EQ(core_bwd.flops, 8 * b * s * s * h / t);
  EXPECT_DOUBLE_EQ(core_bwd.executed_flops(), 2.5 * 2 * b * s * s * h / t);
  EXPECT_TRUE(has(block.backward, "attn.core_prep"));
  // Kept for backward: Korthikanti's TP baseline without the 5as^2b/t core, plus the fp32
  // log-sum-exp of the rank's heads (4 bytes per row).
  EXPECT_DOUBLE_EQ(static_cast<double>(block.saved_bytes),
                   s * b * h * (10 + 24 / t) + 4 * b * (a / t) * s);
  EXPECT_DOUBLE_EQ(static_cast<double>(block.saved_bytes_selective), s * b * h * (10 + 24 / t));
  (void)d;
  // Model FLOPs (MFU) do not depend on the kernel.
  LoweredModel unfused =
      lower(m, options(spec::AttentionKernel::kUnfused, spec::Fusion::kFused, 8));
  const Layer& ub = unfused.layers[unfused.split_begin];
  EXPECT_DOUBLE_EQ(block.forward_flops(), ub.forward_flops());
  EXPECT_DOUBLE_EQ(block.backward_flops(), ub.backward_flops());
}

TEST(StackLowering, SequenceMajorStacksTransposeAroundTheFlashAttnKernel) {
  // Llama-3 8B (heads 32, kv heads 8, d 128, sequence 8192) on tp 2: a rank holds 16 query heads
  // and 4 key/value heads. Under a sequence-major stack ([s, b, h], Megatron) the flash-attn
  // kernel's batch-major q, k, v and output are copies: 2 x 8192 tokens x (16 + 2 x 4 + 16)
  // heads x 128 elements, each read and written in 2 bytes.
  spec::ModelSpec m = zoo_model("llama3-8b");
  LoweringOptions o = options(spec::AttentionKernel::kFlash2, spec::Fusion::kFused, 2, false, 2);
  o.code.layout = spec::ActivationLayout::kSbhd;
  LoweredModel l = lower(m, o);
  const Layer& block = l.layers[l.split_begin];
  const double elements = 2.0 * 8192 * (16 + 2 * 4 + 16) * 128;
  for (const std::vector<Op>* pass : {&block.forward, &block.backward}) {
    const Op& copy = find(*pass, "attn.layout_copy");
    EXPECT_DOUBLE_EQ(static_cast<double>(copy.bytes), elements * 2 * 2);
    EXPECT_EQ(copy.memory_kernel, spec::MemoryKernel::kStrided);
    EXPECT_EQ(copy.kernels, 4);
    EXPECT_TRUE(copy.core_attention);  // inside the module selective recompute re-runs
  }
  // Forward the copies lead the kernel; backward they follow its gradient kernel.
  auto at = [](const std::vector<Op>& ops, const std::string& name) {
    return std::find_if(ops.begin(), ops.end(), [&](const Op& op) { return op.name == name; }) -
           ops.begin();
  };
  EXPECT_LT(at(block.forward, "attn.layout_copy"), at(block.forward, "attn.core"));
  EXPECT_GT(at(block.backward, "attn.layout_copy"), at(block.backward, "attn.core"));
  // No copies: one sequence (the transposes are views), cuDNN (strided reads), batch-major code.
  LoweringOptions one = o;
  one.micro_batch = 1;
  LoweringOptions cudnn = o;
  cudnn.attention = spec::AttentionKernel::kCudnn;
  LoweringOptions bshd = o;
  bshd.code.layout = spec::ActivationLayout::kBshd;
  for (const LoweringOptions& other : {one, cudnn, bshd}) {
    LoweredModel n = lower(m, other);
    EXPECT_FALSE(has(n.layers[n.split_begin].forward, "attn.layout_copy"));
    EXPECT_FALSE(has(n.layers[n.split_begin].backward, "attn.layout_copy"));
  }
}

TEST(StackLowering, EncodersAreNotCausal) {
  LoweredModel l =
      lower(zoo_model("bert-large"), options(spec::AttentionKernel::kFlash2, spec::Fusion::kFused));
  const Op& core = find(l.layers[l.split_begin].forward, "attn.core");
  EXPECT_FALSE(core.causal);
  EXPECT_DOUBLE_EQ(core.executed_flops(), core.flops);
}

TEST(StackLowering, FusionLevelsChangeTheMemoryPasses) {
  // llama-tiny: RMSNorm, SwiGLU, rotary embeddings, b 4, s 32, h 64, ffn 128.
  spec::ModelSpec m = zoo_model("llama-tiny");
  auto block = [&](spec::Fusion f) {
    return lower(m, options(spec::AttentionKernel::kUnfused, f)).layers[1];
  };
  Layer fused = block(spec::Fusion::kFused);
  LoweringOptions composite = options(spec::AttentionKernel::kUnfused, spec::Fusion::kEager);
  composite.fused_rms_norm = false;  // Hugging Face's LlamaRMSNorm
  Layer eager = lower(m, composite).layers[1];
  Layer compiled = block(spec::Fusion::kCompiled);
  const int64_t T = 4 * 32, h = 64, f = 128, e = 2;
  // Fused RMSNorm reads and writes T x h once.
  EXPECT_EQ(find(fused.forward, "attn.norm").bytes, 2 * T * h * e);
  // Eager RMSNorm (cast, pow, mean, rsqrt, multiply, cast, weight): 36 bytes per element, 7
  // kernels.
  EXPECT_EQ(find(eager.forward, "attn.norm").bytes, 18 * T * h * e);
  EXPECT_EQ(find(eager.forward, "attn.norm").kernels, 7);
  // Eager with PyTorch's fused RMSNorm (nn.RMSNorm on CUDA): the fused kernel's one pass, and a
  // grad-input and a gamma kernel backward.
  Layer eager_fused_norm = block(spec::Fusion::kEager);
  EXPECT_EQ(find(eager_fused_norm.forward, "attn.norm").bytes, 2 * T * h * e);
  EXPECT_EQ(find(eager_fused_norm.forward, "attn.norm").kernels, 1);
  // ATen's native kernels: grad-input reads dy and x and writes dx (3 passes), the gamma kernel
  // reads dy and x again (2, in h / 32 = 2 blocks): 5 passes against the forward's 2.
  const Op& native_backward = find(eager_fused_norm.backward, "attn.norm");
  EXPECT_EQ(native_backward.kernels, 2);
  EXPECT_EQ(native_backward.memory_kernel, spec::MemoryKernel::kNativeNorm);
  EXPECT_EQ(native_backward.bytes, 5 * T * h * e);
  EXPECT_EQ(native_backward.narrow_bytes, 2 * T * h * e);
  EXPECT_EQ(native_backward.narrow_blocks, 2);
  // The composed eager RMSNorm and the fused (Megatron) kernel are no native kernels: 1.5x.
  EXPECT_EQ(find(eager.forward, "attn.norm").memory_kernel, spec::MemoryKernel::kGeneric);
  EXPECT_EQ(find(fused.backward, "attn.norm").bytes, 3 * T * h * e);
  EXPECT_EQ(find(fused.backward, "attn.norm").narrow_bytes, 0);
  // Compiled: the norm is fused into the residual add before it and only writes its output.
  EXPECT_EQ(find(compiled.forward, "mlp.norm").bytes, T * h * e);
  EXPECT_EQ(find(compiled.forward, "mlp.norm").kernels, 0);
  // SwiGLU: the fused kernel reads gate and up and writes the product (3 T x f passes); eager
  // SiLU then multiply takes 5.
  EXPECT_EQ(find(fused.forward, "mlp.act").bytes, 3 * T * f * e);
  EXPECT_EQ(find(eager.forward, "mlp.act").bytes, 5 * T * f * e);
  // GEMMs do not change with the fusion level.
  EXPECT_EQ(find(eager.forward, "mlp.fc1").bytes, find(fused.forward, "mlp.fc1").bytes);
}

TEST(StackLowering, AutocastKeepsTheResidualStreamInFp32AndCasts) {
  // gpt-tiny (h 128, ffn 4h, no dropout) at b 4, s 128 under torch.autocast over fp32 weights.
  spec::ModelSpec m = zoo_model("gpt-tiny");
  LoweringOptions o = options(spec::AttentionKernel::kSdpa, spec::Fusion::kEager);
  o.autocast = true;
  const Layer block = lower(m, o).layers[1];
  const int64_t T = 4 * 128, h = 128, e = 2;
  // LayerNorm reads and writes fp32; its output is cast to bf16 for the GEMM (4 + 2 bytes).
  EXPECT_EQ(find(block.forward, "attn.norm").bytes, 2 * T * h * 4);
  EXPECT_EQ(find(block.forward, "attn.cast").bytes, T * h * (4 + e));
  EXPECT_EQ(find(block.backward, "attn.cast").bytes, T * h * (4 + e));
  // The residual add reads the fp32 stream and the bf16 branch, writes fp32: in eager PyTorch a
  // mixed-dtype kernel, as is the backward of every autocast cast (the 16-bit gradient to fp32).
  // The forward casts (fp32 -> bf16) have a vectorized kernel of their own.
  EXPECT_EQ(find(block.forward, "mlp.residual").bytes, T * h * (4 + e + 4));
  EXPECT_EQ(find(block.forward, "mlp.residual").mixed_dtype_bytes, T * h * (4 + e + 4));
  EXPECT_EQ(find(block.backward, "mlp.residual").mixed_dtype_bytes, 0);
  EXPECT_EQ(find(block.forward, "attn.cast").mixed_dtype_bytes, 0);
  EXPECT_EQ(find(block.backward, "attn.cast").mixed_dtype_bytes, T * h * (4 + e));
  EXPECT_EQ(find(block.backward, "autocast.weights").mixed_dtype_bytes, 12 * h * h * (4 + e));
  // Every forward casts the 12h^2 GEMM weights (qkv 3h^2, proj h^2, fc1 and fc2 4h^2 each).
  EXPECT_EQ(find(block.forward, "autocast.weights").bytes, 12 * h * h * (4 + e));
  // The fp32 norm inputs are kept for backward: 2 x T x h x (4 - 2) more than without autocast.
  o.autocast = false;
  const Layer plain = lower(m, o).layers[1];
  EXPECT_EQ(block.saved_bytes - plain.saved_bytes, 2 * T * h * (4 - e));
  EXPECT_FALSE(has(plain.forward, "attn.cast"));
  // Compiled code casts inside its fused kernels: nothing mixed-dtype.
  o.autocast = true;
  o.fusion = spec::Fusion::kCompiled;
  EXPECT_EQ(find(lower(m, o).layers[1].backward, "attn.cast").mixed_dtype_bytes, 0);
  EXPECT_EQ(find(lower(m, o).layers[1].forward, "mlp.residual").mixed_dtype_bytes, 0);
  // fp32 training has nothing to cast.
  o.fusion = spec::Fusion::kEager;
  o.dtype = spec::Dtype::kFp32;
  EXPECT_FALSE(has(lower(m, o).layers[1].forward, "autocast.weights"));
}

// Inductor fuses the pointwise ops beside each norm into the norm's kernel, which a profile names
// by its norm (the project's compiled Llama traces: ..._fused_rms_norm__to_copy__unsafe_view_add):
// compiled, each autocast cast of a norm's output, the attention residual's add (fused into the
// MLP norm) and both residual gradients' adds are norm time; the MLP residual's forward add ends
// the per-block graph and stays elementwise. Eager and fused stacks keep them all elementwise.
TEST(StackLowering, CompiledNormKernelsHoldTheirNeighbours) {
  spec::ModelSpec m = zoo_model("gpt-tiny");
  LoweringOptions o = options(spec::AttentionKernel::kSdpa, spec::Fusion::kCompiled);
  o.autocast = true;
  const Layer compiled = lower(m, o).layers[1];
  for (const char* name : {"attn.cast", "mlp.cast", "attn.residual"}) {
    EXPECT_EQ(find(compiled.forward, name).op_class, spec::OpClass::kNorm) << name;
    EXPECT_EQ(find(compiled.backward, name).op_class, spec::OpClass::kNorm) << name;
  }
  EXPECT_EQ(find(compiled.forward, "mlp.residual").op_class, spec::OpClass::kElementwise);
  EXPECT_EQ(find(compiled.backward, "mlp.residual").op_class, spec::OpClass::kNorm);
  // The class moves time between the profile's rows, not the ops' bytes.
  for (spec::Fusion fusion : {spec::Fusion::kEager, spec::Fusion::kFused}) {
    o.fusion = fusion;
    const Layer other = lower(m, o).layers[1];
    for (const char* name : {"attn.cast", "mlp.cast", "attn.residual", "mlp.residual"}) {
      EXPECT_EQ(find(other.forward, name).op_class, spec::OpClass::kElementwise) << name;
      EXPECT_EQ(find(other.backward, name).op_class, spec::OpClass::kElementwise) << name;
    }
  }
  o.fusion = spec::Fusion::kFused;
  const Layer fused = lower(m, o).layers[1];
  EXPECT_EQ(find(compiled.forward, "attn.residual").bytes,
            find(fused.forward, "attn.residual").bytes);
}

// Transformer Engine's fp8 recipe (TE 1.8 as Megatron-Core builds it), by hand on Llama-2 7B
// (h 4096, ffn 11008, SwiGLU, MHA), b 1, s 4096, tp 1, bf16 tensors (e = 2), T = 4096 tokens:
// - attn.fp8_cast forward: proj's input cast + transposed, T h (e + 2) = 4096 * 4096 * 4 bytes;
// - attn.fp8_cast backward: qkv's (3h) and proj's (h) output gradients cast + transposed,
//   T 4h (e + 2), plus the norm's fp8 output transposed, T h * 2;
// - mlp.fp8_cast forward: fc2's input, T ffn (e + 2); backward: fc1's (2 ffn) and fc2's (h)
//   output gradients, T (2 ffn + h)(e + 2), plus T h * 2.
// The four linears keep their inputs in fp8 (1 byte): 2 T h + T h + T ffn bytes fewer kept.
TEST(StackLowering, Fp8CastsAroundEachLinearAndFp8InputsKept) {
  const spec::ModelSpec m = zoo_model("llama2-7b");
  LoweringOptions o = options(spec::AttentionKernel::kCudnn, spec::Fusion::kFused, 1, false, 1);
  o.seq_len = 4096;
  const LoweredModel bf16 = lower(m, o);
  o.fp8_gemms = true;
  const LoweredModel fp8 = lower(m, o);
  const Layer& plain = bf16.layers[bf16.split_begin];
  const Layer& block = fp8.layers[fp8.split_begin];
  const int64_t T = 4096, h = 4096, ffn = 11008;
  EXPECT_FALSE(has(plain.forward, "attn.fp8_cast"));
  EXPECT_EQ(find(block.forward, "attn.fp8_cast").bytes, T * h * 4);
  EXPECT_EQ(find(block.backward, "attn.fp8_cast").bytes, T * 4 * h * 4 + T * h * 2);
  EXPECT_EQ(find(block.forward, "mlp.fp8_cast").bytes, T * ffn * 4);
  EXPECT_EQ(find(block.backward, "mlp.fp8_cast").bytes, T * (2 * ffn + h) * 4 + T * h * 2);
  // The casts run just before the GEMM whose input (forward) or gradient (backward) they make.
  auto index = [](const std::vector<Op>& ops, const std::string& name) {
    for (size_t i = 0; i < ops.size(); ++i)
      if (ops[i].name == name) return i;
    return ops.size();
  };
  EXPECT_EQ(index(block.forward, "attn.fp8_cast") + 1, index(block.forward, "attn.proj"));
  EXPECT_EQ(index(block.forward, "mlp.fp8_cast") + 1, index(block.forward, "mlp.fc2"));
  EXPECT_EQ(index(block.backward, "mlp.fp8_cast") + 1, index(block.backward, "mlp.fc2"));
  EXPECT_EQ(plain.saved_bytes - block.saved_bytes, (3 * T * h + T * ffn) * (2 - 1));
  EXPECT_EQ(block.saved_bytes_full, plain.saved_bytes_full);  // the block input stays bf16
  // TE's cast-transpose kernels have a rate of their own; Inductor's casts (compiled code) do not.
  for (const char* name : {"attn.fp8_cast", "mlp.fp8_cast"}) {
    EXPECT_EQ(find(block.forward, name).memory_kernel, spec::MemoryKernel::kCastTranspose);
    EXPECT_EQ(find(block.backward, name).memory_kernel, spec::MemoryKernel::kCastTranspose);
  }
  o.fusion = spec::Fusion::kCompiled;
  const Layer compiled = lower(m, o).layers[fp8.split_begin];
  EXPECT_EQ(find(compiled.forward, "mlp.fp8_cast").memory_kernel, spec::MemoryKernel::kGeneric);
  EXPECT_EQ(find(compiled.backward, "attn.fp8_cast").memory_kernel, spec::MemoryKernel::kGeneric);
}

// TorchTitan's per-op selective checkpointing by hand on Llama-3 8B (h 4096, 32 heads, 8 kv heads
// of 128, ffn 14336, SwiGLU), b 1, s 2048, tp 1, bf16, cuDNN attention: T = 2048 tokens.
// Kept: the block input T h, wq's output T h, wv's T kv d = T 1024, w1's T ffn, w2's T h (2 bytes
// each) and SDPA's output T h (2 bytes) with its fp32 log-sum-exp T a (4 bytes).
// Re-run: wk (T x 1024 x 4096), wo (T x 4096 x 4096) and w3 (T x 14336 x 4096): 2 T (1024 + 4096
// + 14336) 4096 FLOPs, and every memory-bound op of the forward; not the attention kernel.
TEST(StackLowering, TorchTitansSelectiveCheckpointingKeepsEveryOtherMatmul) {
  const spec::ModelSpec m = zoo_model("llama3-8b");
  LoweringOptions o = options(spec::AttentionKernel::kCudnn, spec::Fusion::kEager, 1, false, 1);
  o.seq_len = 2048;
  o.selective = spec::SelectiveRecompute::kSaveMatmuls;
  const LoweredModel titan = lower(m, o);
  o.selective = spec::SelectiveRecompute::kAttentionCore;
  const LoweredModel megatron = lower(m, o);
  const Layer& block = titan.layers[titan.split_begin];
  const int64_t T = 2048, h = 4096, kvd = 1024, ffn = 14336, a = 32;
  EXPECT_EQ(block.saved_bytes_selective,
            2 * (T * h + T * h + T * kvd + T * ffn + T * h) + 2 * T * h + 4 * T * a);
  double gemm_flops = 0;
  bool core = false, fc2 = false;
  for (const Op& op : block.selective_forward) {
    if (op.op_class == spec::OpClass::kGemm) gemm_flops += op.flops;
    core = core || op.name == "attn.core";
    fc2 = fc2 || op.name == "mlp.fc2";
  }
  EXPECT_DOUBLE_EQ(gemm_flops, 2.0 * T * (kvd + h + ffn) * h);
  EXPECT_FALSE(core);
  EXPECT_FALSE(fc2);
  EXPECT_TRUE(has(block.selective_forward, "attn.norm"));
  EXPECT_TRUE(has(block.selective_forward, "mlp.act"));
  // Megatron's policy re-runs the attention core alone.
  const Layer& plain = megatron.layers[megatron.split_begin];
  ASSERT_EQ(plain.selective_forward.size(), 1u);
  EXPECT_EQ(plain.selective_forward[0].name, "attn.core");
  // The rest of the lowering is the policy's business only: same forward, same no-recompute keep.
  EXPECT_EQ(block.forward, plain.forward);
  EXPECT_EQ(block.saved_bytes, plain.saved_bytes);
}

TEST(StackLowering, HuggingFacesGeluNewRunsAsItsOperatorsInEagerPyTorch) {
  // GPT-2 124M (h 768, ffn 3072, s 1024) at b 8: the MLP activation's input has
  // T * ffn = 8192 * 3072 elements. The fused kernel reads and writes it once in bf16 (4 bytes an
  // element) and its backward reads x and dy and writes dx (6).
  spec::ModelSpec m = zoo_model("gpt2-124m");
  ASSERT_EQ(m.transformer().activation, spec::Activation::kGeluNew);
  const int64_t n = 8 * 1024 * 3072;
  auto act = [&](spec::Fusion fusion, bool autocast, bool forward) {
    LoweringOptions o = options(spec::AttentionKernel::kCudnn, fusion, 1, false, 8);
    o.autocast = autocast;
    LoweredModel l = lower(m, o);
    const Layer& block = l.layers[l.split_begin];
    return find(forward ? block.forward : block.backward, "mlp.act");
  };
  const Op fused = act(spec::Fusion::kFused, false, true);
  EXPECT_EQ(fused.bytes, 4 * n);
  EXPECT_EQ(fused.kernels, 1);
  EXPECT_EQ(act(spec::Fusion::kFused, false, false).bytes, 6 * n);
  // Eager bf16, every operator a bf16 kernel (e = c = 2): forward 0.5*x (4), pow (4),
  // *0.044715 (4), x + t3 (6: two reads), *sqrt(2/pi) (4), tanh (4), 1 + (4) and the product t1*t7
  // (6) = 36 bytes, 8 kernels. Backward: the
  // product's two gradients (6 + 6), tanh_backward (6), two scalar products (4 + 4), pow_backward
  // (4 + 4 + 6), 0.5 * g (4) and the three gradients of x summed (6 + 6) = 56 bytes, 11 kernels.
  const Op eager = act(spec::Fusion::kEager, false, true);
  EXPECT_EQ(eager.bytes, 36 * n);
  EXPECT_EQ(eager.kernels, 8);
  const Op eager_bwd = act(spec::Fusion::kEager, false, false);
  EXPECT_EQ(eager_bwd.bytes, 56 * n);
  EXPECT_EQ(eager_bwd.kernels, 11);
  // Under autocast pow runs in fp32: x is cast (2 + 4), the chain after it is fp32 (pow 8,
  // *0.044715 8, x+ 2+4+4, *k 8, tanh 8, 1+ 8, t1*t7 2+4+4; 0.5*x stays bf16: 4) and FC2 casts
  // the fp32 result to bf16 (4 + 2): 76 bytes, 10 kernels. Backward: the dy cast (6), g*t7 (12)
  // and its cast to bf16 (6), g*t1 (10), tanh_backward (12), *k (8), x's gradient from x + t3 cast
  // (6), *0.044715 (8), pow_backward (8 + 8 + 12), the cast's backward (6), 0.5*g (4), two sums
  // (6 + 6) = 118 bytes, 15 kernels.
  const Op amp = act(spec::Fusion::kEager, true, true);
  EXPECT_EQ(amp.bytes, 76 * n);
  EXPECT_EQ(amp.kernels, 10);
  const Op amp_bwd = act(spec::Fusion::kEager, true, false);
  EXPECT_EQ(amp_bwd.bytes, 118 * n);
  EXPECT_EQ(amp_bwd.kernels, 15);
  // Kept for backward: x32, tanh's output and the product's fp32 operand (4 bytes each) and its
  // bf16 operand (2) instead of the fused kernel's bf16 input: 12 more bytes per element, per
  // block. The same model with the one-kernel "gelu" keeps the input only.
  auto saved = [&](spec::Activation a) {
    spec::ModelSpec model = m;
    model.transformer().activation = a;
    LoweringOptions o = options(spec::AttentionKernel::kCudnn, spec::Fusion::kEager, 1, false, 8);
    o.autocast = true;
    LoweredModel l = lower(model, o);
    return l.layers[l.split_begin].saved_bytes;
  };
  EXPECT_EQ(saved(spec::Activation::kGeluNew) - saved(spec::Activation::kGelu), 12 * n);
}

TEST(StackLowering, CrossEntropyImplementationsMoveTheirBytes) {
  // GPT-2 124M (V 50257), b 4, s 1024, fp16 (e = 2), tp 2: the vocabulary is padded to 50258 and
  // each rank holds 25129 rows, so T * V_shard = 4096 * 25129 = 102,928,384 logits.
  const int64_t logits = 4096LL * 25129;
  auto head = [&](spec::CrossEntropy ce) {
    LoweringOptions o = options(spec::AttentionKernel::kFlash2, spec::Fusion::kFused, 2);
    o.dtype = spec::Dtype::kFp16;
    o.cross_entropy = ce;
    return lower(zoo_model("gpt2-124m"), o).layers.back();
  };
  // Fused: read the 16-bit logits, write the fp32 softmax: 2 + 4 bytes each way.
  Layer fused = head(spec::CrossEntropy::kFused);
  EXPECT_EQ(find(fused.forward, "head.loss").bytes, logits * 6);
  EXPECT_EQ(find(fused.backward, "head.loss").bytes, logits * 6);
  // Megatron's vocab-parallel cross-entropy on logits.float(): cast 2 + 4, max 4, sub_ 8, exp 8,
  // sum 4, div_ 8 = 38 bytes in 6 kernels; backward mul_ 8 and the cast's backward 4 + 2 = 14 in 2.
  Layer megatron = head(spec::CrossEntropy::kMegatron);
  const Op& forward = find(megatron.forward, "head.loss");
  const Op& backward = find(megatron.backward, "head.loss");
  EXPECT_EQ(forward.bytes, logits * 38);
  EXPECT_EQ(forward.kernels, 6);
  EXPECT_EQ(backward.bytes, logits * 14);
  EXPECT_EQ(backward.kernels, 2);
  // Eager PyTorch on logits.float(): a 25129-logit fp32 row (100.5 KB) does not fit a block's
  // 48 KiB of shared memory, so log_softmax reads it three times and writes it once: 16 bytes, two
  // kernels with nll_loss; its backward reads the gradient twice and the output once and writes:
  // 16. The upcast (2 + 4, all on the mixed-dtype path) is an elementwise op of its own, as a
  // profiler classes it; its backward is nll_loss's zero fill (4) and the cast back (4 + 2).
  Layer eager = head(spec::CrossEntropy::kEager);
  EXPECT_EQ(find(eager.forward, "head.loss").bytes, logits * 16);
  EXPECT_EQ(find(eager.forward, "head.loss").kernels, 2);
  EXPECT_EQ(find(eager.backward, "head.loss").bytes, logits * 16);
  const Op& upcast = find(eager.forward, "head.loss_cast");
  EXPECT_EQ(upcast.op_class, spec::OpClass::kElementwise);
  EXPECT_EQ(upcast.bytes, logits * 6);
  EXPECT_EQ(upcast.mixed_dtype_bytes, upcast.bytes);
  const Op& cast_back = find(eager.backward, "head.loss_cast");
  EXPECT_EQ(cast_back.bytes, logits * 10);
  EXPECT_EQ(cast_back.mixed_dtype_bytes, 0);
  EXPECT_EQ(cast_back.kernels, 2);
  // Compiled: one read of the 16-bit logits.
  EXPECT_EQ(find(head(spec::CrossEntropy::kCompiled).forward, "head.loss").bytes, logits * 2);
}

TEST(StackLowering, EagerSoftmaxReadsARowOnceWhenItFitsSharedMemory) {
  // At tp 6 a rank holds 50262 / 6 = 8377 rows of GPT-2's padded vocabulary: 33.5 KB of fp32, under
  // (48 KiB - 128 B) of shared memory, so ATen keeps the row on chip: forward 4 + 4 bytes a logit,
  // backward reads the gradient and output once and writes: 12. At fp32 logits (e = 4) there is no
  // upcast; nll_loss's zero fill stays (4 bytes, one kernel).
  LoweringOptions o = options(spec::AttentionKernel::kFlash2, spec::Fusion::kEager, 6);
  o.dtype = spec::Dtype::kFp32;
  o.cross_entropy = spec::CrossEntropy::kEager;
  const Layer head = lower(zoo_model("gpt2-124m"), o).layers.back();
  const int64_t logits = 4096LL * 8377;
  EXPECT_EQ(find(head.forward, "head.loss").bytes, logits * 8);
  EXPECT_EQ(find(head.backward, "head.loss").bytes, logits * 12);
  EXPECT_EQ(std::count_if(head.forward.begin(), head.forward.end(),
                          [](const Op& op) { return op.name == "head.loss_cast"; }),
            0);
  EXPECT_EQ(find(head.backward, "head.loss_cast").bytes, logits * 4);
  EXPECT_EQ(find(head.backward, "head.loss_cast").kernels, 1);
}

TEST(StackLowering, BiasGradientsAreReductionsOfTheirOwnWhereTheStackSaysSo) {
  // gpt2-124m (biases) at b 4, s 1024, tp 2: T = 4096 tokens; the rank's qkv output is 3h / 2 =
  // 1152 columns, its fc1 output 4h / 2 = 1536. The bias gradient reads the 16-bit output gradient
  // (T x columns x 2 bytes) and writes the fp32 gradient (columns x 4), after the GEMM's backward.
  LoweringOptions o = options(spec::AttentionKernel::kFlash2, spec::Fusion::kFused, 2);
  o.bias_grad_kernel = true;
  const Layer block = lower(zoo_model("gpt2-124m"), o).layers[1];
  const Op& qkv = find(block.backward, "attn.qkv_bias_grad");
  EXPECT_EQ(qkv.bytes, 4096 * 1152 * 2 + 1152 * 4);
  EXPECT_EQ(qkv.op_class, spec::OpClass::kElementwise);
  EXPECT_EQ(find(block.backward, "mlp.fc1_bias_grad").bytes, 4096 * 1536 * 2 + 1536 * 4);
  const auto at = [&](const char* name) {
    return std::find_if(block.backward.begin(), block.backward.end(),
                        [&](const Op& op) { return op.name == name; }) -
           block.backward.begin();
  };
  EXPECT_EQ(at("attn.qkv_bias_grad"), at("attn.qkv") + 1);
  // Computed in the GEMM op (the knob off), or a model without biases: no op.
  o.bias_grad_kernel = false;
  EXPECT_FALSE(has(lower(zoo_model("gpt2-124m"), o).layers[1].backward, "attn.qkv_bias_grad"));
  o.bias_grad_kernel = true;
  EXPECT_FALSE(has(lower(zoo_model("llama-tiny"), o).layers[1].backward, "mlp.fc1_bias_grad"));
  // Fused stacks count the row-parallel biases in the residual's backward (Megatron's
  // bias-dropout-add); eager PyTorch sums them too, each with ATen's reduction (the strided
  // family): the proj and fc2 outputs' gradients, T x h (the stream replicated at tp 2).
  EXPECT_FALSE(has(block.backward, "mlp.fc2_bias_grad"));
  EXPECT_EQ(qkv.memory_kernel, spec::MemoryKernel::kGeneric);
  o.fusion = spec::Fusion::kEager;
  const Layer eager = lower(zoo_model("gpt2-124m"), o).layers[1];
  EXPECT_EQ(find(eager.backward, "mlp.fc2_bias_grad").bytes, 4096 * 768 * 2 + 768 * 4);
  EXPECT_EQ(find(eager.backward, "attn.proj_bias_grad").bytes, 4096 * 768 * 2 + 768 * 4);
  for (const char* name :
       {"attn.qkv_bias_grad", "attn.proj_bias_grad", "mlp.fc1_bias_grad", "mlp.fc2_bias_grad"})
    EXPECT_EQ(find(eager.backward, name).memory_kernel, spec::MemoryKernel::kStrided) << name;
}

TEST(StackLowering, Zero3GradientCopyInEndsEachParametrisedLayersBackward) {
  // FSDP2 copies a layer's bf16 gradients into its fp32 reduce-scatter buffer: 2 + 4 bytes a
  // parameter, the layer's last backward op; nothing for a layer without parameters.
  spec::ModelSpec m = zoo_model("llama-tiny");
  LoweringOptions o = options(spec::AttentionKernel::kFlash2, spec::Fusion::kFused);
  const LoweredModel plain = lower(m, o);
  o.grad_copy_in_bytes = 6;
  const LoweredModel copied = lower(m, o);
  ASSERT_EQ(plain.layers.size(), copied.layers.size());
  int with_params = 0;
  for (size_t i = 0; i < copied.layers.size(); ++i) {
    const Layer& layer = copied.layers[i];
    if (layer.params == 0) {
      EXPECT_EQ(layer.backward, plain.layers[i].backward);
      continue;
    }
    ++with_params;
    ASSERT_EQ(layer.backward.size(), plain.layers[i].backward.size() + 1);
    const Op& copy = layer.backward.back();
    EXPECT_EQ(copy.name, "fsdp.grad_copy_in");
    EXPECT_EQ(copy.bytes, layer.params * 6);
    EXPECT_EQ(copy.op_class, spec::OpClass::kElementwise);
  }
  EXPECT_GT(with_params, 2);  // the embedding, the blocks, the head
}

TEST(StackLowering, Zero3ParameterCopiesLeadEachUnshard) {
  // FSDP2 copies a unit's gathered parameters into their own tensors before the unit runs: 2 + 2
  // bytes a bf16 parameter, first in its forward, and first in its backward where the policy
  // freed them after the forward. TorchTitan before v0.2 kept the last block and the root
  // (embedding, head) whole from forward to backward: their backwards copy nothing.
  spec::ModelSpec m = zoo_model("llama-tiny");
  LoweringOptions o = options(spec::AttentionKernel::kFlash2, spec::Fusion::kFused);
  const LoweredModel plain = lower(m, o);
  o.zero3 = true;
  o.param_copy_bytes = 4;
  o.reshard_after_forward = spec::ReshardAfterForward::kBlocksButLast;
  const LoweredModel copied = lower(m, o);
  ASSERT_EQ(plain.layers.size(), copied.layers.size());
  size_t last_block = 0;
  for (size_t i = 0; i < copied.layers.size(); ++i)
    if (copied.layers[i].kind == LayerKind::kBlock) last_block = i;
  int regathered = 0;
  for (size_t i = 0; i < copied.layers.size(); ++i) {
    const Layer& layer = copied.layers[i];
    const Layer& before = plain.layers[i];
    ASSERT_GT(layer.params, 0) << layer.name;
    ASSERT_EQ(layer.forward.size(), before.forward.size() + 1);
    EXPECT_EQ(layer.forward.front().name, "fsdp.param_copy_out");
    EXPECT_EQ(layer.forward.front().bytes, layer.params * 4);
    const bool again = layer.kind == LayerKind::kBlock && i != last_block;
    regathered += again ? 1 : 0;
    EXPECT_EQ(layer.kept_for_backward, !again) << layer.name;
    ASSERT_EQ(layer.backward.size(), before.backward.size() + (again ? 1 : 0)) << layer.name;
    if (again) {
      EXPECT_EQ(layer.backward.front(), layer.forward.front());
    }
    // Full recompute re-runs the forward but not the copy: the backward's parameters are whole.
    const std::span<const Op> recomputed = recomputed_forward(layer);
    EXPECT_EQ(std::vector<Op>(recomputed.begin(), recomputed.end()), before.forward);
  }
  EXPECT_EQ(regathered, m.transformer().layers - 1);
  // TorchTitan's policy since v0.2 under pipeline parallelism: no unit freed after the forward.
  o.reshard_after_forward = spec::ReshardAfterForward::kAllButHead;
  o.pipelined = true;
  for (const Layer& layer : lower(m, o).layers) EXPECT_TRUE(layer.kept_for_backward);
}

// TorchTitan's Llama block as eager PyTorch runs it (Stack::code: separate projections, complex
// rotary embeddings, repeat_kv), by hand on llama-tiny (h 64, 4 heads of d 16, 2 kv heads,
// SwiGLU ffn 128, no dropout) at b 4, s 32: T = 128 tokens, bf16 (e = 2).
TEST(StackLowering, EagerTorchTitanBlockAsItsCodeWritesIt) {
  spec::ModelSpec m = zoo_model("llama-tiny");
  const int64_t T = 128, h = 64, a = 4, kv = 2, d = 16, e = 2;
  LoweringOptions o = options(spec::AttentionKernel::kSdpa, spec::Fusion::kEager);
  o.code = spec::builtin_stack("torchtitan").code;
  o.autocast = true;
  const Layer block = lower(m, o).layers[1];
  // Autocast casts the norm's fp32 output for each GEMM reading it (q, k, v; gate, up): 6 bytes
  // an element each, and each gradient back to fp32 through a mixed-dtype copy.
  EXPECT_EQ(find(block.forward, "attn.cast").bytes, 3 * T * h * (4 + e));
  EXPECT_EQ(find(block.forward, "attn.cast").kernels, 3);
  EXPECT_EQ(find(block.backward, "attn.cast").mixed_dtype_bytes, 3 * T * h * (4 + e));
  EXPECT_EQ(find(block.forward, "mlp.cast").bytes, 2 * T * h * (4 + e));
  // Autograd sums the three (two) fp32 input gradients: 2 (1) in-place adds of 12 bytes.
  EXPECT_EQ(find(block.backward, "attn.input_grad_sum").bytes, 2 * 3 * T * h * 4);
  EXPECT_EQ(find(block.backward, "attn.input_grad_sum").kernels, 2);
  EXPECT_EQ(find(block.backward, "mlp.input_grad_sum").bytes, 1 * 3 * T * h * 4);
  // Complex rotation of q (h columns) and k (kv d): upcast (e + 4, mixed), multiply (8),
  // downcast (4 + e): 20 bytes an element, 3 kernels a tensor; the backward the same.
  const int64_t rotated = T * (h + kv * d);
  EXPECT_EQ(find(block.forward, "attn.rope").bytes, 20 * rotated);
  EXPECT_EQ(find(block.forward, "attn.rope").mixed_dtype_bytes, 6 * rotated);
  EXPECT_EQ(find(block.forward, "attn.rope").kernels, 6);
  EXPECT_EQ(find(block.backward, "attn.rope").bytes, 20 * rotated);
  EXPECT_EQ(find(block.backward, "attn.rope").mixed_dtype_bytes, 6 * rotated);
  // repeat_kv: k and v copied to the 4 query heads (each output read and written: 2 x 2e), the
  // backward sums them back (the query heads' gradient read, the kv heads' written).
  const Op& repeat = find(block.forward, "attn.repeat_kv");
  EXPECT_EQ(repeat.bytes, 2 * T * a * d * 2 * e);
  EXPECT_EQ(repeat.memory_kernel, spec::MemoryKernel::kStrided);
  EXPECT_EQ(find(block.backward, "attn.repeat_kv").bytes, 2 * T * (a + kv) * d * e);
  // A residual's backward: the fp32 stream's two gradients added (12), the branch's cast (6).
  EXPECT_EQ(find(block.backward, "attn.residual").bytes, T * h * (3 * 4 + 4 + e));
  EXPECT_EQ(find(block.backward, "attn.residual").kernels, 2);
  // SDPA keeps the repeated keys and values: (a - kv) d more columns each than the shared heads.
  LoweringOptions shared = o;
  shared.code.gqa_kv = spec::GqaKv::kNative;
  const Layer native = lower(m, shared).layers[1];
  EXPECT_FALSE(has(native.forward, "attn.repeat_kv"));
  EXPECT_EQ(block.saved_bytes - native.saved_bytes, 2 * T * (a - kv) * d * e);
  // bf16 parameters (FSDP2's mixed precision): no casts; the sums in bf16, the residual's add.
  o.autocast = false;
  const Layer bf16 = lower(m, o).layers[1];
  EXPECT_FALSE(has(bf16.forward, "attn.cast"));
  EXPECT_EQ(find(bf16.backward, "attn.input_grad_sum").bytes, 2 * 3 * T * h * e);
  EXPECT_EQ(find(bf16.backward, "attn.residual").bytes, 3 * T * h * e);
  // Megatron's model code under the same eager fusion: one GEMM reads each norm output.
  LoweringOptions megatron = o;
  megatron.code = spec::builtin_stack("megatron-core").code;
  const Layer fused_projections = lower(m, megatron).layers[1];
  EXPECT_FALSE(has(fused_projections.backward, "attn.input_grad_sum"));
  EXPECT_FALSE(has(fused_projections.forward, "attn.repeat_kv"));
  EXPECT_EQ(find(fused_projections.forward, "attn.rope").bytes, 4 * 2 * rotated * e);
  // Compiled code fuses the casts and the gradient sums, but Inductor compiles no complex
  // arithmetic: the rotation keeps its three kernels a tensor (none mixed-dtype), and the
  // repeats are copied by contiguous kernels (the kv heads read, the query heads written).
  o.fusion = spec::Fusion::kCompiled;
  const Layer compiled = lower(m, o).layers[1];
  EXPECT_FALSE(has(compiled.backward, "attn.input_grad_sum"));
  EXPECT_EQ(find(compiled.forward, "attn.rope").bytes, 20 * rotated);
  EXPECT_EQ(find(compiled.forward, "attn.rope").mixed_dtype_bytes, 0);
  EXPECT_EQ(find(compiled.forward, "attn.repeat_kv").bytes, 2 * T * (a + kv) * d * e);
  EXPECT_EQ(find(compiled.forward, "attn.repeat_kv").memory_kernel, spec::MemoryKernel::kGeneric);
  // Fused kernels (Megatron's, Transformer Engine's) run none of these as kernels of their own.
  o.fusion = spec::Fusion::kFused;
  const Layer fused = lower(m, o).layers[1];
  EXPECT_FALSE(has(fused.backward, "attn.input_grad_sum"));
  EXPECT_FALSE(has(fused.forward, "attn.repeat_kv"));
  EXPECT_EQ(find(fused.forward, "attn.rope").bytes, 2 * rotated * e);
}

// ATen's embedding backward (Stack::code.embedding_backward sorted) on llama-tiny (vocabulary
// 256, h 64) at T = 128 tokens, bf16 table: the gradient zero-filled, then the ids sorted (8
// passes of 16-byte key/value pairs read and written: 256 bytes a token, at one block's
// bandwidth per 8192 keys) and the rows summed (16 bytes a gradient element, its own family).
TEST(StackLowering, SortedEmbeddingBackwardFillsSortsAndSums) {
  spec::ModelSpec m = zoo_model("llama-tiny");
  const int64_t T = 128, h = 64, V = 256, e = 2;
  LoweringOptions o = options(spec::AttentionKernel::kSdpa, spec::Fusion::kEager);
  const Layer scatter = lower(m, o).layers.front();
  ASSERT_EQ(scatter.kind, LayerKind::kEmbedding);
  EXPECT_EQ(find(scatter.backward, "embed.lookup").bytes, 2 * T * h * e);
  EXPECT_FALSE(has(scatter.backward, "embed.grad_fill"));
  o.code.embedding_backward = spec::EmbeddingBackward::kSorted;
  const Layer sorted = lower(m, o).layers.front();
  const Op& fill = find(sorted.backward, "embed.grad_fill");
  EXPECT_EQ(fill.bytes, V * h * e);
  EXPECT_EQ(fill.op_class, spec::OpClass::kElementwise);
  const Op& sums = find(sorted.backward, "embed.lookup");
  EXPECT_EQ(sums.bytes, 16 * T * h + 256 * T);
  EXPECT_EQ(sums.narrow_bytes, 256 * T);
  EXPECT_EQ(sums.narrow_blocks, 1);
  EXPECT_EQ(sums.memory_kernel, spec::MemoryKernel::kEmbeddingBackward);
  EXPECT_EQ(sums.kernels, 12);
  // The forward gather is unchanged; under autocast the table and its gradient are fp32.
  EXPECT_EQ(find(sorted.forward, "embed.lookup"), find(scatter.forward, "embed.lookup"));
  o.autocast = true;
  EXPECT_EQ(find(lower(m, o).layers.front().backward, "embed.grad_fill").bytes, V * h * 4);
}

TEST(OptimizerStep, BytesPerParameterFollowThePrecision) {
  // fp32 training: AdamW reads param, grad, m, v and writes param, m, v: 7 x 4 = 28.
  EXPECT_EQ(optimizer_bytes_per_param({}), 28);
  // The Megatron and DeepSpeed presets clip the gradient norm first (Stack::grad_clip): the norm
  // reads each fp32 gradient (4), the scale reads and writes it (4 + 4): + 12 over the passes.
  // Megatron-LM v2.5 --fp16: fp16 grads copied to fp32 main grads (2 + 4), unscaled with the inf
  // check (4 + 4), clipped (12), AdamW (28), masters copied to the fp16 model (4 + 2): 60.
  spec::Stack megatron_lm = spec::builtin_stack("megatron-lm");
  EXPECT_EQ(optimizer_bytes_per_param(optimizer_precision(megatron_lm, spec::Dtype::kFp16, 0)), 60);
  // Megatron-Core bf16 with fp32 main-grad accumulation: no copy, no loss scale: 12 + 28 + 6 = 46.
  spec::Stack core = spec::builtin_stack("megatron-core");
  EXPECT_EQ(optimizer_bytes_per_param(optimizer_precision(core, spec::Dtype::kBf16, 1)), 46);
  // bf16 gradients (DeepSpeed): + 2 + 4 for the fp32 copy: 52; under ZeRO-3 the 16-bit copy is
  // made by the gathers, not the step: 46.
  spec::Stack deepspeed = spec::builtin_stack("deepspeed");
  EXPECT_EQ(optimizer_bytes_per_param(optimizer_precision(deepspeed, spec::Dtype::kBf16, 1)), 52);
  EXPECT_EQ(optimizer_bytes_per_param(optimizer_precision(deepspeed, spec::Dtype::kBf16, 3)), 46);
  // Autocast keeps fp32 parameters and gradients: the AdamW pass alone (FSDP's defaults clip
  // nothing); with clipping 12 + 28 = 40.
  spec::Stack autocast = spec::builtin_stack("pytorch-fsdp");
  autocast.autocast = true;
  autocast.grad_dtype.reset();
  EXPECT_EQ(optimizer_bytes_per_param(optimizer_precision(autocast, spec::Dtype::kBf16, 0)), 28);
  autocast.grad_clip = true;
  EXPECT_EQ(optimizer_bytes_per_param(optimizer_precision(autocast, spec::Dtype::kBf16, 0)), 40);
}

}  // namespace
}  // namespace sextant::models
