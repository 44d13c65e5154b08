// A plan as the training stacks people use take it: Megatron-LM's pretrain_gpt.py arguments,
// NeMo 2.0 recipe overrides, TorchTitan's TOML job config and DeepSpeed's JSON config. Each
// name and value domain written is one recorded in stacks/flags/*.json from the stack's own
// source at a named commit (flag_facts.hpp; the tests check every exported setting against it).
// What the target cannot express is refused, naming it: first what its software cannot run
// (spec::stack_support_problems with the target's preset), then what its flags cannot say.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sextant/spec/json_reader.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/stack.hpp"

namespace sextant::interop {

enum class Target { kMegatronCore, kMegatronLm, kNemo, kTorchtitan, kDeepspeed };
spec::EnumNames<Target> target_names();
// The stack preset whose "supports" says what the target's software runs.
std::string_view target_preset(Target target);
// The facts file (stacks/flags/NAME.json) that records the target's names.
std::string_view target_facts(Target target);

// One flag or field: its name as the stack spells it ("--tensor-model-parallel-size",
// "parallelism.tensor_parallel_degree", "zero_optimization.stage",
// "trainer.strategy.tensor_model_parallel_size") and its value (true alone: a bare flag).
struct Setting {
  std::string name;
  spec::Json value;
};

struct Exported {
  Target target;
  std::vector<Setting> settings;   // in the order written
  std::string text;                // the file or command-line fragment
  std::vector<std::string> notes;  // what the user still does (launch size, tokenizer, ...)
};

// A short measured run of the plan (`sextant launch --steps`, `sextant tune`): the run's length,
// a step line every step (what the log readers of training_log.hpp read) and synthetic data where
// the stack makes it (Megatron's --mock-data). Where the stack's steps or data are the training
// script's own (DeepSpeed), a note says so.
struct Trial {
  int64_t steps = 0;
};

// `plan` (already valid for `model`) for `target`, `stack` being the plan's stack (its overlap
// and bucket knobs are written where the target has flags for them) and `compute` its compute
// dtype. Throws InputError (source "--to") naming each feature the target cannot run or express.
Exported export_plan(const spec::Plan& plan, const spec::ModelSpec& model, const spec::Stack& stack,
                     spec::Dtype compute, Target target, std::optional<Trial> trial = std::nullopt);

}  // namespace sextant::interop
