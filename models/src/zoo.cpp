// Zoo lookup over the JSON files embedded at build time (cmake/SextantEmbed.cmake).
#include "sextant/models/zoo.hpp"

#include <filesystem>
#include <span>

#include "sextant/models/hf_import.hpp"
#include "sextant/spec/embedded_file.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::models {

std::span<const spec::EmbeddedFile> embedded_zoo();  // generated

std::vector<std::string> zoo_names() {
  std::vector<std::string> names;
  for (const spec::EmbeddedFile& f : embedded_zoo()) names.emplace_back(f.name);
  return names;
}

spec::ModelSpec zoo_model(std::string_view name) {
  for (const spec::EmbeddedFile& f : embedded_zoo()) {
    if (f.name == name) {
      std::string source = "models/zoo/" + std::string(name) + ".json";
      return spec::model_from_json(spec::parse_json_text(f.text, source), source);
    }
  }
  std::vector<std::string_view> names;
  for (const spec::EmbeddedFile& f : embedded_zoo()) names.push_back(f.name);
  throw InputError("--model", "", std::string(name),
                   "unknown model" + spec::did_you_mean(name, names) +
                       ": give a model file or one of " + spec::join_names(names));
}

spec::ModelSpec resolve_model(const std::string& name_or_path) {
  std::filesystem::path path(name_or_path);
  bool looks_like_file = path.extension() == ".json" || name_or_path.find('/') != std::string::npos;
  if (looks_like_file || std::filesystem::exists(path)) {
    std::string name = path.parent_path().filename().string();
    if (path.stem() != "config" || name.empty()) name = path.stem().string();
    return model_from_document(spec::read_json_file(path), name_or_path, name);
  }
  return zoo_model(name_or_path);
}

spec::ModelSpec model_from_document(const spec::Json& json, const std::string& source,
                                    const std::string& name) {
  if (is_hf_config(json)) return import_hf_config(json, source, name);
  return spec::model_from_json(json, source);
}

}  // namespace sextant::models
