// A cluster file for this machine's CPU cores, measured here: `sextant clusters detect`, and the
// calibration loop when the file it would start from was made for another CPU (issue 63).
#pragma once

#include <functional>
#include <string>

#include "sextant/spec/cluster_spec.hpp"

namespace sextant::cli {

// Starts from the shipped local-cpu file's structure (one node, shared-memory transport) and
// replaces what describes the CPU: its name (host_cpu), its cores (devices_per_node), memory per
// core, the rates of the executor's ops (`bench compute` and a few training steps of gpt-tiny on
// one core, the fastest of three runs, fitted as `sextant calibrate` fits them), the attention
// curves (`bench attention`) and the co-run slowdown (`bench cores --co-run`). The network keeps
// the shipped figures until the loop fits them from `bench comm`. The training runs' files go to
// `work_dir`; `say` reports progress (a few seconds each step).
spec::ClusterSpec detect_local_cluster(const std::string& work_dir,
                                       const std::function<void(const std::string&)>& say);

}  // namespace sextant::cli
