// Stack JSON (preset files and a plan's "stack" value) and the shipped presets.
#include "sextant/spec/stack.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <span>

#include "sextant/spec/embedded_file.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/stack_support.hpp"

namespace sextant::spec {

std::span<const EmbeddedFile> embedded_stacks();  // generated from stacks/*.json

namespace {
constexpr std::array<std::pair<std::string_view, AttentionKernel>, 5> kAttention{
    {{"unfused", AttentionKernel::kUnfused},
     {"flash2", AttentionKernel::kFlash2},
     {"flash3", AttentionKernel::kFlash3},
     {"cudnn", AttentionKernel::kCudnn},
     {"sdpa", AttentionKernel::kSdpa}}};
constexpr std::array<std::pair<std::string_view, Fusion>, 3> kFusion{
    {{"eager", Fusion::kEager}, {"fused", Fusion::kFused}, {"compiled", Fusion::kCompiled}}};
constexpr std::array<std::pair<std::string_view, CrossEntropy>, 4> kCrossEntropy{
    {{"eager", CrossEntropy::kEager},
     {"megatron", CrossEntropy::kMegatron},
     {"fused", CrossEntropy::kFused},
     {"compiled", CrossEntropy::kCompiled}}};
constexpr std::array<std::pair<std::string_view, TpOverlap>, 3> kTpOverlap{
    {{"none", TpOverlap::kNone}, {"bulk", TpOverlap::kBulk}, {"pipelined", TpOverlap::kPipelined}}};
constexpr std::array<std::pair<std::string_view, Zero3Impl>, 2> kZero3{
    {{"fsdp", Zero3Impl::kFsdp}, {"deepspeed", Zero3Impl::kDeepspeed}}};
constexpr std::array<std::pair<std::string_view, Zero2Impl>, 2> kZero2{
    {{"deepspeed", Zero2Impl::kDeepspeed}, {"fsdp", Zero2Impl::kFsdp}}};
constexpr std::array<std::pair<std::string_view, SelectiveRecompute>, 2> kSelectiveRecompute{
    {{"attention_core", SelectiveRecompute::kAttentionCore},
     {"save_matmuls", SelectiveRecompute::kSaveMatmuls}}};
constexpr std::array<std::pair<std::string_view, ReshardAfterForward>, 5> kReshard{
    {{"all", ReshardAfterForward::kAll},
     {"blocks", ReshardAfterForward::kBlocks},
     {"blocks_but_last", ReshardAfterForward::kBlocksButLast},
     {"all_but_head", ReshardAfterForward::kAllButHead},
     {"none", ReshardAfterForward::kNone}}};
constexpr std::array<std::pair<std::string_view, Projections>, 2> kProjections{
    {{"fused", Projections::kFused}, {"separate", Projections::kSeparate}}};
constexpr std::array<std::pair<std::string_view, RopeKernel>, 2> kRope{
    {{"rotate_half", RopeKernel::kRotateHalf}, {"complex", RopeKernel::kComplex}}};
constexpr std::array<std::pair<std::string_view, GqaKv>, 2> kGqaKv{
    {{"native", GqaKv::kNative}, {"repeat", GqaKv::kRepeat}}};
constexpr std::array<std::pair<std::string_view, EmbeddingBackward>, 2> kEmbeddingBackward{
    {{"scatter", EmbeddingBackward::kScatter}, {"sorted", EmbeddingBackward::kSorted}}};
constexpr std::array<std::pair<std::string_view, ActivationLayout>, 2> kActivationLayout{
    {{"bshd", ActivationLayout::kBshd}, {"sbhd", ActivationLayout::kSbhd}}};
constexpr std::array<std::string_view, 30> kKnobs{"attention",
                                                  "fusion",
                                                  "cross_entropy",
                                                  "tp_overlap",
                                                  "dp_overlap",
                                                  "param_gather_overlap",
                                                  "pp_overlap",
                                                  "dp_bucket_bytes",
                                                  "zero3",
                                                  "zero2",
                                                  "zero3_prefetch",
                                                  "precision",
                                                  "grad_dtype",
                                                  "autocast",
                                                  "allocator_reserve",
                                                  "vocab_multiple",
                                                  "dropout",
                                                  "selective_recompute",
                                                  "fused_rms_norm",
                                                  "grad_clip",
                                                  "bias_grad_kernel",
                                                  "grad_copy_in",
                                                  "param_copy_out",
                                                  "reshard_after_forward",
                                                  "projections",
                                                  "rope",
                                                  "gqa_kv",
                                                  "embedding_backward",
                                                  "activation_layout",
                                                  "host_launch_us"};

// "auto" / "compute" stand for "no dtype of its own" in the JSON form of the optional dtypes.
std::optional<Dtype> read_optional_dtype(ObjectReader& r, std::string_view key,
                                         std::string_view none_word, Presence presence,
                                         bool* present) {
  *present = false;
  std::optional<std::string> text = r.string(key, presence);
  if (!text) return std::nullopt;
  *present = true;
  if (*text == none_word) return std::nullopt;
  if (auto d = enum_from_name(dtype_names(), *text)) return d;
  r.problem(key, short_dump(Json(*text)),
            fmt::format("must be \"{}\" or one of {}", none_word, enum_choices(dtype_names())));
  return std::nullopt;
}

// Reads the knobs present in `r` into `s` (all of them required when `presence` says so).
void read_knobs(ObjectReader& r, Stack& s, Presence presence) {
  if (auto v = r.enumeration("attention", attention_kernel_names(), presence)) s.attention = *v;
  if (auto v = r.enumeration("fusion", fusion_names(), presence)) s.fusion = *v;
  // Stack files written before the knob existed name no cross-entropy: theirs is the one the
  // fusion level implies (what the lowering assumed then).
  if (auto v = r.enumeration("cross_entropy", cross_entropy_names(), Presence::kOptional)) {
    s.cross_entropy = *v;
  } else if (presence == Presence::kRequired) {
    s.cross_entropy = default_cross_entropy(s.fusion);
  }
  // Likewise fused_rms_norm: older stack files lowered an eager RMSNorm as elementwise ops.
  if (auto v = r.boolean("fused_rms_norm", Presence::kOptional)) {
    s.fused_rms_norm = *v;
  } else if (presence == Presence::kRequired) {
    s.fused_rms_norm = s.fusion != Fusion::kEager;
  }
  if (auto v = r.enumeration("tp_overlap", tp_overlap_names(), presence)) s.tp_overlap = *v;
  if (auto v = r.boolean("dp_overlap", presence)) s.dp_overlap = *v;
  if (auto v = r.boolean("param_gather_overlap", presence)) s.param_gather_overlap = *v;
  if (auto v = r.boolean("pp_overlap", presence)) s.pp_overlap = *v;
  if (auto v = r.integer("dp_bucket_bytes", Range::at_least(1), presence)) s.dp_bucket_bytes = *v;
  if (auto v = r.enumeration("zero3", zero3_impl_names(), presence)) s.zero3 = *v;
  if (auto v = r.enumeration("zero2", zero2_impl_names(), Presence::kOptional)) s.zero2 = *v;
  if (auto v = r.integer("zero3_prefetch", Range::between(0, 64), presence)) s.zero3_prefetch = *v;
  bool present = false;
  std::optional<Dtype> precision = read_optional_dtype(r, "precision", "auto", presence, &present);
  if (present) s.precision = precision;
  std::optional<Dtype> grad = read_optional_dtype(r, "grad_dtype", "compute", presence, &present);
  if (present) s.grad_dtype = grad;
  if (auto v = r.boolean("autocast", presence)) s.autocast = *v;
  if (auto v = r.number("allocator_reserve", Range::between(0, 1), presence))
    s.allocator_reserve = *v;
  // Optional even in presets: stacks written before the knob existed padded nothing.
  if (auto v = r.integer("vocab_multiple", Range::between(1, 1 << 20), Presence::kOptional))
    s.vocab_multiple = *v;
  if (auto v = r.boolean("dropout", Presence::kOptional)) s.dropout = *v;
  if (auto v = r.boolean("grad_clip", Presence::kOptional)) s.grad_clip = *v;
  if (auto v = r.boolean("bias_grad_kernel", Presence::kOptional)) s.bias_grad_kernel = *v;
  if (auto v = r.boolean("grad_copy_in", Presence::kOptional)) s.grad_copy_in = *v;
  if (auto v = r.boolean("param_copy_out", Presence::kOptional)) s.param_copy_out = *v;
  if (auto v = r.enumeration("reshard_after_forward", reshard_after_forward_names(),
                             Presence::kOptional))
    s.reshard_after_forward = *v;
  // Optional even in presets: stacks written before the knob existed ran Megatron's policy.
  if (auto v =
          r.enumeration("selective_recompute", selective_recompute_names(), Presence::kOptional))
    s.selective_recompute = *v;
  // Optional even in presets: stacks written before the knobs ran Megatron's model code.
  if (auto v = r.enumeration("projections", projections_names(), Presence::kOptional))
    s.code.projections = *v;
  if (auto v = r.enumeration("rope", rope_kernel_names(), Presence::kOptional)) s.code.rope = *v;
  if (auto v = r.enumeration("gqa_kv", gqa_kv_names(), Presence::kOptional)) s.code.gqa_kv = *v;
  if (auto v = r.enumeration("embedding_backward", embedding_backward_names(), Presence::kOptional))
    s.code.embedding_backward = *v;
  // ... and, as the model priced them, no transposes around the attention kernel: batch-major.
  if (auto v = r.enumeration("activation_layout", activation_layout_names(), Presence::kOptional))
    s.code.layout = *v;
  // Optional even in presets: stacks written before the knob modelled no host.
  if (auto launch = r.object("host_launch_us", Presence::kOptional)) {
    const Range us = Range::between(0, 1e6);
    if (auto v = launch->number("forward", us, presence)) s.host_launch_us.forward_us = *v;
    if (auto v = launch->number("backward", us, presence)) s.host_launch_us.backward_us = *v;
    launch->finish();
  }
}

constexpr std::array<std::string_view, 5> kTunable{
    "tp_overlap", "dp_overlap", "param_gather_overlap", "pp_overlap", "dp_bucket_bytes"};

// A preset's "tunable" list: knob names from kTunable, each once.
void read_tunable(ObjectReader& r, Stack& s) {
  const Json* list = r.array("tunable", Presence::kOptional);
  if (list == nullptr) return;
  for (const Json& item : *list) {
    const std::string name = item.is_string() ? item.get<std::string>() : "";
    const bool known = std::find(kTunable.begin(), kTunable.end(), name) != kTunable.end();
    if (!known || std::find(s.tunable.begin(), s.tunable.end(), name) != s.tunable.end()) {
      r.problem("tunable", short_dump(item), "each entry once, one of " + join_names(kTunable));
      continue;
    }
    s.tunable.push_back(name);
  }
}

void read_sources(ObjectReader& r, Stack& s) {
  if (auto src = r.object("sources", Presence::kOptional)) {
    for (std::string_view knob : kKnobs)
      if (auto text = src->string(knob, Presence::kOptional)) s.sources[std::string(knob)] = *text;
    if (auto text = src->string("tunable", Presence::kOptional)) s.sources["tunable"] = *text;
    src->finish();  // anything else is not a knob
  }
}

Stack preset_from_text(const EmbeddedFile& f) {
  std::string source = "stacks/" + std::string(f.name) + ".json";
  return stack_from_json(parse_json_text(f.text, source), source);
}

}  // namespace

EnumNames<AttentionKernel> attention_kernel_names() {
  return kAttention;
}
EnumNames<Projections> projections_names() {
  return kProjections;
}
EnumNames<RopeKernel> rope_kernel_names() {
  return kRope;
}
EnumNames<GqaKv> gqa_kv_names() {
  return kGqaKv;
}
EnumNames<EmbeddingBackward> embedding_backward_names() {
  return kEmbeddingBackward;
}
EnumNames<ActivationLayout> activation_layout_names() {
  return kActivationLayout;
}
EnumNames<SelectiveRecompute> selective_recompute_names() {
  return kSelectiveRecompute;
}
EnumNames<Fusion> fusion_names() {
  return kFusion;
}
EnumNames<CrossEntropy> cross_entropy_names() {
  return kCrossEntropy;
}
CrossEntropy default_cross_entropy(Fusion fusion) {
  switch (fusion) {
    case Fusion::kEager:
      return CrossEntropy::kEager;
    case Fusion::kCompiled:
      return CrossEntropy::kCompiled;
    case Fusion::kFused:
      break;
  }
  return CrossEntropy::kFused;
}
EnumNames<TpOverlap> tp_overlap_names() {
  return kTpOverlap;
}
EnumNames<Zero3Impl> zero3_impl_names() {
  return kZero3;
}
EnumNames<Zero2Impl> zero2_impl_names() {
  return kZero2;
}
EnumNames<ReshardAfterForward> reshard_after_forward_names() {
  return kReshard;
}

bool regathers_for_backward(ReshardAfterForward policy, ShardUnit unit, bool pipelined) {
  switch (policy) {
    case ReshardAfterForward::kAll:
      return true;
    case ReshardAfterForward::kBlocks:
      // FSDP1 _runtime_utils.py _post_forward_reshard ("Do not free the root's parameters in
      // the post-forward"); FSDP2's fully_shard sets the root's reshard_after_forward to False.
      return unit == ShardUnit::kBlock || unit == ShardUnit::kLastBlock;
    case ReshardAfterForward::kBlocksButLast:
      return unit == ShardUnit::kBlock;
    case ReshardAfterForward::kAllButHead:
      // torchtitan/models/llama3/infra/parallelize.py apply_fsdp: reshard_after_forward = not
      // pp_enabled; [model.norm, model.output] only under the "always" policy.
      return !pipelined && unit != ShardUnit::kHead;
    case ReshardAfterForward::kNone:
      return false;
  }
  return true;
}

bool is_fused_attention(AttentionKernel kernel) {
  return kernel != AttentionKernel::kUnfused;
}

std::vector<std::string_view> tunable_knob_names() {
  return {kTunable.begin(), kTunable.end()};
}

bool is_tunable(const Stack& stack, std::string_view knob) {
  return std::find(stack.tunable.begin(), stack.tunable.end(), knob) != stack.tunable.end();
}

std::vector<std::string_view> stack_knob_names() {
  return {kKnobs.begin(), kKnobs.end()};
}

Stack stack_from_json(const Json& json, const std::string& source) {
  Diagnostics diag(source);
  ObjectReader r(json, "", diag);
  if (!r.is_object()) diag.throw_if_any();
  Stack s;
  r.expect_schema(kStackSchema);
  s.preset = r.string("name").value_or("");
  s.description = r.string("description", Presence::kOptional).value_or("");
  read_knobs(r, s, Presence::kRequired);
  // What the software runs (stack_support.hpp reads it; checked here so a bad file says so).
  if (const Json* supports = r.value("supports", Presence::kOptional))
    stack_support_from_json(*supports, source, "/supports");
  read_tunable(r, s);
  read_sources(r, s);
  r.finish();
  diag.throw_if_any();
  return s;
}

Stack stack_from_plan_json(const Json& json, const std::string& source,
                           const std::string& pointer) {
  if (json.is_string()) {
    std::string name = json.get<std::string>();
    std::vector<std::string> names = builtin_stack_names();
    for (const std::string& n : names)
      if (n == name) return builtin_stack(name, source);
    std::vector<std::string_view> views(names.begin(), names.end());
    throw InputError(source, pointer, short_dump(json),
                     "unknown stack preset" + did_you_mean(name, views) + ": must be one of " +
                         join_names(views) + " (or an object with knobs)");
  }
  Diagnostics diag(source);
  ObjectReader r(json, pointer, diag);
  if (!r.is_object()) {
    diag.add(pointer, short_dump(json), "must be a preset name or an object");
    diag.throw_if_any();
  }
  Stack s;
  Presence presence = Presence::kRequired;
  if (auto name = r.string("preset", Presence::kOptional)) {
    std::vector<std::string> names = builtin_stack_names();
    bool known = false;
    for (const std::string& n : names) known = known || n == *name;
    if (known) {
      s = builtin_stack(*name, source);
      presence = Presence::kOptional;
    } else {
      // A stack of the user's own (written from a stack file) carries every knob; a name alone
      // is a misspelt preset.
      bool has_knob = false;
      for (std::string_view k : kKnobs) has_knob = has_knob || r.has(k);
      if (!has_knob) {
        std::vector<std::string_view> views(names.begin(), names.end());
        r.problem("preset", short_dump(Json(*name)), "must be one of " + join_names(views));
      }
      s.preset = *name;
    }
  }
  r.string("description", Presence::kOptional);
  r.value("sources", Presence::kOptional);  // carried by written plans, informational here
  read_knobs(r, s, presence);
  r.finish();
  diag.throw_if_any();
  return s;
}

Stack stack_with_overrides(const Stack& base, const Json& knobs, const std::string& source,
                           const std::string& pointer) {
  Diagnostics diag(source);
  ObjectReader r(knobs, pointer, diag);
  Stack s = base;
  read_knobs(r, s, Presence::kOptional);
  r.finish();
  diag.throw_if_any();
  return s;
}

Json stack_file_json(const Stack& s) {
  Json j = {{"schema", kStackSchema}, {"name", s.preset}};
  if (!s.description.empty()) j["description"] = s.description;
  Json knobs = to_json(s);
  knobs.erase("preset");
  j.update(knobs);
  if (const StackSupport* support = stack_support(s)) j["supports"] = to_json(*support);
  j["tunable"] = s.tunable;
  if (!s.sources.empty()) j["sources"] = s.sources;
  return j;
}

std::string stack_label(const Stack& s) {
  if (s.preset.empty()) return "custom";
  for (const std::string& n : builtin_stack_names()) {
    if (n == s.preset) {
      Stack preset = builtin_stack(n);
      preset.sources = s.sources;
      preset.description = s.description;
      return preset == s ? s.preset : s.preset + " (modified)";
    }
  }
  return s.preset;
}

Json to_json(const Stack& s) {
  Json j = Json::object();
  if (!s.preset.empty()) j["preset"] = s.preset;
  j["attention"] = enum_name(attention_kernel_names(), s.attention);
  j["fusion"] = enum_name(fusion_names(), s.fusion);
  j["cross_entropy"] = enum_name(cross_entropy_names(), s.cross_entropy);
  j["tp_overlap"] = enum_name(tp_overlap_names(), s.tp_overlap);
  j["dp_overlap"] = s.dp_overlap;
  j["param_gather_overlap"] = s.param_gather_overlap;
  j["pp_overlap"] = s.pp_overlap;
  j["dp_bucket_bytes"] = s.dp_bucket_bytes;
  j["zero3"] = enum_name(zero3_impl_names(), s.zero3);
  j["zero2"] = enum_name(zero2_impl_names(), s.zero2);
  j["zero3_prefetch"] = s.zero3_prefetch;
  j["precision"] = s.precision ? enum_name(dtype_names(), *s.precision) : "auto";
  j["grad_dtype"] = s.grad_dtype ? enum_name(dtype_names(), *s.grad_dtype) : "compute";
  j["autocast"] = s.autocast;
  j["allocator_reserve"] = s.allocator_reserve;
  j["vocab_multiple"] = s.vocab_multiple;
  j["dropout"] = s.dropout;
  j["selective_recompute"] = enum_name(selective_recompute_names(), s.selective_recompute);
  j["fused_rms_norm"] = s.fused_rms_norm;
  j["grad_clip"] = s.grad_clip;
  j["bias_grad_kernel"] = s.bias_grad_kernel;
  j["grad_copy_in"] = s.grad_copy_in;
  j["param_copy_out"] = s.param_copy_out;
  j["reshard_after_forward"] = enum_name(reshard_after_forward_names(), s.reshard_after_forward);
  j["projections"] = enum_name(projections_names(), s.code.projections);
  j["rope"] = enum_name(rope_kernel_names(), s.code.rope);
  j["gqa_kv"] = enum_name(gqa_kv_names(), s.code.gqa_kv);
  j["embedding_backward"] = enum_name(embedding_backward_names(), s.code.embedding_backward);
  j["activation_layout"] = enum_name(activation_layout_names(), s.code.layout);
  j["host_launch_us"] = {{"forward", s.host_launch_us.forward_us},
                         {"backward", s.host_launch_us.backward_us}};
  return j;
}

std::vector<std::string> builtin_stack_names() {
  std::vector<std::string> names;
  for (const EmbeddedFile& f : embedded_stacks()) names.emplace_back(f.name);
  return names;
}

Stack builtin_stack(std::string_view name, const std::string& source) {
  for (const EmbeddedFile& f : embedded_stacks())
    if (f.name == name) return preset_from_text(f);
  std::vector<std::string_view> names;
  for (const EmbeddedFile& f : embedded_stacks()) names.push_back(f.name);
  throw InputError(source, "", std::string(name),
                   "unknown stack preset" + did_you_mean(name, names) +
                       ": give a stack file or one of " + join_names(names));
}

Stack resolve_stack_preset(const std::string& name_or_path) {
  std::filesystem::path path(name_or_path);
  if (path.extension() == ".json" || name_or_path.find('/') != std::string::npos) {
    return stack_from_json(read_json_file(name_or_path), name_or_path);
  }
  return builtin_stack(name_or_path);
}

Dtype gradient_dtype(const Stack& stack, Dtype compute) {
  if (stack.grad_dtype) return *stack.grad_dtype;
  return stack.autocast ? Dtype::kFp32 : compute;
}

Dtype parameter_dtype(const Stack& stack, Dtype compute) {
  return stack.autocast ? Dtype::kFp32 : compute;
}

std::string_view default_stack_name(bool gpu_cluster, ModelKind model) {
  if (!gpu_cluster) return kExecutorStack;
  return model == ModelKind::kTransformer ? "megatron-core" : "pytorch-ddp";
}

}  // namespace sextant::spec
