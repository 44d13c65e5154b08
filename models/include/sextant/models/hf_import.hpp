// Import of a Hugging Face `config.json` (GPT-2, Llama/Mistral-style, BERT families) into a
// ModelSpec. Field names follow transformers' configuration classes.
#pragma once

#include <string>

#include "sextant/spec/model_spec.hpp"

namespace sextant::models {

// True when `json` looks like a Hugging Face config (has "model_type" and no "schema").
bool is_hf_config(const spec::Json& json);
// Converts a config; `name` names the resulting model. Throws InputError naming `source` for
// unsupported model types and missing or invalid fields.
spec::ModelSpec import_hf_config(const spec::Json& json, const std::string& source,
                                 const std::string& name);

}  // namespace sextant::models
