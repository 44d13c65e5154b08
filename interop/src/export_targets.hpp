// The per-target halves of export_plan: each turns a plan into its stack's settings, adding to
// `refused` what the stack's flags cannot say, and to `notes` what the user still does.
#pragma once

#include <string>
#include <vector>

#include "sextant/interop/export.hpp"

namespace sextant::interop::detail {

struct ExportInput {
  const spec::Plan& plan;
  const spec::ModelSpec& model;
  const spec::Stack& stack;
  spec::Dtype compute;
  std::optional<Trial> trial;
};

struct ExportOutput {
  std::vector<Setting> settings;
  std::vector<std::string> refused;  // "what: why", one per feature the target cannot express
  std::vector<std::string> notes;
  void set(std::string name, spec::Json value) {
    settings.push_back({std::move(name), std::move(value)});
  }
};

// The tokens of each sequence (the plan's override, else the model's).
int64_t sequence_length(const ExportInput& in);
// Whether the plan's (virtual) stages hold equal layer counts.
bool even_stages(const ExportInput& in);
// The gradient bucket in elements of the stack's gradient dtype (Megatron's --ddp-bucket-size,
// DeepSpeed's reduce_bucket_size count elements, the stack knob bytes).
int64_t bucket_elements(const ExportInput& in);

// Megatron-LM's pretrain_gpt.py arguments (nemo = false) or NeMo 2.0's recipe overrides of the
// same Megatron-Core settings (nemo = true).
void megatron_settings(const ExportInput& in, bool nemo, ExportOutput& out);
void torchtitan_settings(const ExportInput& in, ExportOutput& out);
void deepspeed_settings(const ExportInput& in, ExportOutput& out);

}  // namespace sextant::interop::detail
