// Lookup of the cluster files embedded at build time.
#include "sextant/spec/cluster_catalog.hpp"

#include <filesystem>
#include <span>

#include "sextant/spec/embedded_file.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::spec {

std::span<const EmbeddedFile> embedded_clusters();  // generated

std::vector<std::string> builtin_cluster_names() {
  std::vector<std::string> names;
  for (const EmbeddedFile& f : embedded_clusters()) names.emplace_back(f.name);
  return names;
}

ClusterSpec builtin_cluster(std::string_view name) {
  for (const EmbeddedFile& f : embedded_clusters()) {
    if (f.name == name) {
      std::string source = "clusters/" + std::string(name) + ".json";
      return cluster_from_json(parse_json_text(f.text, source), source);
    }
  }
  std::vector<std::string_view> names;
  for (const EmbeddedFile& f : embedded_clusters()) names.push_back(f.name);
  throw InputError("--cluster", "", std::string(name),
                   "unknown cluster" + did_you_mean(name, names) +
                       ": give a cluster file or one of " + join_names(names));
}

ClusterSpec resolve_cluster(const std::string& name_or_path) {
  std::filesystem::path path(name_or_path);
  if (path.extension() == ".json" || name_or_path.find('/') != std::string::npos ||
      std::filesystem::exists(path)) {
    return read_cluster_file(name_or_path);
  }
  return builtin_cluster(name_or_path);
}

}  // namespace sextant::spec
