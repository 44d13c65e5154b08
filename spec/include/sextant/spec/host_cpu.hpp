// The CPU this process runs on, and whether a CPU cluster file was made for it: a file measured
// on one CPU predicts another's runs 30-50% off (issue 63: the shipped local-cpu describes a
// Zen 5 core; on a Xeon every uncalibrated prediction was 33-55% fast).
#pragma once

#include <string>

#include "sextant/spec/cluster_spec.hpp"

namespace sextant::spec {

// As /proc/cpuinfo names it: "vendor family F model M: model name" ("AuthenticAMD family 26
// model 2: AMD EPYC"); "" where there is no /proc/cpuinfo.
std::string this_host_cpu();

// Whether two such names are one CPU: vendor, family and model (the part before ": "; the model
// name varies with firmware and hypervisor).
bool same_host_cpu(const std::string& a, const std::string& b);

// Why `cluster` does not describe this machine's CPU, naming both and how to make a file that
// does; "" when it does, or when either CPU is unknown, or for a GPU cluster.
std::string host_cpu_mismatch(const ClusterSpec& cluster);

}  // namespace sextant::spec
