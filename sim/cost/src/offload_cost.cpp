// Offload prices: PCIe copies, NVMe transfers and the host optimizer step.
#include "sextant/sim/offload_cost.hpp"

#include <fmt/format.h>

#include "sextant/models/optimizer_step.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::sim {

int64_t host_bytes_per_param(const spec::Offload& offload, int64_t param_bytes) {
  int64_t bytes = 0;
  if (offload.optimizer == spec::OffloadTarget::kHost) bytes += 4 + 8 + 4;
  if (offload.optimizer == spec::OffloadTarget::kNvme) bytes += 4;
  if (offload.params == spec::OffloadTarget::kHost) bytes += param_bytes;
  return bytes;
}

int64_t host_capacity_per_rank(const spec::ClusterSpec& cluster) {
  return cluster.host ? cluster.host->memory_bytes / cluster.devices_per_node : 0;
}

OffloadCost::OffloadCost(const spec::ClusterSpec& cluster) {
  if (!cluster.host) return;
  const spec::HostSpec& h = *cluster.host;
  const double ranks = static_cast<double>(cluster.devices_per_node);
  pcie_Bps_ = h.pcie_bandwidth_GBps * 1e9;
  nvme_Bps_ = h.nvme_bandwidth_GBps * 1e9 / ranks;
  dram_Bps_ = h.memory_bandwidth_GBps * 1e9 * h.memory_efficiency / ranks;
}

OffloadCost::OffloadCost(const spec::ClusterSpec& cluster, const spec::Plan& plan,
                         const std::string& plan_source)
    : OffloadCost(cluster) {
  if (!plan.offload.any()) return;
  if (!cluster.host) {
    throw InputError(plan_source, "/offload", plan.name(),
                     fmt::format("offloading needs the cluster's host memory, PCIe and CPU: "
                                 "cluster {} has no \"host\" section",
                                 cluster.name));
  }
  const bool nvme = plan.offload.optimizer == spec::OffloadTarget::kNvme ||
                    plan.offload.params == spec::OffloadTarget::kNvme;
  if (nvme && nvme_Bps_ <= 0) {
    throw InputError(plan_source, "/offload", plan.name(),
                     fmt::format("offloading to NVMe needs host.nvme_bandwidth_GBps: cluster {} "
                                 "gives none",
                                 cluster.name));
  }
}

namespace {
Picoseconds transfer(double bytes, double bytes_per_second) {
  if (bytes <= 0 || bytes_per_second <= 0) return 0;
  return seconds_to_ps(bytes / bytes_per_second);
}
}  // namespace

Picoseconds OffloadCost::device_host_copy(int64_t bytes) const {
  return transfer(static_cast<double>(bytes), pcie_Bps_);
}

Picoseconds OffloadCost::nvme_transfer(int64_t bytes) const {
  return transfer(static_cast<double>(bytes), nvme_Bps_);
}

Picoseconds OffloadCost::host_optimizer(int64_t params, int64_t bytes_per_param) const {
  return transfer(static_cast<double>(params) * static_cast<double>(bytes_per_param), dram_Bps_);
}

int64_t OffloadCost::host_step_bytes_per_param(spec::Dtype param_dtype) {
  return models::host_optimizer_bytes_per_param(param_dtype);
}

Picoseconds OffloadCost::host_step(int64_t params, spec::Dtype param_dtype,
                                   spec::OffloadTarget states) const {
  Picoseconds t = host_optimizer(params, host_step_bytes_per_param(param_dtype));
  if (states == spec::OffloadTarget::kNvme)
    t += 2 * nvme_transfer(params * kNvmeOptimizerStateBytes);
  return t;
}

Picoseconds OffloadCost::params_return(int64_t bytes, spec::OffloadTarget params) const {
  switch (params) {
    case spec::OffloadTarget::kHost:
      return 0;
    case spec::OffloadTarget::kNvme:
      return nvme_transfer(bytes);
    case spec::OffloadTarget::kNone:
      break;
  }
  return device_host_copy(bytes);
}

Picoseconds OffloadCost::params_fetch(int64_t bytes, spec::OffloadTarget params) const {
  Picoseconds t = device_host_copy(bytes);
  if (params == spec::OffloadTarget::kNvme) t += nvme_transfer(bytes);
  return t;
}

}  // namespace sextant::sim
