// Reading /proc/cpuinfo (host_cpu.hpp says why).
#include "sextant/spec/host_cpu.hpp"

#include <fmt/format.h>

#include <fstream>
#include <map>

namespace sextant::spec {

namespace {

// The first processor's "key : value" lines.
std::map<std::string, std::string> first_processor() {
  std::map<std::string, std::string> fields;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) break;  // the blank line after the first processor
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    const size_t start = line.find_first_not_of(' ', colon + 1);
    fields[key] = start == std::string::npos ? "" : line.substr(start);
  }
  return fields;
}

std::string identity(const std::string& name) {
  return name.substr(0, name.find(": "));
}

}  // namespace

std::string this_host_cpu() {
  const std::map<std::string, std::string> f = first_processor();
  auto get = [&](const char* key) {
    auto it = f.find(key);
    return it == f.end() ? std::string() : it->second;
  };
  if (get("vendor_id").empty()) return "";
  return fmt::format("{} family {} model {}: {}", get("vendor_id"), get("cpu family"), get("model"),
                     get("model name"));
}

bool same_host_cpu(const std::string& a, const std::string& b) {
  return identity(a) == identity(b);
}

std::string host_cpu_mismatch(const ClusterSpec& cluster) {
  if (cluster.device.kind != DeviceKind::kCpu || cluster.device.host_cpu.empty()) return "";
  const std::string here = this_host_cpu();
  if (here.empty() || same_host_cpu(here, cluster.device.host_cpu)) return "";
  return fmt::format(
      "{} was made for another CPU ({}); this machine is {}: its predictions of runs here can be "
      "30-50% off. `sextant clusters detect --out FILE` makes a file for this machine "
      "(scripts/calibrate-local.sh fits one to measured runs)",
      cluster.name, cluster.device.host_cpu, here);
}

}  // namespace sextant::spec
