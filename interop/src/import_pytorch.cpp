// TorchTitan's TOML job config and DeepSpeed's JSON config as plans (export_torchtitan.cpp and
// export_deepspeed.cpp write them; the round trip is tested on every layout).
#include <fmt/format.h>

#include "import_settings.hpp"

namespace sextant::interop::detail {

namespace {

void torchtitan_stages(SettingsReader& r, int64_t layers, spec::Plan& p) {
  if (auto schedule = r.text("parallelism.pipeline_parallel_schedule")) {
    if (*schedule == "GPipe") {
      p.schedule = spec::Schedule::kGpipe;
    } else if (*schedule == "Interleaved1F1B") {
      p.schedule = spec::Schedule::kInterleaved;
    } else if (*schedule != "1F1B") {
      r.problem("parallelism.pipeline_parallel_schedule", *schedule,
                "GPipe, 1F1B or Interleaved1F1B (zero-bubble schedules are not modelled)");
    }
  }
  // TorchTitan's split (pipeline_parallel.py:71-109): stages of layers_per_stage, the first and
  // the last that many fewer; its defaults (1 fewer each) when the config says nothing.
  const auto per_stage = r.integer("parallelism.pipeline_parallel_layers_per_stage");
  const int64_t first_less =
      r.integer("parallelism.pipeline_parallel_first_stage_less_layers", 0, layers).value_or(1);
  const int64_t last_less =
      r.integer("parallelism.pipeline_parallel_last_stage_less_layers", 0, layers).value_or(1);
  const int64_t per_rank = p.schedule == spec::Schedule::kInterleaved ? 2 : 1;
  const int64_t stages =
      per_stage ? (layers + first_less + last_less + *per_stage - 1) / *per_stage : p.pp * per_rank;
  if (stages > layers || stages % p.pp != 0) {
    r.problem("parallelism.pipeline_parallel_layers_per_stage", std::to_string(*per_stage),
              fmt::format("a stage count ({}) divisible by pp ({}) and at most the layers", stages,
                          p.pp));
    return;
  }
  p.virtual_stages = stages / p.pp;
  const int64_t each = per_stage.value_or((layers + first_less + last_less) / stages);
  std::vector<int64_t> split(static_cast<size_t>(stages), each);
  split.front() -= first_less;
  split.back() -= last_less;
  int64_t sum = 0;
  for (int64_t n : split) sum += n;
  if (sum != layers || split.front() < 1 || split.back() < 1) {
    r.problem("parallelism.pipeline_parallel_layers_per_stage", std::to_string(each),
              fmt::format("stages that hold the model's {} layers", layers));
    return;
  }
  if (first_less != 0 || last_less != 0) p.stage_layers = split;
}

}  // namespace

spec::Plan torchtitan_plan(SettingsReader& r, const spec::ModelSpec& model,
                           std::optional<int64_t> gpus) {
  spec::Plan p;
  const int64_t layers = model.transformer().layers;
  p.tp = r.integer("parallelism.tensor_parallel_degree").value_or(1);
  p.sequence_parallel = p.tp > 1;  // apply_tp's SequenceParallel styles
  p.pp = r.integer("parallelism.pipeline_parallel_degree").value_or(1);
  p.cp = r.integer("parallelism.context_parallel_degree").value_or(1);
  if (auto rotate = r.text("parallelism.context_parallel_rotate_method"))
    p.cp_algorithm =
        *rotate == "allgather" ? spec::ContextAlgorithm::kAllGather : spec::ContextAlgorithm::kRing;
  p.ep = r.integer("parallelism.expert_parallel_degree").value_or(1);
  const auto replicate = r.integer("parallelism.data_parallel_replicate_degree");
  const auto shard = r.integer("parallelism.data_parallel_shard_degree", -1);
  if (replicate.value_or(1) > 1 && shard.value_or(1) > 1)
    r.problem("parallelism.data_parallel_replicate_degree", std::to_string(*replicate),
              "1 beside a shard degree (HSDP is not modelled)");
  // FSDP2 over the leftover ranks unless the config replicates (-1 and absent: leftover).
  p.dp = replicate.value_or(1) > 1 ? *replicate
         : shard && *shard > 0     ? *shard
                                   : data_parallel_from(gpus, rank_product(p.tp, p.pp, p.cp), r);
  if (p.dp == 0) r.problem("--gpus", "", "the devices the job runs on (dp is their leftover)");
  const bool replicated = replicate.value_or(1) > 1;
  const auto reshard = r.text("parallelism.fsdp_reshard_after_forward");
  p.zero = replicated ? 0 : reshard == std::optional<std::string>("never") ? 2 : 3;
  // (One replica has nothing to shard: the plan is ZeRO 0 whatever FSDP would do.)
  if (p.replicas() == 1 && !r.on("training.enable_cpu_offload")) p.zero = 0;
  if (p.pp > 1) torchtitan_stages(r, layers, p);
  r.has("parallelism.pipeline_parallel_microbatch_size");
  const std::string mode = r.text("activation_checkpoint.mode").value_or("selective");
  p.recompute = mode == "full"   ? spec::Recompute::kFull
                : mode == "none" ? spec::Recompute::kNone
                                 : spec::Recompute::kSelective;
  if (p.recompute == spec::Recompute::kSelective &&
      r.text("activation_checkpoint.selective_ac_option").value_or("2") != "op")
    r.problem("activation_checkpoint.selective_ac_option", "every N-th layer",
              "\"op\" (checkpointing every N-th block is not modelled)");
  // Micro-batches: the local batch accumulated, or cut into pipeline micro-batches.
  const int64_t local = r.integer("training.local_batch_size").value_or(8);
  p.micro_batch =
      p.pp > 1 ? r.integer("parallelism.pipeline_parallel_microbatch_size").value_or(1) : local;
  p.global_batch = r.integer("training.global_batch_size", -1).value_or(-1);
  if (p.global_batch <= 0) p.global_batch = local * std::max<int64_t>(p.dp, 1);
  if (auto seq = r.integer("training.seq_len"); seq && *seq != model.transformer().seq_len)
    p.seq_len = *seq;
  const bool fp8 = r.has("model.converters");
  p.dtype = fp8 ? spec::Dtype::kFp8
            : r.text("training.mixed_precision_param") == std::optional<std::string>("float32")
                ? spec::Dtype::kFp32
                : spec::Dtype::kBf16;
  r.has("training.mixed_precision_reduce");
  if (r.on("training.enable_cpu_offload"))
    p.offload.optimizer = p.offload.params = spec::OffloadTarget::kHost;
  spec::Stack stack =
      spec::builtin_stack(r.on("compile.enable") ? "torchtitan-compiled" : "torchtitan");
  if (p.tp > 1 && !r.on("parallelism.enable_async_tensor_parallel"))
    stack.tp_overlap = spec::TpOverlap::kNone;
  stack.grad_clip = r.number("training.max_norm").value_or(1.0) > 0;
  // "always" reshards every unit; "default" (the preset's policy) keeps [norm, output] whole.
  if (reshard == std::optional<std::string>("always"))
    stack.reshard_after_forward = spec::ReshardAfterForward::kAll;
  p.stack = stack;
  return p;
}

spec::Plan deepspeed_plan(SettingsReader& r, std::optional<int64_t> gpus) {
  spec::Plan p;
  p.micro_batch = r.integer("train_micro_batch_size_per_gpu").value_or(1);
  const int64_t steps = r.integer("gradient_accumulation_steps").value_or(1);
  p.global_batch = r.integer("train_batch_size").value_or(0);
  // train_batch_size = micro x accumulation x data-parallel size (runtime/config.py:936-985).
  if (p.global_batch > 0 && p.global_batch % (p.micro_batch * steps) == 0)
    p.dp = p.global_batch / (p.micro_batch * steps);
  else
    r.problem("train_batch_size", std::to_string(p.global_batch),
              "train_micro_batch_size_per_gpu x gradient_accumulation_steps x the data-parallel "
              "size");
  p.tp = r.integer("tensor_parallel.autotp_size", 0).value_or(0);
  if (p.tp == 0) p.tp = 1;
  p.cp = r.integer("sequence_parallel_size").value_or(1);
  if (p.cp > 1) p.cp_algorithm = spec::ContextAlgorithm::kAllToAll;  // Ulysses
  r.has("data_parallel_size");
  // The pipeline is built in code (PipelineModule(num_stages)): what the devices leave.
  if (gpus) {
    const int64_t others = rank_product(p.dp, p.tp, p.cp);
    if (others > 0 && *gpus % others == 0)
      p.pp = *gpus / others;
    else
      r.problem("--gpus", std::to_string(*gpus),
                fmt::format("a multiple of dp x tp x sequence-parallel size ({})", others));
  }
  p.zero = static_cast<int>(r.integer("zero_optimization.stage", 0, 3).value_or(0));
  auto device = [&](const std::string& name) {
    const auto d = r.text(name);
    return d == std::optional<std::string>("cpu")    ? spec::OffloadTarget::kHost
           : d == std::optional<std::string>("nvme") ? spec::OffloadTarget::kNvme
                                                     : spec::OffloadTarget::kNone;
  };
  p.offload.optimizer = device("zero_optimization.offload_optimizer.device");
  p.offload.params = device("zero_optimization.offload_param.device");
  if (r.has("activation_checkpointing.partition_activations") ||
      r.has("activation_checkpointing.cpu_checkpointing")) {
    p.recompute = spec::Recompute::kFull;
    if (r.on("activation_checkpointing.cpu_checkpointing"))
      p.offload.activations = spec::OffloadTarget::kHost;
    r.on("activation_checkpointing.partition_activations");
  }
  p.dtype = r.on("bf16.enabled")   ? spec::Dtype::kBf16
            : r.on("fp16.enabled") ? spec::Dtype::kFp16
                                   : spec::Dtype::kFp32;
  spec::Stack stack = spec::builtin_stack("deepspeed");
  if (r.has("zero_optimization.overlap_comm"))
    stack.dp_overlap = r.on("zero_optimization.overlap_comm");
  if (auto bucket = r.integer("zero_optimization.reduce_bucket_size", 1, kMaxBucket))
    stack.dp_bucket_bytes = *bucket * spec::dtype_bytes(spec::gradient_dtype(stack, *p.dtype));
  if (auto clip = r.number("gradient_clipping")) stack.grad_clip = *clip > 0;
  p.stack = stack;
  return p;
}

}  // namespace sextant::interop::detail
