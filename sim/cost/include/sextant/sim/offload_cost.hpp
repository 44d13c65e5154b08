// What offloading training state off the device costs (ZeRO-Offload, Ren et al., USENIX ATC'21;
// ZeRO-Infinity, Rajbhandari et al., SC'21): copies between the device and pinned host memory
// over the device's PCIe link, NVMe reads and writes staged through host memory, and the Adam step
// on the host CPU. One home for these prices and for the host memory the offloaded state takes;
// the simulator's programs, its memory model and the planner's estimator ask it.
#pragma once

#include <cstdint>
#include <string>

#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/units.hpp"

namespace sextant::sim {

// Host bytes per offloaded parameter of the rank's shard.
//   optimizer on the host: fp32 master weight, Adam's two moments, and the fp32 gradient the
//     device's 16-bit one is copied into (DeepSpeed stage_1_and_2.py with offload_optimizer keeps
//     single_partition_of_fp32_groups and their fp32 .grad in pinned host memory): 4 + 8 + 4;
//   optimizer on NVMe: the states (12) live on NVMe, the fp32 gradient (4) in host memory;
//   parameters on the host: their 16-bit (parameter-dtype) copy; on NVMe: none.
int64_t host_bytes_per_param(const spec::Offload& offload, int64_t param_bytes);
// The host memory one rank may fill: its share of its node's (0 without a host section).
int64_t host_capacity_per_rank(const spec::ClusterSpec& cluster);
// Optimizer state bytes per parameter that an NVMe-offloaded step reads before and writes after
// the update: fp32 master weight and two moments.
inline constexpr int64_t kNvmeOptimizerStateBytes = 12;

class OffloadCost {
 public:
  // Throws InputError naming `plan_source` when `plan` offloads and `cluster` has no host section,
  // or offloads to NVMe and the host section gives no NVMe bandwidth.
  OffloadCost(const spec::ClusterSpec& cluster, const spec::Plan& plan,
              const std::string& plan_source);
  // The prices of `cluster`'s host section (none: every price is 0), for a search that offers
  // offloading only where the cluster has one.
  explicit OffloadCost(const spec::ClusterSpec& cluster);

  // A copy of `bytes` in one direction between the device and pinned host memory: the PCIe link
  // is the device's own (a copy engine moves it; the device's compute is not slowed).
  Picoseconds device_host_copy(int64_t bytes) const;
  // `bytes` read from or written to NVMe by one rank while every device of its node does the
  // same (DeepSpeed's swappers run on all ranks at once): its share of the node's NVMe bandwidth.
  Picoseconds nvme_transfer(int64_t bytes) const;
  // The Adam step over `params` parameters on the host CPU, moving `bytes_per_param` through DRAM
  // (models::optimizer_bytes_per_param). DeepSpeed's CPU-Adam (csrc/adam/cpu_adam_impl.cpp,
  // AVX-512 over all cores) does about a dozen FLOPs per parameter against ~30 bytes moved:
  // bound by DRAM bandwidth, of which each rank gets its node's share, since all ranks of a node
  // step at once.
  Picoseconds host_optimizer(int64_t params, int64_t bytes_per_param) const;
  // ZeRO-Offload's whole host step over `params` parameters whose device copy is `param_dtype`:
  // CPU-Adam on fp32 gradients, master weights and moments (host_step_bytes_per_param), after
  // reading the states from NVMe and before writing them back when `states` is kNvme
  // (DeepSpeed's swapper without pipeline_read/pipeline_write, its defaults).
  Picoseconds host_step(int64_t params, spec::Dtype param_dtype, spec::OffloadTarget states) const;
  // Bytes CPU-Adam moves per parameter: models::optimizer_bytes_per_param with fp32 gradients
  // (the device's 16-bit gradient was widened by its copy to the host) and the 16-bit copy for
  // the device written from the master weights.
  static int64_t host_step_bytes_per_param(spec::Dtype param_dtype);
  // The updated parameter shard of `bytes` after the host step, where the parameters live: copied
  // to the device, written to NVMe, or nothing to move (parameters offloaded to the host).
  Picoseconds params_return(int64_t bytes, spec::OffloadTarget params) const;
  // An offloaded parameter shard of `bytes` fetched to the device before its gather: from host
  // memory, or from NVMe through it (read, then copied).
  Picoseconds params_fetch(int64_t bytes, spec::OffloadTarget params) const;

 private:
  // Bytes per second: a device's PCIe link one way; a rank's share of its node's NVMe and of its
  // DRAM bandwidth as achieved (0: the cluster has no host section).
  double pcie_Bps_ = 0, nvme_Bps_ = 0, dram_Bps_ = 0;
};

}  // namespace sextant::sim
