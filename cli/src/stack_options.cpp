// Stack flags to a Stack, through the same decoder as a plan's "stack" object.
#include "stack_options.hpp"

namespace sextant::cli {

void add_stack_flags(CLI::App& cmd, StackFlags& f) {
  std::vector<std::string> names = spec::builtin_stack_names();
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  cmd.add_option("--stack", f.stack,
                 "Software stack: a preset (" + list +
                     ") or a sextant.stack/1 file (default: megatron-core on GPU clusters, "
                     "sextant on CPU clusters)");
  cmd.add_option("--attention", f.attention,
                 "Override the stack's attention kernel: unfused, flash2, flash3, cudnn, sdpa");
  cmd.add_option("--fusion", f.fusion, "Override the stack's fusion: eager, fused, compiled");
  cmd.add_option("--cross-entropy", f.cross_entropy,
                 "Override the stack's loss kernel: eager, megatron, fused, compiled");
  cmd.add_option("--tp-overlap", f.tp_overlap,
                 "Override the stack's TP communication overlap: none, bulk, pipelined");
  cmd.add_option("--zero3-impl", f.zero3, "Override the stack's ZeRO-3: fsdp or deepspeed");
  cmd.add_option("--grad-dtype", f.grad_dtype,
                 "Override the dtype gradients are reduced in: compute, fp32, bf16, fp16");
  cmd.add_flag("--no-overlap", f.no_overlap, "Reduce gradients after backward, not during it");
  cmd.add_option("--bucket-mb", f.bucket_mb, "Gradient bucket size in MiB")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
}

namespace {

// A flag's value checked against the knob's names, so that the error names the flag.
template <typename E>
void check_choice(const std::string& flag, const std::string& value, spec::EnumNames<E> names,
                  std::string_view extra = {}) {
  if (value.empty() || spec::enum_from_name(names, value) || value == extra) return;
  std::string choices = spec::enum_choices(names);
  if (!extra.empty()) choices = std::string(extra) + ", " + choices;
  throw InputError("command line", flag, value, "must be one of " + choices);
}

}  // namespace

std::optional<spec::Stack> stack_from_flags(const StackFlags& f,
                                            const std::optional<spec::Stack>& base,
                                            bool gpu_cluster, spec::ModelKind model) {
  check_choice("--attention", f.attention, spec::attention_kernel_names());
  check_choice("--fusion", f.fusion, spec::fusion_names());
  check_choice("--cross-entropy", f.cross_entropy, spec::cross_entropy_names());
  check_choice("--tp-overlap", f.tp_overlap, spec::tp_overlap_names());
  check_choice("--zero3-impl", f.zero3, spec::zero3_impl_names());
  check_choice("--grad-dtype", f.grad_dtype, spec::dtype_names(), "compute");
  spec::Json knobs = spec::Json::object();
  if (!f.attention.empty()) knobs["attention"] = f.attention;
  if (!f.fusion.empty()) knobs["fusion"] = f.fusion;
  if (!f.cross_entropy.empty()) knobs["cross_entropy"] = f.cross_entropy;
  if (!f.tp_overlap.empty()) knobs["tp_overlap"] = f.tp_overlap;
  if (!f.zero3.empty()) knobs["zero3"] = f.zero3;
  if (!f.grad_dtype.empty()) knobs["grad_dtype"] = f.grad_dtype;
  if (f.no_overlap) knobs["dp_overlap"] = false;
  if (f.bucket_mb > 0) knobs["dp_bucket_bytes"] = f.bucket_mb << 20;
  if (f.stack.empty() && knobs.empty()) return std::nullopt;
  spec::Stack start = !f.stack.empty() ? spec::resolve_stack_preset(f.stack)
                      : base           ? *base
                             : spec::builtin_stack(spec::default_stack_name(gpu_cluster, model));
  return spec::stack_with_overrides(start, knobs, "command line", "");
}

void apply_stack_flags(const StackFlags& flags, spec::Plan& plan, bool gpu_cluster,
                       spec::ModelKind model) {
  if (auto s = stack_from_flags(flags, plan.stack, gpu_cluster, model)) plan.stack = std::move(*s);
}

}  // namespace sextant::cli
