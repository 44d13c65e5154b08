// The published tables and how each row is predicted.
#include "validate_suite.hpp"

#include <fmt/format.h>

#include <cmath>

#include "sextant/loop/class_fit.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/collective_model.hpp"
#include "sextant/sim/layer_cost.hpp"
#include "sextant/sim/step_setup.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/traces/kernel_classes.hpp"

namespace sextant::cli {

double ValidationTable::mean_abs_error() const {
  if (rows.empty()) return 0;
  double sum = 0;
  for (const ValidationRow& r : rows) sum += std::fabs(r.error());
  return sum / static_cast<double>(rows.size());
}

double ValidationTable::max_abs_error() const {
  double worst = 0;
  for (const ValidationRow& r : rows) worst = std::max(worst, std::fabs(r.error()));
  return worst;
}

namespace {

spec::Plan megatron_plan(int64_t dp, int64_t tp, int64_t pp, int64_t micro_batch,
                         int64_t global_batch, spec::Recompute recompute, bool sp) {
  spec::Plan plan;
  plan.dp = dp;
  plan.tp = tp;
  plan.pp = pp;
  plan.micro_batch = micro_batch;
  plan.global_batch = global_batch;
  plan.recompute = recompute;
  plan.sequence_parallel = sp;
  plan.stack = spec::builtin_stack("megatron-lm");
  return plan;
}

// ---- T1: Narayanan et al., SC'21, Table 1 (published.md T1) ----------------------------------
// Layout, micro-batch, model chunks and DDP kind of each row from the paper's own run script,
// Megatron-LM examples/sc21/run_table_1.sh (MBS, --num-layers-per-virtual-pipeline-stage,
// DDP=torch|local; every row --recompute-method uniform, i.e. full recompute).
struct Table1Run {
  const char* model;
  int64_t tp, pp, dp, global_batch, micro_batch, layers_per_chunk;  // 0: no interleaving
  bool torch_ddp;
  double tflops_per_gpu;
};
constexpr Table1Run kTable1[] = {
    {"megatron-1.7b", 1, 1, 32, 512, 16, 0, true, 137},
    {"megatron-3.6b", 2, 1, 32, 512, 16, 0, true, 138},
    {"megatron-7.5b", 4, 1, 32, 512, 16, 0, true, 142},
    {"megatron-18b", 8, 1, 32, 1024, 8, 0, true, 135},
    {"megatron-39b", 8, 2, 32, 1536, 4, 0, false, 138},
    {"megatron-76b", 8, 4, 32, 1792, 2, 5, false, 140},
    {"megatron-145b", 8, 8, 24, 2304, 2, 5, false, 148},
    {"megatron-310b", 8, 16, 15, 2160, 1, 3, false, 155},
    {"megatron-530b", 8, 35, 9, 2520, 1, 1, false, 163},
    {"megatron-1t", 8, 64, 6, 3072, 1, 0, false, 163},
};

// Stack megatron-lm (local DDP reducing after backward); the rows the script ran with
// --DDP-impl torch use PyTorch DDP's 25 MiB buckets reduced during backward.
ValidationRow predict_table1(const Table1Run& run, const spec::ClusterSpec& cluster,
                             sim::Fidelity fidelity) {
  spec::ModelSpec model = models::zoo_model(run.model);
  const int64_t layers = model.transformer().layers;
  spec::Plan plan = megatron_plan(run.dp, run.tp, run.pp, run.micro_batch, run.global_batch,
                                  spec::Recompute::kFull, false);
  if (run.torch_ddp) {
    plan.stack->dp_overlap = true;
    plan.stack->dp_bucket_bytes = 25 * (int64_t{1} << 20);
  }
  if (run.layers_per_chunk > 0) {
    plan.schedule = spec::Schedule::kInterleaved;
    plan.virtual_stages = layers / (run.pp * run.layers_per_chunk);
  }
  sim::SimulationOptions options;
  options.fidelity = fidelity;
  sim::SimulationResult r = sim::simulate(model, cluster, plan, options);
  ValidationRow row;
  row.name = run.model;
  row.published = run.tflops_per_gpu;
  row.predicted = r.report.hardware_tflops_per_gpu;
  row.detail = plan.name() + (r.report.memory.fits ? "" : " (predicted not to fit)");
  return row;
}

// ---- T4: Korthikanti et al., Table 4: one 22B layer, TP 8, micro-batch 4 -------------------
struct Table4Row {
  const char* experiment;
  bool sp;
  spec::Recompute recompute;
  double forward_ms, backward_ms;
};
constexpr Table4Row kTable4[] = {
    {"baseline no recompute", false, spec::Recompute::kNone, 7.7, 11.9},
    {"sequence parallelism", true, spec::Recompute::kNone, 7.2, 11.8},
    {"baseline with recompute", false, spec::Recompute::kFull, 7.7, 19.5},
    {"selective recompute", false, spec::Recompute::kSelective, 7.7, 13.2},
    {"selective + sequence", true, spec::Recompute::kSelective, 7.2, 13.1},
};

ValidationTable table4(const spec::ClusterSpec& cluster) {
  ValidationTable t{"T4",
                    "Korthikanti et al. Table 4: one layer of the 22B model, TP 8, micro-batch 4, "
                    "on dgx-a100, stack megatron-lm (backward includes the recomputation)",
                    "ms",
                    true,
                    {},
                    ""};
  spec::ModelSpec model = models::zoo_model("megatron-22b");
  for (const Table4Row& row : kTable4) {
    spec::Plan plan = megatron_plan(1, 8, 1, 4, 4, row.recompute, row.sp);
    sim::StepSetup setup = sim::step_setup(model, cluster, plan);
    models::LoweredModel lowered = models::lower(model, setup.lowering);
    sim::ComputeModel compute = sim::make_compute_model(cluster, setup, lowered);
    sim::CollectiveModel collectives(cluster, plan.collective_algorithms);
    std::vector<int64_t> group = {0, 1, 2, 3, 4, 5, 6, 7};
    sim::LayerTimes times = sim::layer_times(
        lowered.layers[lowered.split_begin], plan, setup.stack, compute, collectives,
        sim::LayerGroups{
            sim::group_shape(group, cluster.devices_per_node), {}, {}, {}, {}, {}, {}, {}, {}, {}},
        plan.recompute);
    t.rows.push_back(
        {fmt::format("{} fwd", row.experiment), row.forward_ms, 1e3 * times.forward, plan.name()});
    t.rows.push_back({fmt::format("{} bwd", row.experiment), row.backward_ms,
                      1e3 * (times.backward + times.recompute), plan.name()});
  }
  return t;
}

// ---- T5: Korthikanti et al., Tables 3 and 5: iteration time, DP 1 --------------------------
struct Table5Run {
  const char* model;
  int64_t pp, global_batch, micro_batch, chunks;
  double full_s, selective_s;
};
constexpr Table5Run kTable5[] = {
    {"megatron-22b", 1, 4, 4, 1, 1.42, 1.10},
    {"megatron-175b", 8, 64, 1, 3, 18.13, 13.75},
    {"megatron-530b", 35, 280, 1, 3, 49.05, 37.83},
    {"megatron-1t", 64, 512, 1, 1, 94.42, 71.49},
};

ValidationTable table5(const spec::ClusterSpec& cluster, sim::Fidelity fidelity) {
  ValidationTable t{"T5",
                    "Korthikanti et al. Table 5: iteration time, TP 8, no data parallelism, "
                    "interleaved with 3 chunks for 175B and 530B, on dgx-a100, stack megatron-lm",
                    "s",
                    true,
                    {},
                    ""};
  for (const Table5Run& run : kTable5) {
    spec::ModelSpec model = models::zoo_model(run.model);
    for (bool selective : {false, true}) {
      spec::Plan plan = megatron_plan(
          1, 8, run.pp, run.micro_batch, run.global_batch,
          selective ? spec::Recompute::kSelective : spec::Recompute::kFull, selective);
      plan.schedule = run.chunks > 1 ? spec::Schedule::kInterleaved : spec::Schedule::k1F1B;
      plan.virtual_stages = run.chunks;
      sim::SimulationOptions options;
      options.fidelity = fidelity;
      sim::SimulationResult r = sim::simulate(model, cluster, plan, options);
      t.rows.push_back({fmt::format("{} {}", run.model, selective ? "SP+selective" : "full"),
                        selective ? run.selective_s : run.full_s, r.report.step_time_s,
                        plan.name()});
    }
  }
  return t;
}

// ---- T5d: activation bytes per layer against Korthikanti et al.'s formulas -----------------
ValidationTable table5d() {
  ValidationTable t{"T5d",
                    "Korthikanti et al. Table 2: activation bytes per layer and TP rank (16-bit "
                    "activations, TP 8), the memory model against the paper's formulas",
                    "MB",
                    false,
                    {},
                    ""};
  struct Config {
    const char* name;
    bool sp;
    spec::Recompute recompute;
  };
  constexpr Config kConfigs[] = {
      {"TP", false, spec::Recompute::kNone},
      {"TP+SP", true, spec::Recompute::kNone},
      {"TP+selective", false, spec::Recompute::kSelective},
      {"TP+SP+selective", true, spec::Recompute::kSelective},
      {"full recompute", false, spec::Recompute::kFull},
  };
  struct ModelRow {
    const char* model;
    int64_t micro_batch;
  };
  for (ModelRow m : {ModelRow{"megatron-22b", 4}, ModelRow{"megatron-175b", 1}}) {
    spec::ModelSpec model = models::zoo_model(m.model);
    const spec::TransformerSpec& tr = model.transformer();
    const double s = static_cast<double>(tr.seq_len), b = static_cast<double>(m.micro_batch),
                 h = static_cast<double>(tr.hidden), a = static_cast<double>(tr.heads), tp = 8;
    const double sbh = s * b * h;
    for (const Config& c : kConfigs) {
      double formula = 0;
      if (c.recompute == spec::Recompute::kFull) {
        formula = 2 * sbh;  // the layer input, on every TP rank
      } else if (c.recompute == spec::Recompute::kSelective) {
        formula = c.sp ? sbh * 34 / tp : sbh * (10 + 24 / tp);
      } else {
        formula = c.sp ? sbh * (34 / tp + 5 * a * s / (h * tp))
                       : sbh * (10 + 24 / tp + 5 * a * s / (h * tp));
      }
      models::LoweringOptions o;
      o.micro_batch = m.micro_batch;
      o.seq_len = tr.seq_len;
      o.dtype = spec::Dtype::kFp16;
      o.tp = 8;
      o.sequence_parallel = c.sp;
      models::LoweredModel lowered = models::lower(model, o);
      const double ours =
          static_cast<double>(lowered.layers[lowered.split_begin].saved_bytes_for(c.recompute));
      t.rows.push_back({fmt::format("{} {}", m.model, c.name), formula / 1e6, ours / 1e6,
                        fmt::format("b {}", m.micro_batch)});
    }
  }
  return t;
}

// ---- T6: Megatron-LM README scaling tables (Sept 2020), tensor parallelism only ------------
// The README gives hidden, heads, layers, TP, DP, batch and iteration time, on DGX-2 (V100) and
// DGX A100 nodes. From the same commit (NVIDIA/Megatron-LM 5281919, 2020-09-11): "All models use
// a vocabulary size of 51,200 and a sequence length of 1024" (README.md); --batch-size is "Batch
// size per model instance (local batch size). Global batch size is local batch size times data
// parallel size" (megatron/arguments.py: no gradient accumulation, so the replica's batch is one
// micro-batch). Assumed, as the v1 scripts ran (examples/pretrain_gpt2*.sh): fp16,
// --checkpoint-activations (full recompute), GELU FFN 4h. The A100s of September 2020 were the
// 40 GB part (1,555 GB/s HBM2; the 80 GB part was announced in November 2020): dgx-a100-40gb.
// Without recompute the 1.2B row's batch of 16 would need 75.7 GiB there, so it recomputed.
// Checked: Narayanan et al.'s eq. 3 (96 B s l h^2 (1 + s/6h + V/16lh)) over the 1.2B rows' times
// gives the TFLOP/s the README prints (B 16 in 1076 ms: 149.8 on A100; B 8 in 1121 ms: 71.9 on
// V100).
struct Table6Run {
  const char* cluster;
  int64_t hidden, heads, layers, tp, dp, global_batch;
  double iteration_ms;
};
constexpr Table6Run kTable6[] = {
    {"dgx2-v100", 1920, 15, 24, 1, 1, 8, 1121},
    {"dgx2-v100", 2304, 18, 30, 2, 1, 8, 1093},
    {"dgx2-v100", 3072, 24, 36, 4, 1, 8, 1238},
    {"dgx2-v100", 4096, 32, 42, 8, 1, 8, 1407},
    {"dgx-a100-40gb", 1920, 15, 24, 1, 1, 16, 1076},
    {"dgx-a100-40gb", 2304, 18, 30, 2, 1, 16, 1026},
    {"dgx-a100-40gb", 3072, 24, 36, 4, 1, 16, 1162},
    {"dgx-a100-40gb", 4096, 32, 42, 8, 1, 16, 1343},
    {"dgx-a100-40gb", 1920, 15, 24, 1, 128, 2048, 1153},
    {"dgx-a100-40gb", 2304, 18, 30, 2, 128, 2048, 1101},
    {"dgx-a100-40gb", 3072, 24, 36, 4, 128, 2048, 1242},
    {"dgx-a100-40gb", 4096, 32, 42, 8, 128, 2048, 1380},
};

spec::ModelSpec table6_model(const Table6Run& run) {
  const spec::Json doc = {{"schema", "sextant.model/1"},
                          {"name", fmt::format("megatron-2020-h{}", run.hidden)},
                          {"kind", "transformer"},
                          {"transformer",
                           {{"architecture", "decoder"},
                            {"layers", run.layers},
                            {"hidden", run.hidden},
                            {"heads", run.heads},
                            {"kv_heads", run.heads},
                            {"ffn_hidden", 4 * run.hidden},
                            {"vocab", 51200},
                            {"seq_len", 1024},
                            {"activation", "gelu"},
                            {"norm", "layernorm"},
                            {"tied_embeddings", true},
                            {"position_embedding", "learned"},
                            {"max_positions", 1024},
                            {"bias", true},
                            {"dropout", true}}}};
  return models::model_from_document(doc, "published.md T6", doc.at("name"));
}

ValidationTable table6(sim::Fidelity fidelity) {
  ValidationTable t{"T6",
                    "Megatron-LM README scaling (Sept 2020): iteration time of GPT models with "
                    "tensor parallelism only on dgx2-v100 and dgx-a100-40gb, stack megatron-lm "
                    "(sequence 1024 and one micro-batch per replica as its commit's README and "
                    "arguments say; fp16 and full recompute assumed)",
                    "ms",
                    true,
                    {},
                    ""};
  for (const Table6Run& run : kTable6) {
    const spec::ModelSpec model = table6_model(run);
    const spec::ClusterSpec cluster = spec::builtin_cluster(run.cluster);
    spec::Plan plan = megatron_plan(run.dp, run.tp, 1, run.global_batch / run.dp, run.global_batch,
                                    spec::Recompute::kFull, false);
    sim::SimulationOptions options;
    options.fidelity = fidelity;
    const sim::SimulationResult r = sim::simulate(model, cluster, plan, options);
    const char* gpu = std::string(run.cluster) == "dgx2-v100" ? "V100" : "A100";
    t.rows.push_back({fmt::format("{} h{} tp{} dp{}", gpu, run.hidden, run.tp, run.dp),
                      run.iteration_ms, 1e3 * r.report.step_time_s,
                      plan.name() + (r.report.memory.fits ? "" : " (predicted not to fit)")});
  }
  return t;
}

// ---- T9: NVIDIA NeMo 24.07 performance summary, DGX-H100, FP8 (published.md T9) -------------
// Layout, batch and sequence as the table gives them; NeMo's performance recipes run Megatron-Core
// with Transformer Engine FP8, the distributed optimizer (ZeRO-1: NeMo's distributed_fused_adam),
// sequence parallelism wherever tp > 1, no activation recomputation and interleaving where VP > 1.
// Attention is flash-attn 2, not cuDNN: the 24.07 launcher sets NVTE_FUSED_ATTN: 0 for every run
// ("Disable cudnn FA until we've tested it more", NVIDIA/NeMo-Framework-Launcher tag 24.07,
// launcher_scripts/conf/config.yaml:72), so Transformer Engine 1.8 falls back to its
// FlashAttention backend, the flash-attn package (attention.py FlashAttention).
// The GPT3-5B/20B and Nemotron models' dimensions are NeMo-Framework-Launcher's training configs
// (models/zoo/gpt3-5b.json ... nemotron4-340b.json give each source).
struct Table9Run {
  const char* model;
  int64_t gpus, global_batch, micro_batch, seq, tp, pp, cp, vp;
  double tokens_per_s_per_gpu;
  // The run's own configuration where its recipe departs from the others' (NeMo-Framework-Launcher
  // launcher_scripts/conf/training/nemotron/nemotron_340b.yaml: activations_checkpoint_granularity
  // selective, optim.grad_sync_dtype bf16): the layout as it ran, not a knob fitted to the row.
  bool selective = false, bf16_gradients = false;
};
constexpr Table9Run kTable9[] = {
    {"gpt3-5b", 64, 2048, 4, 2048, 1, 1, 1, 1, 22521},
    {"gpt3-20b", 64, 256, 2, 2048, 2, 1, 1, 1, 5851},
    {"gpt3-175b", 128, 256, 1, 2048, 4, 8, 1, 6, 726},
    {"gpt3-175b", 512, 2048, 2, 2048, 4, 8, 1, 6, 782},
    {"llama2-7b", 8, 128, 1, 4096, 1, 1, 1, 1, 16847},
    {"llama2-13b", 16, 128, 1, 4096, 1, 4, 1, 10, 8646},
    {"llama2-70b", 64, 128, 1, 4096, 4, 4, 1, 20, 1707},
    {"nemotron3-8b", 64, 256, 4, 4096, 2, 1, 1, 1, 12701},
    {"nemotron3-22b", 64, 256, 2, 4096, 2, 4, 1, 10, 4256},
    {"nemotron4-340b", 128, 32, 1, 4096, 8, 8, 1, 12, 322, true, true},
    {"llama3-8b", 8, 128, 1, 8192, 1, 1, 2, 1, 12036},
    {"llama3-70b", 64, 128, 1, 8192, 4, 4, 2, 5, 1533},
};

ValidationRow predict_table9(const Table9Run& run, const spec::ClusterSpec& cluster,
                             sim::Fidelity fidelity) {
  spec::ModelSpec model = models::zoo_model(run.model);
  spec::Plan plan;
  plan.tp = run.tp;
  plan.pp = run.pp;
  plan.cp = run.cp;
  plan.dp = run.gpus / (run.tp * run.pp * run.cp);
  plan.zero = 1;
  plan.micro_batch = run.micro_batch;
  plan.global_batch = run.global_batch;
  plan.seq_len = run.seq;
  plan.sequence_parallel = run.tp > 1;
  plan.dtype = spec::Dtype::kFp8;
  plan.stack = spec::builtin_stack("megatron-core");
  plan.stack->attention = spec::AttentionKernel::kFlash2;
  if (run.selective) plan.recompute = spec::Recompute::kSelective;
  if (run.bf16_gradients) plan.stack->grad_dtype = spec::Dtype::kBf16;
  if (run.vp > 1) {
    plan.schedule = spec::Schedule::kInterleaved;
    plan.virtual_stages = run.vp;
  }
  sim::SimulationOptions options;
  options.fidelity = fidelity;
  sim::SimulationResult r = sim::simulate(model, cluster, plan, options);
  ValidationRow row;
  row.name = fmt::format("{} {} GPUs", run.model, run.gpus);
  row.published = run.tokens_per_s_per_gpu;
  row.predicted = static_cast<double>(run.global_batch * run.seq) / r.report.step_time_s /
                  static_cast<double>(run.gpus);
  row.detail = plan.name() + (r.report.memory.fits ? "" : " (predicted not to fit)");
  return row;
}

ValidationTable table9(sim::Fidelity fidelity) {
  ValidationTable t{
      "T9",
      "NVIDIA NeMo 24.07 performance summary: tokens/s per H100 in FP8 on "
      "dgx-h100, stack megatron-core with flash-attn 2 (the launcher's NVTE_FUSED_ATTN: 0), "
      "layout as published",
      "tokens/s/GPU",
      true,
      {},
      ""};
  const spec::ClusterSpec h100 = spec::builtin_cluster("dgx-h100");
  for (const Table9Run& run : kTable9) t.rows.push_back(predict_table9(run, h100, fidelity));
  return t;
}

// ---- K tables: GPU time per op class of a PyTorch-profiler trace against the prediction -----
// One row per op class (the trace's kernels classified by traces/kernel_classes), the GPU-busy
// total, and the predicted step against that total.
ValidationTable kernel_class_table(ValidationTable t, const std::string& path,
                                   const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                                   const spec::Plan& plan) {
  traces::KernelTimes measured = traces::kernel_times(spec::read_json_file(path), path);
  const double steps = static_cast<double>(std::max<int64_t>(1, measured.steps));
  const loop::ClassTimes predicted = loop::predicted_class_times(model, cluster, plan);
  double measured_total = 0, predicted_total = 0;
  for (spec::OpClass c : loop::profiled_classes()) {
    const double m = measured.seconds.count(c) ? measured.seconds.at(c) / steps : 0;
    const double p = predicted.seconds.count(c) ? predicted.seconds.at(c) : 0;
    measured_total += m;
    predicted_total += p;
    t.rows.push_back(
        {std::string(spec::enum_name(spec::op_class_names(), c)), 1e3 * m, 1e3 * p, "per step"});
  }
  t.rows.push_back(
      {"all kernels (GPU busy)", 1e3 * measured_total, 1e3 * predicted_total, "per step"});
  // The predicted step counts each kernel's launch gap (launch_overhead_us), so it is held
  // against the trace's wall step where the trace has one.
  if (measured.wall_step_s > 0) {
    t.rows.push_back({"step time (wall)", 1e3 * measured.wall_step_s, 1e3 * predicted.step_s,
                      "predicted step against the trace's, optimizer step to optimizer step"});
  } else {
    t.rows.push_back({"GPU busy", 1e3 * measured_total, 1e3 * predicted.busy_s,
                      "without the trace's wall step: the GPU-busy times held together"});
  }
  t.note = fmt::format("{} kernels over {} steps in {}", measured.kernels, measured.steps, path);
  return t;
}

// K1: GPT-2 124M on one H100 (published.md K1).
ValidationTable table_k1(const std::string& path) {
  ValidationTable t{"K1",
                    "PyTorch-profiler trace of GPT-2 124M (vocabulary 50304), batch 8 x 1024, "
                    "bf16 autocast, SDPA, fused AdamW, one H100: GPU time per op class and step, "
                    "on h100-1gpu, stack pytorch-fsdp with autocast (eager PyTorch, SDPA; one GPU)",
                    "ms",
                    false,
                    {},
                    ""};
  if (path.empty()) {
    t.note = "skipped: give --kineto PATH (traces/samples/kineto-gpt2-124m-h100-b8.json.gz)";
    return t;
  }
  spec::ModelSpec model = models::zoo_model("gpt2-124m");
  model.transformer().vocab = 50304;
  spec::Plan plan;
  plan.micro_batch = 8;
  plan.global_batch = 8;
  plan.stack = spec::builtin_stack("pytorch-fsdp");
  plan.stack->autocast = true;  // the trace ran torch.autocast over fp32 weights (K1)
  return kernel_class_table(std::move(t), path, model, spec::builtin_cluster("h100-1gpu"), plan);
}

// K2..K5: Llama-3 8B width, 8 layers, micro-batch 1 x 8192, on the project's H200
// (bench/pytorch_llama_layers.py, scripts/gpu-fidelity.sh), eager and compiled per block; under
// torch.autocast over fp32 weights (K2, K3), or TorchTitan's FSDP2 with bf16 parameters and fp32
// reduction at world size 1 (K4, K5: plan zero 3 over one rank). The loss is eager in all four.
ValidationTable table_llama_h200(const std::string& id, const std::string& trace,
                                 const std::string& stack, bool fsdp) {
  ValidationTable t{id,
                    fmt::format("PyTorch-profiler trace of Llama-3 8B width, 8 layers, 1 x 8192 "
                                "tokens, {}, SDPA, fused AdamW, gradient clipping, {} on one H200 "
                                "(the project's, 2026-11-28): GPU time per op class, on "
                                "h200-1gpu, stack {}{}",
                                fsdp ? "FSDP2 bf16 parameters (world size 1)" : "bf16 autocast",
                                stack == "torchtitan" ? "eager" : "torch.compile per block", stack,
                                fsdp ? ", zero 3" : " with autocast"),
                    "ms",
                    false,
                    {},
                    ""};
  if (trace.empty()) {
    t.note = "skipped: no trace";
    return t;
  }
  spec::ModelSpec model = models::zoo_model("llama3-8b");
  model.transformer().layers = 8;
  spec::Plan plan;
  plan.micro_batch = 1;
  plan.global_batch = 1;
  plan.zero = fsdp ? 3 : 0;
  plan.stack = spec::builtin_stack(stack);
  plan.stack->autocast = !fsdp;  // TorchTitan on one GPU without FSDP trains under autocast
  // The script's FSDP2 units (bench/pytorch_llama_layers.py): TorchTitan's policy before v0.2,
  // every block but the last resharded after forward, the root (embedding, norm, head) kept.
  plan.stack->reshard_after_forward = spec::ReshardAfterForward::kBlocksButLast;
  // The script compiles the blocks alone: its loss runs eager.
  plan.stack->cross_entropy = spec::CrossEntropy::kEager;
  return kernel_class_table(std::move(t), trace, model, spec::builtin_cluster("h200-1gpu"), plan);
}

}  // namespace

std::vector<ValidationTable> run_validation(const ValidationOptions& o) {
  spec::ClusterSpec a100 = spec::builtin_cluster("dgx-a100");
  std::vector<ValidationTable> tables;
  ValidationTable t1{"T1",
                     "Narayanan et al. SC'21 Table 1: TFLOP/s per GPU (eq. 3, with recompute) "
                     "on dgx-a100, stack megatron-lm; micro-batch, chunks and DDP kind from the "
                     "paper's run script (examples/sc21/run_table_1.sh)",
                     "TFLOP/s",
                     true,
                     {},
                     ""};
  for (const Table1Run& run : kTable1) t1.rows.push_back(predict_table1(run, a100, o.fidelity));
  tables.push_back(std::move(t1));
  tables.push_back(table4(a100));
  tables.push_back(table5(a100, o.fidelity));
  tables.push_back(table5d());
  tables.push_back(table6(o.fidelity));
  tables.push_back(table9(o.fidelity));
  tables.push_back(table_k1(o.kineto));
  tables.push_back(table_llama_h200("K2", o.llama_eager_trace, "torchtitan", false));
  tables.push_back(table_llama_h200("K3", o.llama_compiled_trace, "torchtitan-compiled", false));
  tables.push_back(table_llama_h200("K4", o.llama_fsdp_eager_trace, "torchtitan", true));
  tables.push_back(
      table_llama_h200("K5", o.llama_fsdp_compiled_trace, "torchtitan-compiled", true));
  return tables;
}

}  // namespace sextant::cli
