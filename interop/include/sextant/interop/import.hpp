// A training stack's own configuration read back as a plan (the inverse of export.hpp):
// Megatron-LM's pretrain_gpt.py arguments, NeMo-Run recipe overrides (path=value lines),
// TorchTitan's TOML job config and DeepSpeed's JSON config, so that users can predict what they
// already run. Settings that do not shape the plan (learning rate, data paths, logging) are
// listed as ignored, never silently dropped; a value the plan cannot take is an error naming it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sextant/interop/export.hpp"

namespace sextant::interop {

struct Imported {
  spec::Plan plan;                   // with its stack: the target's preset, knobs as set
  std::vector<std::string> ignored;  // names read that do not shape a plan
};

// The settings of a stack's text in its own syntax (arguments, path=value lines, TOML, JSON),
// each a dotted or flag name with its value; `source` names the file in errors.
std::vector<Setting> parse_settings(Target target, const std::string& text,
                                    const std::string& source);

// `text` (from `source`) as a plan for `model` on `gpus` devices (what the stack's config leaves
// to the launcher: Megatron's data parallelism, DeepSpeed's pipeline stages; TorchTitan's and
// DeepSpeed's configs may say it themselves). Throws InputError naming `source` and the setting.
Imported import_plan(Target target, const std::string& text, const std::string& source,
                     const spec::ModelSpec& model, std::optional<int64_t> gpus);

}  // namespace sextant::interop
