// A plan as Megatron-LM's pretrain_gpt.py arguments (core_v0.14.0, megatron/training/
// arguments.py) or as NeMo 2.0 recipe overrides of the same Megatron-Core settings
// (stacks/flags/megatron.json and nemo.json record each name with its source line).
#include <fmt/format.h>

#include "export_targets.hpp"
#include "megatron_names.hpp"

namespace sextant::interop::detail {

namespace {

using Name = MegatronName;

class Writer {
 public:
  Writer(bool nemo, ExportOutput& out) : nemo_(nemo), out_(out) {}
  void set(Name n, spec::Json value) {
    const char* name = nemo_ ? n.nemo : n.flag;
    if (*name != '\0') out_.set(name, std::move(value));
  }
  // A flag that takes no value (true) in pretrain_gpt.py and a boolean field in NeMo.
  void on(Name n) { set(n, true); }
  bool nemo() const { return nemo_; }

 private:
  bool nemo_;
  ExportOutput& out_;
};

const char* cp_comm_type(spec::ContextAlgorithm a) {
  switch (a) {
    case spec::ContextAlgorithm::kAllGather:
      return "all_gather";  // Transformer Engine's spelling (the help text's "allgather" fails)
    case spec::ContextAlgorithm::kAllToAll:
      return "a2a";
    case spec::ContextAlgorithm::kRing:
      break;
  }
  return "p2p";  // Transformer Engine's ring exchange of key/value blocks
}

void layout(const ExportInput& in, Writer& w, ExportOutput& out) {
  const spec::Plan& p = in.plan;
  const int64_t layers = in.model.transformer().layers;
  if (p.tp > 1) w.set(kTensorModelParallelSize, p.tp);
  if (p.sequence_parallel) w.on(kSequenceParallel);
  if (p.pp > 1) w.set(kPipelineModelParallelSize, p.pp);
  if (p.schedule == spec::Schedule::kInterleaved && p.virtual_stages > 1) {
    if (!even_stages(in) || layers % p.chunks() != 0)
      out.refused.push_back(
          "interleaved stages of unequal layer counts: Megatron splits the layers evenly over "
          "pp x virtual stages");
    if (w.nemo())
      w.set({"", "trainer.strategy.virtual_pipeline_model_parallel_size"}, p.virtual_stages);
    else
      w.set({"--num-layers-per-virtual-pipeline-stage", ""}, layers / p.chunks());
  } else if (!even_stages(in)) {
    // Megatron shortens the first and the last stage; the middle ones share the rest evenly.
    const std::vector<int64_t>& s = p.stage_layers;
    bool middle_even = true;
    for (size_t i = 2; i + 1 < s.size(); ++i) middle_even = middle_even && s[i] == s[1];
    if (!middle_even)
      out.refused.push_back(
          "a layer split whose middle stages differ: Megatron sets the first and last stage's "
          "layers and splits the rest evenly");
    w.set(kDecoderFirstPipelineNumLayers, s.front());
    w.set(kDecoderLastPipelineNumLayers, s.back());
  }
  if (p.cp > 1) {
    w.set(kContextParallelSize, p.cp);
    // One value: every layer's (a list of num_layers values would set each layer's).
    if (w.nemo())
      w.set({"", "model.config.cp_comm_type"}, cp_comm_type(p.cp_algorithm));
    else
      w.set({"--cp-comm-type", ""}, spec::Json::array({cp_comm_type(p.cp_algorithm)}));
  }
  if (p.ep > 1) {
    if (in.compute == spec::Dtype::kFp16)
      out.refused.push_back(
          "expert parallelism in fp16: Megatron refuses it (arguments.py:951-956)");
    w.set(kExpertModelParallelSize, p.ep);
  }
}

void sharding(const ExportInput& in, Writer& w) {
  const spec::Plan& p = in.plan;
  // ZeRO-1 is the distributed optimizer, ZeRO-2/3 Megatron-FSDP's sharding strategies; one
  // replica has nothing to shard, but the optimizer offload runs on the distributed optimizer.
  const bool sharded = p.replicas() > 1 || p.offload.state();
  if (sharded && p.zero == 1) w.on(kUseDistributedOptimizer);
  if (sharded && p.zero >= 2) {
    // Megatron-FSDP saves its checkpoints as DTensors only (arguments.py:619-639).
    if (w.nemo()) {
      w.set({"", "trainer.strategy.fsdp"}, "megatron");
    } else {
      w.on({"--use-megatron-fsdp", ""});
      w.set({"--ckpt-format", ""}, "fsdp_dtensor");
    }
    w.set(kDataParallelShardingStrategy, p.zero == 2 ? "optim_grads" : "optim_grads_params");
  }
  if (p.offload.optimizer != spec::OffloadTarget::kNone) {
    w.on(kOptimizerCpuOffload);
    w.on(kUsePrecisionAwareOptimizer);
    w.on(kOverlapCpuOptimizerD2hH2d);
  }
}

void recompute(const ExportInput& in, Writer& w, ExportOutput& out) {
  const spec::Plan& p = in.plan;
  if (p.recompute == spec::Recompute::kSelective) {
    if (in.stack.selective_recompute != spec::SelectiveRecompute::kAttentionCore)
      out.refused.push_back(
          "selective recompute that saves the matmuls (TorchTitan's per-op policy): Megatron's "
          "selective recompute re-runs the attention core; plan with --stack megatron-core");
    w.set(kRecomputeGranularity, "selective");
  } else if (p.recompute == spec::Recompute::kFull) {
    w.set(kRecomputeGranularity, "full");
    // Every layer: uniform chunks of one layer; the first N of each chunk: the block method.
    w.set(kRecomputeMethod, p.recompute_layers > 0 ? "block" : "uniform");
    w.set(kRecomputeNumLayers, p.recompute_layers > 0 ? p.recompute_layers : 1);
  }
  if (p.offload.activations != spec::OffloadTarget::kNone) {
    if (p.pp > 1 || p.recompute != spec::Recompute::kNone)
      out.refused.push_back(
          "activation offload beside pipeline stages or recompute: TransformerConfig refuses "
          "cpu_offloading with either (transformer_config.py:808-823)");
    if (!w.nemo()) {
      out.refused.push_back(
          "activation offload: no pretrain_gpt.py flag at core_v0.14.0 (TransformerConfig's "
          "cpu_offloading fields); export --to nemo sets them");
      return;
    }
    // Megatron offloads the first N < num_layers layers (transformer_config.py:808-823): every
    // layer (activation_layers 0) it cannot.
    if (p.offload.activation_layers == 0)
      out.refused.push_back(
          "offloading every layer's activations: Megatron offloads at most num_layers - 1 "
          "(give --offload-activation-layers)");
    w.set({"", "model.config.cpu_offloading"}, true);
    w.set({"", "model.config.cpu_offloading_num_layers"}, p.offload.activation_layers);
    w.set({"", "model.config.cpu_offloading_weights"}, false);  // as NeMo's perf helpers set it
  }
}

void precision_and_batch(const ExportInput& in, Writer& w) {
  switch (in.compute) {
    case spec::Dtype::kBf16:
      if (w.nemo()) w.set({"", "trainer.plugins"}, "bf16_mixed");
      w.on({"--bf16", ""});
      break;
    case spec::Dtype::kFp16:
      if (w.nemo()) w.set({"", "trainer.plugins"}, "fp16_mixed");
      w.on({"--fp16", ""});
      break;
    case spec::Dtype::kFp8:
      // Transformer Engine's hybrid recipe (e4m3 forward, e5m2 gradients) over bf16. NeMo-Run's
      // command line has the bf16_mixed and fp16_mixed factories only (mixed_precision.py:22,
      // 39); bf16_with_fp8_mixed() is bf16_mixed with its fp8 field set.
      if (w.nemo()) {
        w.set({"", "trainer.plugins"}, "bf16_mixed");
        w.set({"", "trainer.plugins.fp8"}, "hybrid");
      }
      w.on({"--bf16", ""});
      w.set({"--fp8-format", ""}, "hybrid");
      break;
    default:
      break;  // fp32: neither flag
  }
  w.set(kMicroBatchSize, in.plan.micro_batch);
  w.set(kGlobalBatchSize, in.plan.global_batch);
  w.set(kSeqLength, sequence_length(in));
}

// The stack's overlap knobs and bucket, where the layout uses them.
void overlaps(const ExportInput& in, Writer& w, ExportOutput& out) {
  const spec::Plan& p = in.plan;
  const spec::Stack& s = in.stack;
  if (p.replicas() > 1 && s.dp_overlap) w.on(kOverlapGradReduce);
  // (--overlap-param-gather needs --overlap-grad-reduce: arguments.py:559-563.)
  if (p.replicas() > 1 && (p.zero == 1 || p.zero == 2) && s.param_gather_overlap) {
    if (!s.dp_overlap)
      out.refused.push_back(
          "the parameter gather overlapped without the gradient reduce: Megatron's "
          "--overlap-param-gather needs --overlap-grad-reduce");
    w.on(kOverlapParamGather);
  }
  if (p.replicas() > 1 && p.zero < 3) w.set(kDdpBucketSize, bucket_elements(in));
  if (p.tp > 1 && p.sequence_parallel && s.tp_overlap != spec::TpOverlap::kNone) {
    if (w.nemo())
      out.notes.push_back(
          "tensor-parallel communication overlap: add NeMo's MegatronCommOverlapCallback("
          "tp_comm_overlap=True) to the recipe's trainer callbacks");
    w.on({"--tp-comm-overlap", ""});
  }
  // Megatron overlaps stage transfers under the interleaved schedule only; turning it off there
  // needs more than two stages (arguments.py:536-548).
  if (p.schedule == spec::Schedule::kInterleaved && p.pp > 1 && !s.pp_overlap) {
    if (p.pp <= 2)
      out.refused.push_back(
          "interleaved stages on 2 ranks with blocking transfers: Megatron's "
          "--no-overlap-p2p-communication needs pp > 2");
    w.set(kNoOverlapP2pCommunication, w.nemo() ? spec::Json(false) : spec::Json(true));
  }
}

// The model's shape as pretrain_gpt.py takes it (NeMo takes it from the recipe's model config).
void architecture(const ExportInput& in, Writer& w, ExportOutput& out) {
  const spec::TransformerSpec& t = in.model.transformer();
  if (w.nemo()) {
    out.notes.push_back(fmt::format(
        "the model: a NeMo recipe of this architecture ({} layers, hidden {}, {} heads, {} "
        "key/value heads, MLP {}), e.g. llm.llama3_8b.pretrain_recipe for Llama 3 8B",
        t.layers, t.hidden, t.heads, t.kv_heads, t.ffn_hidden));
    return;
  }
  w.set({"--num-layers", ""}, t.layers);
  w.set({"--hidden-size", ""}, t.hidden);
  w.set({"--ffn-hidden-size", ""}, t.ffn_hidden);
  w.set({"--num-attention-heads", ""}, t.heads);
  if (t.kv_heads != t.heads) {
    w.on({"--group-query-attention", ""});
    w.set({"--num-query-groups", ""}, t.kv_heads);
  }
  w.set({"--max-position-embeddings", ""},
        std::max(sequence_length(in), t.max_positions > 0 ? t.max_positions : int64_t{0}));
  if (t.activation == spec::Activation::kSwiglu) w.on({"--swiglu", ""});
  if (t.norm == spec::Norm::kRmsNorm) w.set({"--normalization", ""}, "RMSNorm");
  w.set({"--position-embedding-type", ""},
        t.position_embedding == spec::PositionEmbedding::kRope ? "rope" : "learned_absolute");
  if (!t.tied_embeddings) w.on({"--untie-embeddings-and-output-weights", ""});
  if (!t.bias) w.on({"--disable-bias-linear", ""});
  if (!t.dropout) {
    w.set({"--attention-dropout", ""}, 0.0);
    w.set({"--hidden-dropout", ""}, 0.0);
  }
  if (in.stack.vocab_multiple > 1)
    w.set({"--make-vocab-size-divisible-by", ""}, in.stack.vocab_multiple);
  if (t.moe) {
    w.set({"--num-experts", ""}, t.moe->experts);
    w.set({"--moe-router-topk", ""}, t.moe->top_k);
  }
  if (in.trial) {
    // A trial times steps, so it trains on Megatron's generated tokens with no tokenizer files.
    w.set({"--train-iters", ""}, in.trial->steps);
    w.set({"--log-interval", ""}, 1);
    w.on({"--log-throughput", ""});
    w.on({"--mock-data", ""});
    w.set({"--tokenizer-type", ""}, "NullTokenizer");
    w.set({"--vocab-size", ""}, t.vocab);
    return;
  }
  out.notes.push_back(fmt::format(
      "the tokenizer: the model's vocabulary has {} entries (--tokenizer-type and its files, or "
      "--tokenizer-type NullTokenizer --vocab-size {} for synthetic data)",
      t.vocab, t.vocab));
}

}  // namespace

void megatron_settings(const ExportInput& in, bool nemo, ExportOutput& out) {
  Writer w(nemo, out);
  layout(in, w, out);
  sharding(in, w);
  recompute(in, w, out);
  precision_and_batch(in, w);
  overlaps(in, w, out);
  architecture(in, w, out);
  out.notes.push_back(fmt::format(
      "launch on {} GPUs: data parallelism is what is left of them ({} replicas){}",
      in.plan.world_size(), in.plan.dp,
      nemo ? " (trainer.devices x trainer.num_nodes)" : " (torchrun --nproc-per-node, --nnodes)"));
}

}  // namespace sextant::interop::detail
