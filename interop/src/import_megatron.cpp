// Megatron-LM's pretrain_gpt.py arguments, or NeMo's recipe overrides of the same settings, as
// a plan (export_megatron.cpp writes them; the round trip is tested on every layout).
#include <fmt/format.h>

#include "import_settings.hpp"
#include "megatron_names.hpp"

namespace sextant::interop::detail {

namespace {

struct Names {
  bool nemo;
  std::string operator()(MegatronName name) const { return nemo ? name.nemo : name.flag; }
};

spec::ContextAlgorithm cp_algorithm(const std::string& type, SettingsReader& r,
                                    const std::string& name) {
  if (type == "all_gather") return spec::ContextAlgorithm::kAllGather;
  if (type == "a2a") return spec::ContextAlgorithm::kAllToAll;
  if (type != "p2p") r.problem(name, type, "p2p, all_gather or a2a (a2a+p2p is not modelled)");
  return spec::ContextAlgorithm::kRing;
}

void read_layout(SettingsReader& r, const Names& n, int64_t layers, spec::Plan& p) {
  p.tp = r.integer(n(kTensorModelParallelSize)).value_or(1);
  p.pp = r.integer(n(kPipelineModelParallelSize)).value_or(1);
  p.sequence_parallel = r.on(n(kSequenceParallel));
  p.cp = r.integer(n(kContextParallelSize)).value_or(1);
  const std::string cp_name = n(kCpCommType);
  if (auto type = r.text(cp_name)) p.cp_algorithm = cp_algorithm(*type, r, cp_name);
  p.ep = r.integer(n(kExpertModelParallelSize)).value_or(1);
  // Interleaving: layers per virtual stage (the flag) or chunks per rank (NeMo's field).
  if (!n.nemo) {
    if (auto per = r.integer("--num-layers-per-virtual-pipeline-stage")) {
      p.schedule = spec::Schedule::kInterleaved;
      p.virtual_stages = layers / (p.pp * *per);
      if (p.virtual_stages < 1 || layers % (p.pp * *per) != 0)
        r.problem("--num-layers-per-virtual-pipeline-stage", std::to_string(*per),
                  fmt::format("a divisor of the {} layers per pipeline stage", layers / p.pp));
    }
  } else if (auto v = r.integer("trainer.strategy.virtual_pipeline_model_parallel_size");
             v && *v > 1) {
    p.schedule = spec::Schedule::kInterleaved;
    p.virtual_stages = *v;
  }
  auto first = r.integer(n(kDecoderFirstPipelineNumLayers));
  auto last = r.integer(n(kDecoderLastPipelineNumLayers));
  if ((first || last) && p.pp > layers) {
    r.problem(n(kPipelineModelParallelSize), std::to_string(p.pp),
              fmt::format("at most the model's {} layers", layers));
  } else if ((first || last) && p.pp > 2) {
    // The middle stages share what the first and last leave evenly.
    const int64_t a = first.value_or(0), b = last.value_or(0);
    const int64_t middle = (layers - a - b) / (p.pp - 2);
    p.stage_layers.assign(static_cast<size_t>(p.pp), middle);
    p.stage_layers.front() = a;
    p.stage_layers.back() = b;
  } else if (first || last) {
    p.stage_layers = {first.value_or(layers - last.value_or(0)),
                      last.value_or(layers - first.value_or(0))};
  }
}

void read_state(SettingsReader& r, const Names& n, spec::Plan& p) {
  if (r.on(n(kUseDistributedOptimizer))) p.zero = 1;
  const bool fsdp = n.nemo
                        ? r.text("trainer.strategy.fsdp") == std::optional<std::string>("megatron")
                        : r.on("--use-megatron-fsdp");
  if (!n.nemo) r.has("--ckpt-format");  // (fsdp_dtensor with Megatron-FSDP: read, no plan field)
  const std::string strategy_name = n(kDataParallelShardingStrategy);
  if (auto strategy = r.text(strategy_name); fsdp && strategy) {
    if (*strategy == "optim_grads")
      p.zero = 2;
    else if (*strategy == "optim_grads_params")
      p.zero = 3;
    else if (*strategy == "optim")
      p.zero = 1;
  }
  if (r.on(n(kOptimizerCpuOffload))) p.offload.optimizer = spec::OffloadTarget::kHost;
  r.has(n(kUsePrecisionAwareOptimizer));
  r.has(n(kOverlapCpuOptimizerD2hH2d));
  if (n.nemo && r.on("model.config.cpu_offloading")) {
    p.offload.activations = spec::OffloadTarget::kHost;
    p.offload.activation_layers = r.integer("model.config.cpu_offloading_num_layers").value_or(0);
    r.has("model.config.cpu_offloading_weights");
  }
  const std::string granularity = n(kRecomputeGranularity);
  if (auto g = r.text(granularity)) {
    if (*g == "selective") {
      p.recompute = spec::Recompute::kSelective;
    } else if (*g == "full") {
      p.recompute = spec::Recompute::kFull;
      const auto method = r.text(n(kRecomputeMethod));
      const auto count = r.integer(n(kRecomputeNumLayers));
      // Uniform chunks of one layer recompute every layer; the block method the first N.
      if (method == std::optional<std::string>("block") && count)
        p.recompute_layers = *count;
      else if (count.value_or(1) != 1)
        r.problem(n(kRecomputeNumLayers), std::to_string(*count),
                  "1 with the uniform method (chunks of several layers are not modelled)");
    } else {
      r.problem(granularity, *g, "full or selective");
    }
  }
}

spec::Dtype read_precision(SettingsReader& r, const Names& n) {
  if (n.nemo) {
    // (A recipe without a plugin override keeps its own: bf16_mixed in NeMo's LLM recipes.)
    const auto plugin = r.text("trainer.plugins");
    if (r.text("trainer.plugins.fp8")) return spec::Dtype::kFp8;
    return plugin == std::optional<std::string>("fp16_mixed") ? spec::Dtype::kFp16
                                                              : spec::Dtype::kBf16;
  }
  if (r.text("--fp8-format")) return spec::Dtype::kFp8;
  if (r.on("--bf16")) return spec::Dtype::kBf16;
  if (r.on("--fp16")) return spec::Dtype::kFp16;
  return spec::Dtype::kFp32;
}

void read_stack(SettingsReader& r, const Names& n, spec::Plan& p, spec::Stack& s,
                spec::Dtype compute) {
  if (p.replicas() > 1) s.dp_overlap = r.on(n(kOverlapGradReduce));
  if (p.replicas() > 1 && (p.zero == 1 || p.zero == 2))
    s.param_gather_overlap = r.on(n(kOverlapParamGather));
  if (auto bucket = r.integer(n(kDdpBucketSize), 1, kMaxBucket))
    s.dp_bucket_bytes = *bucket * spec::dtype_bytes(spec::gradient_dtype(s, compute));
  if (p.tp > 1 && p.sequence_parallel && !n.nemo && !r.on("--tp-comm-overlap"))
    s.tp_overlap = spec::TpOverlap::kNone;
  if (p.schedule == spec::Schedule::kInterleaved) {
    if (n.nemo) {
      if (r.has("model.config.overlap_p2p_comm"))
        s.pp_overlap = r.on("model.config.overlap_p2p_comm");
    } else {
      s.pp_overlap = !r.on("--no-overlap-p2p-communication");
    }
  }
}

}  // namespace

spec::Plan megatron_plan(SettingsReader& r, const spec::ModelSpec& model,
                         std::optional<int64_t> gpus, bool nemo, Target target) {
  const Names n{nemo};
  const int64_t layers = model.transformer().layers;
  spec::Plan p;
  read_layout(r, n, layers, p);
  read_state(r, n, p);
  const spec::Dtype compute = read_precision(r, n);
  p.dtype = compute;
  p.micro_batch = r.integer(n(kMicroBatchSize)).value_or(1);
  p.global_batch = r.integer(n(kGlobalBatchSize)).value_or(0);
  if (auto seq = r.integer(n(kSeqLength)); seq && *seq != model.transformer().seq_len)
    p.seq_len = *seq;
  // The data-parallel replicas are the launcher's: what the GPUs leave of tp x pp x cp.
  p.dp = data_parallel_from(gpus, rank_product(p.tp, p.pp, p.cp), r);
  if (!gpus)
    r.problem("--gpus", "", "the devices the job is launched on (Megatron derives dp from them)");
  if (p.global_batch == 0)
    p.global_batch = p.micro_batch * std::max<int64_t>(p.dp, 1);  // Megatron's default
  spec::Stack stack = spec::builtin_stack(target_preset(target));
  read_stack(r, n, p, stack, compute);
  p.stack = stack;
  // The architecture flags describe the model given (checked, not a plan field).
  if (!nemo) {
    for (const auto& [flag, value] :
         {std::pair{"--num-layers", model.transformer().layers},
          std::pair{"--hidden-size", model.transformer().hidden},
          std::pair{"--num-attention-heads", model.transformer().heads},
          std::pair{"--ffn-hidden-size", model.transformer().ffn_hidden},
          std::pair{"--num-query-groups", model.transformer().kv_heads}})
      if (auto v = r.integer(flag); v && *v != value)
        r.problem(flag, std::to_string(*v),
                  fmt::format("{} as the model {} has it", value, model.name));
  }
  return p;
}

}  // namespace sextant::interop::detail
