// A plan as DeepSpeed's JSON config (deepspeed/runtime/config.py, zero/config.py at edaa7221; each
// key with its source line in stacks/flags/deepspeed.json). What DeepSpeed sets in code (the
// pipeline's stages, Ulysses' group, the checkpointed blocks) is said in the notes.
#include <fmt/format.h>

#include "export_targets.hpp"

namespace sextant::interop::detail {

namespace {

const char* device(spec::OffloadTarget t) {
  return t == spec::OffloadTarget::kNvme ? "nvme" : "cpu";
}

void batches_and_precision(const ExportInput& in, ExportOutput& out) {
  const spec::Plan& p = in.plan;
  out.set("train_batch_size", p.global_batch);
  out.set("train_micro_batch_size_per_gpu", p.micro_batch);
  out.set("gradient_accumulation_steps", p.micro_batches());
  if (in.compute == spec::Dtype::kBf16) out.set("bf16.enabled", true);
  if (in.compute == spec::Dtype::kFp16) out.set("fp16.enabled", true);
  // (Its default is 1.0: runtime/constants.py:261. 0 turns clipping off.)
  out.set("gradient_clipping", in.stack.grad_clip ? 1.0 : 0.0);
}

void zero(const ExportInput& in, ExportOutput& out) {
  const spec::Plan& p = in.plan;
  if (p.zero == 0 && !p.offload.state()) return;
  out.set("zero_optimization.stage", p.zero);
  out.set("zero_optimization.overlap_comm", in.stack.dp_overlap);
  if (p.zero < 3) out.set("zero_optimization.reduce_bucket_size", bucket_elements(in));
  if (p.offload.optimizer != spec::OffloadTarget::kNone)
    out.set("zero_optimization.offload_optimizer.device", device(p.offload.optimizer));
  if (p.offload.params != spec::OffloadTarget::kNone)
    out.set("zero_optimization.offload_param.device", device(p.offload.params));
}

void model_parallelism(const ExportInput& in, ExportOutput& out) {
  const spec::Plan& p = in.plan;
  if (p.tp > 1) out.set("tensor_parallel.autotp_size", p.tp);
  if (p.cp > 1) {
    // The raw pair deepspeed.initialize reads to build its (data, sequence) mesh
    // (deepspeed/__init__.py:203-206).
    out.set("sequence_parallel_size", p.cp);
    out.set("data_parallel_size", p.dp);
    out.notes.push_back(
        "DeepSpeed-Ulysses: wrap the attention in deepspeed.sequence.layer.DistributedAttention "
        "over the sequence-parallel group");
  }
  if (p.pp > 1) {
    if (!even_stages(in))
      out.refused.push_back(
          "a custom layer split: exported for PipelineModule's even split (partition_method "
          "'uniform') only");
    out.notes.push_back(fmt::format(
        "{} pipeline stages: build the model as deepspeed.pipe.PipelineModule(num_stages={}, "
        "partition_method='uniform'); its schedule is 1F1B",
        p.pp, p.pp));
  }
  if (p.ep > 1)
    out.notes.push_back(
        fmt::format("expert parallelism: deepspeed.moe.layer.MoE(ep_size={})", p.ep));
  if (p.recompute == spec::Recompute::kFull) {
    if (p.recompute_layers > 0)
      out.refused.push_back(
          "full recompute of the first layers of each chunk: DeepSpeed checkpoints the blocks "
          "the model script wraps");
    // cpu_checkpointing "only works with partition_activations" (checkpointing.py:1193).
    const bool to_host = p.offload.activations != spec::OffloadTarget::kNone;
    out.set("activation_checkpointing.partition_activations", to_host);
    out.set("activation_checkpointing.cpu_checkpointing", to_host);
    out.notes.push_back(
        "full recompute: wrap each transformer block in deepspeed.checkpointing.checkpoint");
  } else if (p.offload.activations != spec::OffloadTarget::kNone) {
    out.refused.push_back(
        "activation offload without recompute: DeepSpeed's cpu_checkpointing offloads the "
        "checkpointed blocks' inputs only");
  }
}

}  // namespace

void deepspeed_settings(const ExportInput& in, ExportOutput& out) {
  batches_and_precision(in, out);
  zero(in, out);
  model_parallelism(in, out);
  if (in.trial) {
    // The engine's step lines every step, with its forward/backward/step timers.
    out.set("steps_per_print", 1);
    out.set("wall_clock_breakdown", true);
    out.notes.push_back(fmt::format(
        "a trial of {} steps: the training script stops after them and feeds its own (or "
        "synthetic) batches; DeepSpeed reads neither from its config",
        in.trial->steps));
  }
  out.notes.push_back(
      fmt::format("launch on {} GPUs (deepspeed --num_gpus / --hostfile)", in.plan.world_size()));
}

}  // namespace sextant::interop::detail
