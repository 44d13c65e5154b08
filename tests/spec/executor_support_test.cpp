// What Sextant's executor runs: each rule of the table refuses its case naming the field and
// accepts the case next to it; the layouts the executor's own equivalence suites run pass.
#include "sextant/spec/executor_support.hpp"

#include <gtest/gtest.h>

#include "sextant/models/zoo.hpp"

namespace sextant::spec {
namespace {

constexpr ExecutorRun kCpu{};  // cpu, fp32, synthetic data, clipping, no checkpoints

ExecutorRun on(ExecutorBackend backend, ExecutorPrecision precision) {
  ExecutorRun run;
  run.backend = backend;
  run.precision = precision;
  return run;
}

Plan dp2() {
  Plan p;
  p.dp = 2;
  p.micro_batch = 1;
  p.global_batch = 2;
  return p;
}

// The problems' text, one per line, for the assertions below.
std::string text(const std::vector<Problem>& problems) {
  std::string out;
  for (const Problem& p : problems) out += p.pointer + " = " + p.value + ": " + p.expected + "\n";
  return out;
}

void expect_refused(const ModelSpec& model, const Plan& plan, const ExecutorRun& run,
                    const std::string& pointer, const std::string& why) {
  const std::vector<Problem> problems = executor_problems(model, plan, run);
  bool found = false;
  for (const Problem& p : problems)
    found = found || (p.pointer == pointer && p.expected.find(why) != std::string::npos);
  EXPECT_TRUE(found) << "want " << pointer << ": " << why << "\ngot:\n" << text(problems);
}

void expect_runs(const ModelSpec& model, const Plan& plan, const ExecutorRun& run) {
  EXPECT_EQ(text(executor_problems(model, plan, run)), "") << plan.name();
}

TEST(ExecutorSupport, OffloadIsRefusedBeyondWhatTheHostPoolHolds) {
  // ZeRO-Offload to host or NVMe and, with it, ZeRO-Infinity's parameters run on CPU ranks;
  // parameters without the optimizer, and the activations of models without transformer blocks,
  // do not; on a GPU or in bf16 none of it does (the host pool is the CPU backend's memory).
  const ModelSpec gpt = models::zoo_model("gpt-tiny");
  Plan plan = dp2();
  plan.zero = 3;
  for (OffloadTarget optimizer : {OffloadTarget::kHost, OffloadTarget::kNvme})
    for (OffloadTarget params :
         {OffloadTarget::kNone, OffloadTarget::kHost, OffloadTarget::kNvme}) {
      plan.offload.optimizer = optimizer;
      plan.offload.params = params;
      expect_runs(gpt, plan, kCpu);
    }
  plan.offload.optimizer = OffloadTarget::kNone;
  expect_refused(gpt, plan, kCpu, "/offload/params", "with the optimizer");
  Plan activations = dp2();
  activations.offload.activations = OffloadTarget::kHost;
  expect_runs(gpt, activations, kCpu);
  expect_refused(models::zoo_model("mlp-small"), activations, kCpu, "/offload/activations",
                 "transformer blocks");
  expect_refused(gpt, activations, on(ExecutorBackend::kCpu, ExecutorPrecision::kBf16),
                 "/offload/activations", "not on the cpu backend in bf16");
  Plan optimizer = dp2();
  optimizer.offload.optimizer = OffloadTarget::kHost;
  expect_refused(gpt, optimizer, executor_run(ExecutorBackend::kCuda), "/offload/optimizer",
                 "not on the cuda backend in bf16");
}

TEST(ExecutorSupport, ZeroTwoRunsAsDeepSpeedsOnly) {
  // The executor's ZeRO-2 keeps whole parameters between micro-batches: a stack whose ZeRO-2 is
  // FSDP's (priced as ZeRO-3 keeping every unit) is refused with the two ways out.
  const ModelSpec gpt = models::zoo_model("gpt-tiny");
  Plan plan = dp2();
  plan.zero = 2;
  expect_runs(gpt, plan, kCpu);
  plan.stack = builtin_stack("sextant");
  plan.stack->zero2 = Zero2Impl::kFsdp;
  expect_refused(gpt, plan, kCpu, "/zero", "reshard_after_forward");
}

TEST(ExecutorSupport, CollectiveAlgorithmsRunOnCpuRanksAsNamedOrAreRefused) {
  const ModelSpec gpt = models::zoo_model("gpt-tiny");
  using K = CollectiveKind;
  using A = CollectiveAlgorithm;
  Plan plan = dp2();
  plan.zero = 3;
  plan.collective_algorithms = {{K::kAllReduce, A::kRabenseifner},
                                {K::kReduceScatter, A::kRecursiveDoubling},
                                {K::kAllGather, A::kRecursiveDoubling}};
  expect_runs(gpt, plan, kCpu);
  // NCCL picks its own.
  expect_refused(gpt, plan, executor_run(ExecutorBackend::kCuda),
                 "/collective_algorithms/all_reduce", "NCCL's own algorithm");
  // Recursive halving and doubling over blocks need a power-of-two group; ring runs any.
  plan.dp = 3;
  plan.global_batch = 3;
  expect_refused(gpt, plan, kCpu, "/collective_algorithms/all_gather", "a group of 3");
  expect_refused(gpt, plan, kCpu, "/collective_algorithms/reduce_scatter", "a group of 3");
  plan.collective_algorithms = {{K::kAllGather, A::kRing}, {K::kReduceScatter, A::kPairwise}};
  expect_runs(gpt, plan, kCpu);
  // What the executor has no schedule for.
  for (const auto& [kind, algorithm] :
       std::vector<std::pair<K, A>>{{K::kAllReduce, A::kParameterServer},
                                    {K::kAllReduce, A::kDoubleBinaryTree},
                                    {K::kAllReduce, A::kHierarchical},
                                    {K::kBroadcast, A::kRing},
                                    {K::kAllToAll, A::kRecursiveDoubling}}) {
    plan.collective_algorithms = {{kind, algorithm}};
    expect_refused(
        gpt, plan, kCpu,
        "/collective_algorithms/" + std::string(enum_name(collective_kind_names(), kind)),
        "an algorithm the CPU executor runs");
  }
}

TEST(ExecutorSupport, HostKernelLayoutsRunOnCpuRanksInFp32Only) {
  const ModelSpec gpt = models::zoo_model("gpt-tiny");
  const ExecutorRun gpu = executor_run(ExecutorBackend::kCuda);
  Plan compressed = dp2();
  compressed.compression.kind = CompressionKind::kPowersgd;
  expect_runs(gpt, compressed, kCpu);
  expect_refused(gpt, compressed, gpu, "/compression/kind", "uncompressed");
  Plan grid = dp2();
  grid.dp = 1;
  grid.tp_grid = {2, 1, 1};
  expect_refused(gpt, grid, gpu, "/tp_grid", "3D tensor grid runs on CPU ranks in fp32");
  Plan cp = dp2();
  cp.dp = 1;
  cp.cp = 2;
  cp.cp_algorithm = ContextAlgorithm::kAllGather;
  expect_runs(gpt, cp, kCpu);
  expect_refused(gpt, cp, gpu, "/cp", "context parallelism runs on CPU ranks in fp32");
  const ModelSpec moe = models::zoo_model("moe-tiny");
  expect_runs(moe, dp2(), kCpu);
  expect_refused(moe, dp2(), on(ExecutorBackend::kCpu, ExecutorPrecision::kBf16),
                 "model /transformer/moe", "mixtures of experts run on CPU ranks in fp32");
  // Ring attention needs a fused kernel in the plan's stack: the executor's own is unfused.
  cp.cp_algorithm = ContextAlgorithm::kRing;
  expect_refused(gpt, cp, kCpu, "/cp_algorithm", "flash attention");
}

TEST(ExecutorSupport, PrecisionsAndDtypesAgree) {
  // tf32 and bf16-gemm are tensor-core modes; a plan's dtype is the run's compute dtype.
  const ModelSpec gpt = models::zoo_model("gpt-tiny");
  expect_refused(gpt, dp2(), on(ExecutorBackend::kCpu, ExecutorPrecision::kTf32), "--precision",
                 "fp32 or bf16 with the cpu backend");
  expect_runs(gpt, dp2(), on(ExecutorBackend::kCuda, ExecutorPrecision::kTf32));
  Plan bf16 = dp2();
  bf16.dtype = Dtype::kBf16;
  expect_refused(gpt, bf16, kCpu, "/dtype", "the run computes in fp32 (--precision fp32)");
  expect_runs(gpt, bf16, on(ExecutorBackend::kCpu, ExecutorPrecision::kBf16));
  expect_runs(gpt, bf16, on(ExecutorBackend::kCuda, ExecutorPrecision::kBf16Gemm));
  EXPECT_EQ(compute_dtype(ExecutorPrecision::kBf16Gemm), Dtype::kBf16);
  EXPECT_EQ(storage_dtype(ExecutorPrecision::kBf16Gemm), Dtype::kFp32);
  EXPECT_EQ(executor_run(ExecutorBackend::kCuda).precision, ExecutorPrecision::kBf16);
  EXPECT_EQ(executor_run(ExecutorBackend::kCpu).precision, ExecutorPrecision::kFp32);
}

TEST(ExecutorSupport, CnnsRunInFp32AndSplitOnCpuRanks) {
  const ModelSpec resnet = models::zoo_model("resnet-tiny");
  const ExecutorRun gpu_fp32 = on(ExecutorBackend::kCuda, ExecutorPrecision::kFp32);
  expect_runs(resnet, dp2(), gpu_fp32);
  expect_refused(resnet, dp2(), executor_run(ExecutorBackend::kCuda), "model /kind",
                 "CNNs run in fp32");
  Plan spatial = dp2();
  spatial.dp = 1;
  spatial.spatial = {2, 1, 1};
  expect_runs(resnet, spatial, kCpu);
  expect_refused(resnet, spatial, gpu_fp32, "/spatial", "a spatial split of a CNN runs on CPU");
  // (Layer 0 is the stem's convolution, layer 1 the first cell.)
  expect_refused(models::zoo_model("amoebanet-d"), dp2(), gpu_fp32, "model /cnn/layers/1",
                 "AmoebaNet's cells run on CPU ranks");
  Plan pp = dp2();
  pp.dp = 1;
  pp.pp = 2;
  expect_refused(models::zoo_model("unet"), pp, kCpu, "/pp", "skip connections");
  pp.schedule = Schedule::kInterleaved;
  expect_refused(resnet, pp, kCpu, "/schedule", "interleaves transformer stages only");
}

// A CNN's fc layers split by op (exec/src/per_op/split_fc_chain.hpp) run on CPU ranks in fp32, on
// one pipeline stage and beside ZeRO-1/2 at most.
TEST(ExecutorSupport, CnnPerOpSplitsRunOnOneStageOfCpuRanks) {
  const ModelSpec vgg = models::zoo_model("vgg19");
  Plan plan = dp2();
  plan.per_op = {{"layer22", {{"f1", {"d"}}}}};
  expect_runs(vgg, plan, kCpu);
  plan.zero = 2;
  expect_runs(vgg, plan, kCpu);
  expect_refused(vgg, plan, on(ExecutorBackend::kCuda, ExecutorPrecision::kFp32), "/per_op",
                 "per-op splits run on CPU ranks");
  plan.zero = 3;
  expect_refused(vgg, plan, kCpu, "/zero", "ZeRO-3 gathers whole layers");
  plan.zero = 0;
  plan.dp = 1;
  plan.pp = 2;
  expect_refused(vgg, plan, kCpu, "/pp", "they run on one stage");
}

// The CUDA flash kernels' tiles take head_dim up to 128 in bf16 and 112 in fp32 (their shared
// memory): past that a fused attention is refused on the GPU, named as the stack's knob; CPU
// ranks and the unfused core take any.
TEST(ExecutorSupport, CudaFlashAttentionTakesHeadsUpToItsTiles) {
  ModelSpec wide = models::zoo_model("gpt-tiny");
  auto& t = std::get<TransformerSpec>(wide.body);
  t.heads = 2;
  t.kv_heads = 2;
  t.hidden = 2 * 120;  // head_dim 120: inside bf16's 128, past fp32's 112
  Plan plan = dp2();
  plan.stack = builtin_stack(kExecutorStack);
  plan.stack->attention = AttentionKernel::kFlash2;
  const ExecutorRun bf16 = on(ExecutorBackend::kCuda, ExecutorPrecision::kBf16);
  const ExecutorRun fp32 = on(ExecutorBackend::kCuda, ExecutorPrecision::kFp32);
  expect_runs(wide, plan, bf16);
  expect_refused(wide, plan, fp32, "/stack/attention", "take up to 112 in fp32");
  expect_runs(wide, plan, kCpu);
  t.hidden = 2 * 136;  // head_dim 136
  expect_refused(wide, plan, bf16, "/stack/attention", "take up to 128 in bf16");
  plan.stack->attention = AttentionKernel::kUnfused;
  expect_runs(wide, plan, bf16);
}

// An MLP's layers split by op run as the same chain, under the same rules.
TEST(ExecutorSupport, MlpPerOpSplitsRunOnOneStageOfCpuRanks) {
  const ModelSpec mlp = models::zoo_model("mlp-small");
  Plan plan = dp2();
  plan.per_op = {{"fc1", {{"f2", {"d"}}}}};
  expect_runs(mlp, plan, kCpu);
  plan.zero = 3;
  expect_refused(mlp, plan, kCpu, "/zero", "ZeRO-3 gathers whole layers");
  plan.zero = 0;
  plan.dp = 1;
  plan.pp = 2;
  expect_refused(mlp, plan, kCpu, "/pp", "they run on one stage");
}

TEST(ExecutorSupport, RunOptionsTheLayoutCannotTake) {
  const ModelSpec gpt = models::zoo_model("gpt-tiny");
  Plan twobw = dp2();
  twobw.dp = 1;
  twobw.pp = 2;
  twobw.schedule = Schedule::kPipeDream2BW;
  expect_refused(gpt, twobw, kCpu, "/schedule", "pass --clip 0");
  ExecutorRun run = kCpu;
  run.clipping = false;
  expect_runs(gpt, twobw, run);
  run.checkpoints = true;
  expect_runs(gpt, twobw, run);
  run.precision = ExecutorPrecision::kBf16;
  expect_refused(gpt, twobw, run, "/schedule", "checkpoints it in fp32 only");
  // PipeDream: no clipping, no checkpoints, fp32, and no table read at two versions.
  const ModelSpec llama = models::zoo_model("llama-tiny");
  Plan pipedream = twobw;
  pipedream.schedule = Schedule::kPipeDream;
  pipedream.micro_batch = pipedream.global_batch;
  ExecutorRun unclipped = kCpu;
  unclipped.clipping = false;
  expect_runs(llama, pipedream, unclipped);
  expect_refused(llama, pipedream, kCpu, "/schedule", "pass --clip 0");
  expect_refused(gpt, pipedream, unclipped, "/schedule", "without a tied embedding table");
  unclipped.checkpoints = true;
  expect_refused(llama, pipedream, unclipped, "/schedule", "run it without --checkpoint");
  unclipped.checkpoints = false;
  unclipped.precision = ExecutorPrecision::kBf16;
  expect_refused(llama, pipedream, unclipped, "/schedule", "--precision fp32");
  // Parameter servers: no clipping, no checkpoints, CPU ranks in fp32 (host sums and sends).
  Plan servers = dp2();
  servers.parameter_server = {true, 1};
  unclipped.precision = ExecutorPrecision::kFp32;
  expect_runs(gpt, servers, unclipped);
  expect_refused(gpt, servers, kCpu, "/parameter_server", "pass --clip 0");
  unclipped.checkpoints = true;
  expect_refused(gpt, servers, unclipped, "/parameter_server", "run it without --checkpoint");
  unclipped.checkpoints = false;
  for (const ExecutorRun& elsewhere : {on(ExecutorBackend::kCpu, ExecutorPrecision::kBf16),
                                       on(ExecutorBackend::kCuda, ExecutorPrecision::kFp32)}) {
    ExecutorRun off_cpu = elsewhere;
    off_cpu.clipping = false;
    expect_refused(gpt, servers, off_cpu, "/parameter_server", "run on CPU ranks in fp32");
  }
  ExecutorRun text = kCpu;
  text.synthetic_data = false;
  expect_runs(gpt, dp2(), text);  // its vocabulary holds every byte
  ModelSpec small = gpt;
  std::get<TransformerSpec>(small.body).vocab = 255;
  expect_refused(small, dp2(), text, "--data", "vocabulary of at least 256");
  expect_refused(models::zoo_model("mlp-small"), dp2(), text, "--data", "synthetic samples only");
}

TEST(ExecutorSupport, ModelsTheKernelsDoNotCover) {
  ModelSpec bert = models::zoo_model("bert-large");
  expect_refused(bert, dp2(), kCpu, "model /transformer/architecture", "decoders");
  ModelSpec tiny = models::zoo_model("gpt-tiny");
  Plan tp = dp2();
  tp.dp = 1;
  tp.tp = 2;
  expect_runs(tiny, tp, kCpu);
  // 5 tokens padded to 8 over tp 4 is 2 a rank: the first three ranks hold all 5, the last none.
  std::get<TransformerSpec>(tiny.body).vocab = 5;
  tp.tp = 4;
  expect_refused(tiny, tp, kCpu, "model /transformer/vocab", "too small for tp 4");
}

// The attention core runs as the plan's stack says, except where the executor's own kernels
// for the layout keep the probabilities: all-gather and all-to-all context parallelism, per-op
// splits. Ring attention's steps are the stack's fused kernel.
TEST(ExecutorSupport, TheAttentionKernelIsTheStacksWhereTheLayoutRunsIt) {
  Plan plan = dp2();
  EXPECT_EQ(executed_attention(plan), AttentionKernel::kUnfused);  // the executor's own stack
  plan.stack = builtin_stack(kExecutorStack);
  plan.stack->attention = AttentionKernel::kFlash2;
  EXPECT_EQ(executed_attention(plan), AttentionKernel::kFlash2);
  plan.cp = 2;
  plan.cp_algorithm = ContextAlgorithm::kRing;
  EXPECT_EQ(executed_attention(plan), AttentionKernel::kFlash2);
  for (ContextAlgorithm a : {ContextAlgorithm::kAllGather, ContextAlgorithm::kAllToAll}) {
    plan.cp_algorithm = a;
    EXPECT_EQ(executed_attention(plan), AttentionKernel::kUnfused);
  }
  plan.cp = 1;
  plan.per_op = {{"attention", {{"a", {"d"}}}}};
  EXPECT_EQ(executed_attention(plan), AttentionKernel::kUnfused);
}

TEST(ExecutorSupport, OneErrorNamesThePlanTheModelAndTheRun) {
  Plan plan = dp2();
  plan.dtype = Dtype::kBf16;
  plan.compression.kind = CompressionKind::kPowersgd;
  try {
    check_executor_runs(models::zoo_model("gpt-tiny"), plan, executor_run(ExecutorBackend::kCuda));
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("plan " + plan.name() + " of gpt-tiny on the cuda backend in bf16"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("/compression/kind"), std::string::npos) << what;
    EXPECT_EQ(what.find("/dtype"), std::string::npos) << what;  // bf16 is the run's
  }
}

}  // namespace
}  // namespace sextant::spec
