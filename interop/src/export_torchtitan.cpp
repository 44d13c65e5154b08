// A plan as TorchTitan's TOML job config (v0.2.2, torchtitan/config/job_config.py; each key with
// its source line in stacks/flags/torchtitan.json).
#include <fmt/format.h>

#include "export_targets.hpp"

namespace sextant::interop::detail {

namespace {

const char* schedule_name(spec::Schedule s) {
  switch (s) {
    case spec::Schedule::kGpipe:
      return "GPipe";
    case spec::Schedule::kInterleaved:
      return "Interleaved1F1B";
    default:
      break;
  }
  return "1F1B";
}

const char* torch_dtype(spec::Dtype d) {
  return d == spec::Dtype::kFp32 ? "float32" : "bfloat16";
}

// TorchTitan cuts n layers into stages of layers_per_stage after counting the first stage's and
// the last one's missing layers as if present: (n + first_less + last_less) / layers_per_stage
// stages (torchtitan/distributed/pipeline_parallel.py:71-109; both "less" default to 1, so an
// even split says 0). The plan's split in those terms: its middle chunks all alike.
void stage_split(const ExportInput& in, ExportOutput& out) {
  const spec::Plan& p = in.plan;
  const std::vector<int64_t> chunks = spec::stage_layer_counts(p, in.model.transformer().layers);
  const int64_t per_stage = chunks.size() > 2 ? chunks[1] : std::max(chunks.front(), chunks.back());
  bool expressible = true;
  for (size_t i = 1; i + 1 < chunks.size(); ++i)
    expressible = expressible && chunks[i] == per_stage;
  expressible = expressible && chunks.front() <= per_stage && chunks.back() <= per_stage;
  if (!expressible) {
    out.refused.push_back(
        "a layer split whose middle stages differ: TorchTitan gives every stage but the first and "
        "the last the same layers");
    return;
  }
  out.set("parallelism.pipeline_parallel_layers_per_stage", per_stage);
  out.set("parallelism.pipeline_parallel_first_stage_less_layers", per_stage - chunks.front());
  out.set("parallelism.pipeline_parallel_last_stage_less_layers", per_stage - chunks.back());
}

void parallelism(const ExportInput& in, ExportOutput& out) {
  const spec::Plan& p = in.plan;
  // FSDP2 shards over the data-parallel ranks (ZeRO-2: kept gathered after forward, ZeRO-3:
  // resharded); plain DDP replicates, which TorchTitan runs without other parallelism only.
  // (With context parallelism FSDP shards over the dp x cp ranks itself: parallel_dims.py.)
  if (p.replicas() > 1 && p.zero >= 2) {
    out.set("parallelism.data_parallel_shard_degree", p.dp);
    // ZeRO-3's units: "default" keeps [norm, output] whole (and every unit under pipeline
    // parallelism), "always" none, "never" all (apply_fsdp; spec::ReshardAfterForward).
    const spec::ReshardAfterForward units = in.stack.reshard_after_forward;
    // A plan made under another stack's policy (FSDP1 keeps its root unit) still exports; the
    // run then gathers for the backward what the plan's prediction kept.
    const bool kept = p.zero == 2 || units == spec::ReshardAfterForward::kNone;
    if (p.zero == 3 && units != spec::ReshardAfterForward::kAll &&
        units != spec::ReshardAfterForward::kAllButHead && !kept)
      out.notes.push_back(fmt::format(
          "the plan's stack keeps units whole from forward to backward (reshard_after_forward "
          "{}); TorchTitan has no such policy and reshards every unit (always): its run gathers "
          "them again for the backward",
          spec::enum_name(spec::reshard_after_forward_names(), units)));
    out.set("parallelism.fsdp_reshard_after_forward",
            kept                                              ? "never"
            : units == spec::ReshardAfterForward::kAllButHead ? "default"
                                                              : "always");
  } else if (p.dp > 1) {
    out.set("parallelism.data_parallel_replicate_degree", p.dp);
    out.set("parallelism.data_parallel_shard_degree", 1);
  }
  if (p.tp > 1) {
    if (!p.sequence_parallel)
      out.refused.push_back(
          "tensor parallelism without sequence parallelism: TorchTitan v0.2.2's apply_tp shards "
          "the norms' sequence (SequenceParallel) whenever tp > 1");
    out.set("parallelism.tensor_parallel_degree", p.tp);
  }
  if (p.pp > 1) {
    out.set("parallelism.pipeline_parallel_degree", p.pp);
    out.set("parallelism.pipeline_parallel_schedule", schedule_name(p.schedule));
    out.set("parallelism.pipeline_parallel_microbatch_size", p.micro_batch);
    stage_split(in, out);
  }
  if (p.cp > 1) {
    out.set("parallelism.context_parallel_degree", p.cp);
    // PyTorch's context-parallel SDPA passes key/value shards around the ring with all-to-alls
    // ("alltoall") or gathers them whole ("allgather").
    out.set("parallelism.context_parallel_rotate_method",
            p.cp_algorithm == spec::ContextAlgorithm::kAllGather ? "allgather" : "alltoall");
  }
  if (p.ep > 1) out.set("parallelism.expert_parallel_degree", p.ep);
  const bool compiled = in.stack.fusion == spec::Fusion::kCompiled;
  if (p.tp > 1 && in.stack.tp_overlap != spec::TpOverlap::kNone) {
    if (compiled)
      out.set("parallelism.enable_async_tensor_parallel", true);
    else
      out.notes.push_back("tensor-parallel overlap (async TP) needs [compile] enable: left off");
  }
}

void checkpointing(const ExportInput& in, ExportOutput& out) {
  const spec::Plan& p = in.plan;
  switch (p.recompute) {
    case spec::Recompute::kNone:
      out.set("activation_checkpoint.mode", "none");
      break;
    case spec::Recompute::kFull:
      if (p.recompute_layers > 0)
        out.refused.push_back(
            "full recompute of the first layers of each chunk: TorchTitan checkpoints every "
            "block, or every N-th (selective_ac_option = \"N\")");
      out.set("activation_checkpoint.mode", "full");
      break;
    case spec::Recompute::kSelective:
      if (in.stack.selective_recompute != spec::SelectiveRecompute::kSaveMatmuls)
        out.refused.push_back(
            "selective recompute of the attention core (Megatron's): TorchTitan's selective "
            "policy is per-op, saving the matmuls; plan with --stack torchtitan");
      out.set("activation_checkpoint.mode", "selective");
      out.set("activation_checkpoint.selective_ac_option", "op");
      break;
  }
}

void training(const ExportInput& in, ExportOutput& out) {
  const spec::Plan& p = in.plan;
  // Without pipeline stages a step accumulates global / (local x dp) micro-batches; with them
  // the local batch goes through the pipeline in micro-batches of its own size (above).
  out.set("training.local_batch_size", p.pp > 1 ? p.global_batch / p.dp : p.micro_batch);
  out.set("training.global_batch_size", p.global_batch);
  out.set("training.seq_len", sequence_length(in));
  out.set("training.mixed_precision_param", torch_dtype(in.compute));
  // (Its Literal allows float32 alone: job_config.py:290.)
  if (spec::gradient_dtype(in.stack, in.compute) != spec::Dtype::kFp32)
    out.refused.push_back(
        "gradients reduced in 16 bits: TorchTitan reduces them in float32 "
        "(training.mixed_precision_reduce)");
  out.set("training.mixed_precision_reduce", "float32");
  if (p.offload.state()) out.set("training.enable_cpu_offload", true);
  if (in.stack.grad_clip) out.set("training.max_norm", 1.0);
  // The converter's registered name (components/quantization/float8.py:238); the "float8" of the
  // config's docstring is no registered name at v0.2.2.
  if (in.compute == spec::Dtype::kFp8)
    out.set("model.converters", spec::Json::array({"quantize.linear.float8"}));
  if (in.stack.fusion == spec::Fusion::kCompiled) out.set("compile.enable", true);
  if (in.trial) {
    out.set("training.steps", in.trial->steps);
    out.set("metrics.log_freq", 1);  // also the period of the console step lines
  }
}

}  // namespace

void torchtitan_settings(const ExportInput& in, ExportOutput& out) {
  parallelism(in, out);
  checkpointing(in, out);
  training(in, out);
  out.notes.push_back(fmt::format(
      "launch on {} GPUs (torchrun --nproc-per-node, --nnodes; run_train.sh NGPU=...) with "
      "[model] name and flavor of this architecture ({})",
      in.plan.world_size(), in.model.name));
}

}  // namespace sextant::interop::detail
