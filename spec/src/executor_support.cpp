// The executor's capabilities, one rule per thing it does not run (the reason each rule exists
// is the kernel or copy it would need, named in its message).
#include "sextant/spec/executor_support.hpp"

#include <fmt/format.h>

#include <array>
#include <bit>

#include "sextant/spec/context_parallel.hpp"
#include "sextant/spec/flash_limits.hpp"
#include "sextant/spec/tensor_grid.hpp"

namespace sextant::spec {

namespace {

constexpr std::array<std::pair<std::string_view, ExecutorBackend>, 2> kBackends{
    {{"cpu", ExecutorBackend::kCpu}, {"cuda", ExecutorBackend::kCuda}}};
constexpr std::array<std::pair<std::string_view, ExecutorPrecision>, 4> kPrecisions{
    {{"fp32", ExecutorPrecision::kFp32},
     {"tf32", ExecutorPrecision::kTf32},
     {"bf16-gemm", ExecutorPrecision::kBf16Gemm},
     {"bf16", ExecutorPrecision::kBf16}}};

std::string quoted(std::string_view name) {
  return fmt::format("\"{}\"", name);
}

// The rules that hold on every backend: the plan's and the model's own.
void layout_rules(const ModelSpec& model, const Plan& plan, const ExecutorRun& run,
                  std::vector<Problem>& out) {
  if (plan.schedule == Schedule::kInterleaved && plan.pp > 1 && !model.is_transformer())
    out.push_back({"/schedule", "\"interleaved\"",
                   "the executor interleaves transformer stages only (MLPs and CNNs: gpipe or "
                   "1f1b)"});
  if (plan.schedule == Schedule::kGems && !model.is_transformer())
    out.push_back({"/schedule", "\"gems\"",
                   "the executor holds two stages a rank for transformers only (MLPs and CNNs: "
                   "simulated and planned)"});
  // ZeRO-Infinity's parameters live with the optimizer's host shard, whose step updates them.
  if (plan.offload.params != OffloadTarget::kNone && plan.offload.optimizer == OffloadTarget::kNone)
    out.push_back({"/offload/params",
                   quoted(enum_name(offload_target_names(), plan.offload.params)),
                   "the executor offloads the parameters with the optimizer (offload/optimizer "
                   "\"host\" or \"nvme\": the host step updates the master values the layers "
                   "fetch)"});
  // The executor's ZeRO-2 keeps the parameters whole between micro-batches (DeepSpeed's); a stack
  // whose ZeRO-2 is FSDP's is priced as ZeRO-3 with every unit kept (as_run), which it would not
  // run as priced.
  if (as_run(plan, executor_stack(plan)).plan.zero != plan.zero)
    out.push_back({"/zero", "2",
                   "the executor runs ZeRO-2 as DeepSpeed does (parameters whole between "
                   "micro-batches), not as the stack's zero2 \"fsdp\" says: use a stack with "
                   "zero2 \"deepspeed\", or zero 3 with reshard_after_forward \"none\""});
  // Activation offload moves each transformer block's cache (exec/src/gpt/transformer_block.cpp).
  if (plan.offload.activations != OffloadTarget::kNone && !model.is_transformer())
    out.push_back({"/offload/activations", "\"host\"",
                   "the executor offloads the activations of transformer blocks (MLPs and "
                   "CNNs: simulated and planned only)"});
  // Ring attention's steps are flash attention's (exec/blockwise_attention.hpp): the stack the
  // plan runs with has to say so, as the simulator asks.
  if (std::string problem =
          context_attention_problem(plan.cp, plan.cp_algorithm, executor_stack(plan).attention);
      !problem.empty())
    out.push_back({"/cp_algorithm",
                   std::string(enum_name(context_algorithm_names(), plan.cp_algorithm)),
                   std::move(problem)});
  if (plan.dtype && *plan.dtype != compute_dtype(run.precision))
    out.push_back({"/dtype", std::string(enum_name(dtype_names(), *plan.dtype)),
                   fmt::format("the run computes in {} (--precision {})",
                               enum_name(dtype_names(), compute_dtype(run.precision)),
                               executor_precision_name(run.precision))});
  if (plan.schedule == Schedule::kPipeDream) {
    // Each stage updates after every batch: no global norm to clip by exists yet.
    if (run.clipping)
      out.push_back({"/schedule", "\"pipedream\"",
                     "runs without global gradient-norm clipping (each stage updates after every "
                     "batch): pass --clip 0"});
    if (run.checkpoints)
      out.push_back({"/schedule", "\"pipedream\"",
                     "keeps pp - stage weight versions a stage, which the checkpoint format does "
                     "not hold: run it without --checkpoint"});
    if (run.precision != ExecutorPrecision::kFp32)
      out.push_back({"/schedule", "\"pipedream\"",
                     "stashes its weight versions in fp32 (the master values): --precision fp32"});
    // A tied table lives on both end stages, each at its own version: one table read at two
    // staleness levels, which its sequential definition (one table a layer) does not have.
    if (plan.pp > 1 && model.is_transformer() && model.transformer().tied_embeddings)
      out.push_back({"/schedule", "\"pipedream\"",
                     "the executor runs models without a tied embedding table (its two end "
                     "stages would read the table at two weight versions): a Llama or an MLP"});
  }
  if (plan.parameter_server.enabled) {
    const std::string bound = fmt::format("staleness {}", plan.parameter_server.staleness);
    // Each server updates its range alone: no global norm exists before the update.
    if (run.clipping)
      out.push_back({"/parameter_server", bound,
                     "runs without global gradient-norm clipping (each server updates its range "
                     "alone): pass --clip 0"});
    if (run.checkpoints)
      out.push_back({"/parameter_server", bound,
                     "keeps the pushes and versions in flight, which the checkpoint format does "
                     "not hold: run it without --checkpoint"});
  }
  if (plan.schedule == Schedule::kPipeDream2BW) {
    // Each stage updates when its part of a batch ends: no global norm to clip by exists yet.
    if (run.clipping)
      out.push_back({"/schedule", "\"pipedream-2bw\"",
                     "runs without global gradient-norm clipping (each stage updates when its "
                     "part of a batch ends): pass --clip 0"});
    // Its checkpoints hold both weight versions; in mixed precision the older one is a 16-bit
    // compute copy the shard format (fp32 arrays) does not hold.
    if (run.checkpoints && storage_dtype(run.precision) != Dtype::kFp32)
      out.push_back({"/schedule", "\"pipedream-2bw\"",
                     "keeps two weight versions, the older one a 16-bit copy in mixed "
                     "precision: the executor checkpoints it in fp32 only (--checkpoint)"});
  }
}

// Kernels and copies that exist on host fp32 tensors only (the CPU backend's).
void host_fp32_rules(const ModelSpec& model, const Plan& plan, const ExecutorRun& run,
                     std::vector<Problem>& out) {
  if (run.backend == ExecutorBackend::kCpu && run.precision == ExecutorPrecision::kFp32) return;
  const std::string on =
      fmt::format("not on the {} backend in {}", executor_backend_name(run.backend),
                  executor_precision_name(run.precision));
  const auto add = [&](std::string pointer, std::string value, std::string_view what) {
    out.push_back({std::move(pointer), std::move(value), fmt::format("{}, {}", what, on)});
  };
  if (plan.offload.activations != OffloadTarget::kNone)
    add("/offload/activations", "\"host\"",
        "the executor offloads activations on CPU ranks in fp32 (its host pool is host memory "
        "the CPU backend's copies move to)");
  if (plan.offload.optimizer != OffloadTarget::kNone)
    add("/offload/optimizer", quoted(enum_name(offload_target_names(), plan.offload.optimizer)),
        "the executor offloads on CPU ranks in fp32 (its host pool is host memory the CPU "
        "backend's copies move to)");
  if (plan.compression.any())
    add("/compression/kind", quoted(enum_name(compression_kind_names(), plan.compression.kind)),
        "compressed gradient exchanges run on CPU ranks in fp32 (the codecs work on host "
        "memory); other backends exchange gradients uncompressed");
  if (plan.parameter_server.enabled)
    add("/parameter_server", fmt::format("staleness {}", plan.parameter_server.staleness),
        "parameter servers run on CPU ranks in fp32 (exec/src/train/parameter_servers.cpp sums and "
        "sends host memory)");
  if (plan.tp_grid.any())
    add("/tp_grid", tensor_grid_text(plan.tp_grid),
        "a 3D tensor grid runs on CPU ranks in fp32 (its column splits are "
        "exec/src/gpt/grid_linear.cpp's host copies)");
  if (plan.cp > 1)
    add("/cp", std::to_string(plan.cp),
        "context parallelism runs on CPU ranks in fp32 (its attention kernels are "
        "exec/src/attention/context_attention.cpp)");
  if (model.is_transformer() && model.transformer().moe)
    add("model /transformer/moe", "",
        "mixtures of experts run on CPU ranks in fp32 (exec/src/moe/moe_layer.hpp)");
  if (!plan.per_op.empty())
    add("/per_op", op_splits_text(plan.per_op).substr(1),
        "per-op splits run on CPU ranks in fp32 (exec/src/per_op/split_block.cpp moves fp32 "
        "blocks)");
}

// Per-op splits (exec/src/per_op/split_block.hpp): what its blocks do not run.
void per_op_rules(const TransformerSpec& t, const Plan& plan, std::vector<Problem>& out) {
  if (plan.per_op.empty()) return;
  const std::string splits = op_splits_text(plan.per_op).substr(1);
  if (plan.recompute != Recompute::kNone)
    out.push_back({"/recompute", quoted(enum_name(recompute_names(), plan.recompute)),
                   "\"none\" under per-op splits (their blocks keep what each op read)"});
  // Attention's heads on a rank are whole groups of grouped-query attention.
  int64_t head_parts = 1;
  if (plan.per_op.contains("attention") && plan.per_op.at("attention").contains("a")) {
    for (const std::string& axis : plan.per_op.at("attention").at("a"))
      head_parts *= axis == kDataAxis ? plan.dp : plan.tp;
  } else if (!plan.per_op.contains("attention")) {
    head_parts = plan.tp;
  }
  if (t.kv_heads % head_parts != 0)
    out.push_back({"/per_op/attention", splits,
                   fmt::format("heads split so that each rank holds whole groups of the {} "
                               "key/value heads (here over {} ranks)",
                               t.kv_heads, head_parts)});
}

void transformer_rules(const TransformerSpec& t, const Plan& plan, const ExecutorRun& run,
                       std::vector<Problem>& out) {
  if (t.architecture != Architecture::kDecoder)
    out.push_back({"model /transformer/architecture", "\"encoder\"", "the executor runs decoders"});
  if (t.position_embedding == PositionEmbedding::kRope && t.head_dim() % 2 != 0)
    out.push_back({"model /transformer/heads", std::to_string(t.heads),
                   "rotary embeddings need an even head dimension (hidden / heads)"});
  if (t.moe && t.bias)
    out.push_back({"model /transformer/bias", "true", "the executor's experts have no biases"});
  const AttentionKernel attention = executed_attention(plan);
  if (run.backend == ExecutorBackend::kCuda && is_fused_attention(attention)) {
    const bool fp32 = storage_dtype(run.precision) == Dtype::kFp32;
    const int64_t limit = fp32 ? kCudaFlashMaxHeadDimFp32 : kCudaFlashMaxHeadDim;
    if (t.head_dim() > limit)
      out.push_back(
          {"/stack/attention", quoted(enum_name(attention_kernel_names(), attention)),
           fmt::format("\"unfused\" for head_dim {}: the CUDA flash kernels take up to {} "
                       "in {} (their tiles' shared memory)",
                       t.head_dim(), limit, fp32 ? "fp32" : "bf16")});
  }
  // Padded to a multiple of tp; every rank must still hold a real token.
  const int64_t tp = plan.tp;
  if (t.vocab <= (tp - 1) * ((t.vocab + tp - 1) / tp))
    out.push_back({"model /transformer/vocab", std::to_string(t.vocab),
                   fmt::format("too small for tp {}: the last rank's shard of the padded "
                               "vocabulary would hold no token",
                               tp)});
  if (!run.synthetic_data && t.vocab < 256)
    out.push_back({"--data", "",
                   fmt::format("byte-level text needs a vocabulary of at least 256 (the model "
                               "has {})",
                               t.vocab)});
}

// A chain of fc layers split by op (a CNN's classifier, an MLP:
// exec/src/per_op/split_fc_chain.hpp): on one pipeline stage, beside data parallelism and ZeRO-1/2
// only.
void fc_chain_rules(const Plan& plan, std::vector<Problem>& out) {
  if (plan.per_op.empty()) return;
  if (plan.pp > 1)
    out.push_back({"/pp", std::to_string(plan.pp),
                   "1 under per-op splits of fc layers (they run on one stage)"});
  if (plan.zero == 3)
    out.push_back(
        {"/zero", "3", "0, 1 or 2 under per-op splits of fc layers (ZeRO-3 gathers whole layers)"});
}

void cnn_rules(const ModelSpec& model, const Plan& plan, const ExecutorRun& run,
               std::vector<Problem>& out) {
  fc_chain_rules(plan, out);
  const std::string backend(executor_backend_name(run.backend));
  // The CNN kernels (exec/kernels/convolution.hpp) take fp32 tensors, on either backend.
  if (storage_dtype(run.precision) != Dtype::kFp32)
    out.push_back({"model /kind", "\"cnn\"", "CNNs run in fp32: use --precision fp32"});
  // A spatial split's halo exchanges, a channel split's block packing and a branch split's
  // gathered joins copy in host memory.
  if (run.backend != ExecutorBackend::kCpu && (plan.spatial.any() || plan.tp > 1)) {
    const bool spatial = plan.spatial.any();
    out.push_back({spatial ? "/spatial" : "/tp",
                   spatial ? spatial_text(plan.spatial) : std::to_string(plan.tp),
                   fmt::format("a {} split of a CNN runs on CPU ranks (its blocks are copied in "
                               "host memory), not on the {} backend; use --backend cpu",
                               spatial                ? "spatial"
                               : plan.branch_parallel ? "branch"
                                                      : "channel",
                               backend)});
  }
  // Multi-branch units' 1x7 and 7x1 windows, padded pools and channel joins are host kernels.
  const CnnSpec& cnn = model.cnn();
  for (size_t i = 0; i < cnn.layers.size(); ++i) {
    const bool cell = cnn.layers[i].kind == CnnLayerKind::kAmoebaCell;
    if ((cell || cnn.layers[i].kind == CnnLayerKind::kInception) &&
        run.backend != ExecutorBackend::kCpu) {
      out.push_back({fmt::format("model /cnn/layers/{}", i),
                     cell ? "\"amoeba_cell\"" : "\"inception\"",
                     fmt::format("{} run on CPU ranks (their 1x7 and 7x1 windows, pools and "
                                 "channel joins are host kernels), not on the {} backend",
                                 cell ? "AmoebaNet's cells" : "Inception's modules", backend)});
      break;
    }
  }
  // A stage boundary carries one tensor, not U-Net's kept maps.
  if (cnn.has_skips() && plan.pp > 1)
    out.push_back({"/pp", std::to_string(plan.pp),
                   "the executor runs U-Net's skip connections on one pipeline stage (pp 1): a "
                   "stage boundary carries one tensor, not the kept maps"});
}

}  // namespace

EnumNames<ExecutorBackend> executor_backend_names() {
  return kBackends;
}
EnumNames<ExecutorPrecision> executor_precision_names() {
  return kPrecisions;
}

// The names are string literals: a view's data ends with the literal's NUL.
const char* executor_backend_name(ExecutorBackend backend) {
  return enum_name(executor_backend_names(), backend).data();
}
const char* executor_precision_name(ExecutorPrecision precision) {
  return enum_name(executor_precision_names(), precision).data();
}

ExecutorPrecision default_precision(ExecutorBackend backend) {
  return backend == ExecutorBackend::kCuda ? ExecutorPrecision::kBf16 : ExecutorPrecision::kFp32;
}

Dtype compute_dtype(ExecutorPrecision precision) {
  switch (precision) {
    case ExecutorPrecision::kTf32:
      return Dtype::kTf32;
    case ExecutorPrecision::kBf16Gemm:
    case ExecutorPrecision::kBf16:
      return Dtype::kBf16;
    case ExecutorPrecision::kFp32:
      break;
  }
  return Dtype::kFp32;
}

Dtype storage_dtype(ExecutorPrecision precision) {
  return precision == ExecutorPrecision::kBf16 ? Dtype::kBf16 : Dtype::kFp32;
}

ExecutorRun executor_run(ExecutorBackend backend) {
  ExecutorRun run;
  run.backend = backend;
  run.precision = default_precision(backend);
  return run;
}

Stack executor_stack(const Plan& plan) {
  return plan.stack ? *plan.stack : builtin_stack(kExecutorStack);
}

AttentionKernel executed_attention(const Plan& plan) {
  const bool own_kernels =
      (plan.cp > 1 && plan.cp_algorithm != ContextAlgorithm::kRing) || !plan.per_op.empty();
  return own_kernels ? AttentionKernel::kUnfused : executor_stack(plan).attention;
}

bool executor_runs_collective(CollectiveKind kind, CollectiveAlgorithm algorithm) {
  using A = CollectiveAlgorithm;
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return algorithm == A::kRing || algorithm == A::kRecursiveDoubling ||
             algorithm == A::kRabenseifner || algorithm == A::kBinomialTree;
    case CollectiveKind::kReduceScatter:
      return algorithm == A::kRing || algorithm == A::kPairwise ||
             algorithm == A::kRecursiveDoubling;
    case CollectiveKind::kAllGather:
      return algorithm == A::kRing || algorithm == A::kRecursiveDoubling;
    case CollectiveKind::kAllToAll:
    case CollectiveKind::kSendRecv:
      return algorithm == A::kPairwise;
    case CollectiveKind::kBroadcast:
      return algorithm == A::kBinomialTree;
    case CollectiveKind::kReduce:
      break;
  }
  return false;
}

