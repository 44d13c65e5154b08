// The cluster files shipped in clusters/*.json (compiled into the binary) and lookup by name or
// path.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "sextant/spec/cluster_spec.hpp"

namespace sextant::spec {

std::vector<std::string> builtin_cluster_names();
// A shipped cluster by name; throws InputError listing the valid names when unknown.
ClusterSpec builtin_cluster(std::string_view name);
// A shipped cluster name or a path to a cluster file.
ClusterSpec resolve_cluster(const std::string& name_or_path);

}  // namespace sextant::spec
