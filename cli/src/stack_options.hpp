// Command-line stack flags shared by `simulate`, `plan`, `scale` and `run`: --stack NAME|FILE and
// single knobs that override it.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "sextant/spec/plan.hpp"
#include "sextant/spec/stack.hpp"

namespace sextant::cli {

struct StackFlags {
  std::string stack;
  std::string attention;
  std::string fusion;
  std::string cross_entropy;
  std::string tp_overlap;
  std::string zero3;
  std::string grad_dtype;
  bool no_overlap = false;
  int64_t bucket_mb = 0;
};

void add_stack_flags(CLI::App& cmd, StackFlags& flags);
// The stack the flags ask for on top of `base` (a plan's own, or none: the cluster kind's
// default), or std::nullopt when no stack flag was given. Throws InputError naming the flag.
std::optional<spec::Stack> stack_from_flags(const StackFlags& flags,
                                            const std::optional<spec::Stack>& base,
                                            bool gpu_cluster,
                                            spec::ModelKind model = spec::ModelKind::kTransformer);
// Applies the flags to `plan.stack`.
void apply_stack_flags(const StackFlags& flags, spec::Plan& plan, bool gpu_cluster,
                       spec::ModelKind model = spec::ModelKind::kTransformer);

}  // namespace sextant::cli