namespace {

// A plan's collective algorithms: run as named on CPU ranks, refused where the executor cannot.
void collective_rules(const Plan& plan, const ExecutorRun& run, std::vector<Problem>& out) {
  for (const auto& [kind, algorithm] : plan.collective_algorithms) {
    const std::string pointer =
        fmt::format("/collective_algorithms/{}", enum_name(collective_kind_names(), kind));
    const std::string value = quoted(enum_name(collective_algorithm_names(), algorithm));
    if (run.backend != ExecutorBackend::kCpu) {
      out.push_back({pointer, value,
                     fmt::format("the {} backend runs NCCL's own algorithm choice: none on GPUs "
                                 "(CPU ranks run them)",
                                 executor_backend_name(run.backend))});
      continue;
    }
    if (!executor_runs_collective(kind, algorithm)) {
      out.push_back({pointer, value,
                     "an algorithm the CPU executor runs this collective by (all_reduce: ring, "
                     "recursive_doubling, rabenseifner, binomial_tree; reduce_scatter: ring, "
                     "pairwise, recursive_doubling; all_gather: ring, recursive_doubling; "
                     "all_to_all, send_recv: pairwise; broadcast: binomial_tree)"});
      continue;
    }
    const bool halving_or_doubling =
        algorithm == CollectiveAlgorithm::kRecursiveDoubling &&
        (kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kAllGather);
    if (!halving_or_doubling) continue;
    for (const int64_t group : {plan.dp, plan.tp, plan.cp, plan.ep, plan.replicas(), plan.tp_grid.x,
                                plan.tp_grid.y, plan.tp_grid.z})
      if (!std::has_single_bit(static_cast<uint64_t>(std::max<int64_t>(group, 1)))) {
        out.push_back({pointer, value,
                       fmt::format("groups of a power of two for recursive doubling (this plan "
                                   "has a group of {}): ring runs any group",
                                   group)});
        break;
      }
  }
}

}  // namespace

