// The model zoo (models/zoo/*.json, compiled into the binary) and model lookup by name or file.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "sextant/spec/model_spec.hpp"

namespace sextant::models {

std::vector<std::string> zoo_names();
// A zoo model by name; throws InputError listing the valid names when unknown.
spec::ModelSpec zoo_model(std::string_view name);
// A zoo name, or a path to a model file (sextant.model/1) or a Hugging Face config.json.
spec::ModelSpec resolve_model(const std::string& name_or_path);
// A parsed model document from `source`: a Hugging Face config (the model named `name`) or a
// Sextant model file.
spec::ModelSpec model_from_document(const spec::Json& json, const std::string& source,
                                    const std::string& name);

}  // namespace sextant::models