std::vector<Problem> executor_problems(const ModelSpec& model, const Plan& plan,
                                       const ExecutorRun& run) {
  std::vector<Problem> out;
  // tf32 and bf16-gemm are tensor-core modes; the CPU backend emulates bf16 storage only.
  if (run.backend == ExecutorBackend::kCpu && run.precision != ExecutorPrecision::kFp32 &&
      run.precision != ExecutorPrecision::kBf16)
    out.push_back({"--precision", std::string(executor_precision_name(run.precision)),
                   "fp32 or bf16 with the cpu backend (tf32 and bf16-gemm are tensor-core "
                   "modes: --backend cuda)"});
  layout_rules(model, plan, run, out);
  host_fp32_rules(model, plan, run, out);
  collective_rules(plan, run, out);
  switch (model.kind()) {
    case ModelKind::kTransformer:
      transformer_rules(model.transformer(), plan, run, out);
      per_op_rules(model.transformer(), plan, out);
      break;
    case ModelKind::kCnn:
      cnn_rules(model, plan, run, out);
      break;
    case ModelKind::kMlp:
      fc_chain_rules(plan, out);
      break;
  }
  if (!model.is_transformer() && !run.synthetic_data)
    out.push_back({"--data", "", "MLPs and CNNs train on synthetic samples only"});
  return out;
}

void check_executor_runs(const ModelSpec& model, const Plan& plan, const ExecutorRun& run) {
  std::vector<Problem> problems = executor_problems(model, plan, run);
  if (problems.empty()) return;
  throw InputError(
      fmt::format("plan {} of {} on the {} backend in {}", plan.name(), model.name,
                  executor_backend_name(run.backend), executor_precision_name(run.precision)),
      std::move(problems));
}

}  // namespace sextant::spec
