// Synthetic clusters for simulator tests, built in code so that each test states its hardware.
#pragma once

#include "sextant/spec/cluster_spec.hpp"

namespace sextant::test {

// A device whose matrix ops run at exactly `tflops` (efficiency 1 for every size), whose
// memory-bound ops and launches cost nothing, on a network with the given bandwidths (GB/s) and
// latencies (us). Enough devices for any test plan.
inline spec::ClusterSpec ideal_cluster(double tflops = 100, double node_GBps = 1e9,
                                       double nic_GBps = 1e9, double latency_us = 0,
                                       int64_t nodes = 64, int64_t devices_per_node = 8,
                                       int64_t nics_per_node = 8) {
  spec::ClusterSpec c;
  c.name = "ideal";
  c.nodes = nodes;
  c.devices_per_node = devices_per_node;
  c.device.name = "ideal";
  c.device.kind = spec::DeviceKind::kGpu;
  c.device.peak_tflops[spec::Dtype::kBf16] = tflops;
  c.device.peak_tflops[spec::Dtype::kFp32] = tflops;
  c.device.memory_bandwidth_GBps = 1e12;
  c.device.memory_capacity_bytes = int64_t{1} << 50;
  c.device.launch_overhead_us = 0;
  c.device.gemm_efficiency = {{1, 1.0}};
  c.device.memory_efficiency = 1.0;
  c.device.source = "test";
  c.network.library = spec::CollectiveLibrary::kMpi;
  c.network.reduction_GBps = 1e12;
  spec::NetworkLevel node;
  node.name = "nvlink";
  node.scope = spec::LevelScope::kNode;
  node.bandwidth_GBps = node_GBps;
  node.latency_us = latency_us;
  node.source = "test";
  c.network.levels.push_back(node);
  spec::NetworkLevel net;
  net.name = "infiniband";
  net.scope = spec::LevelScope::kCluster;
  net.bandwidth_GBps = nic_GBps;
  net.latency_us = latency_us;
  net.nics_per_node = nics_per_node;
  net.topology = spec::Topology::kFatTree;
  net.source = "test";
  c.network.levels.push_back(net);
  return c;
}

// The ideal cluster with a host: PCIe at 100 GB/s each way, 100 GB/s of DRAM for the node's 8
// devices (12.5 GB/s a rank), 1 TiB of host memory.
inline spec::ClusterSpec ideal_cluster_with_host(double tflops = 100) {
  spec::ClusterSpec c = ideal_cluster(tflops);
  spec::HostSpec h;
  h.memory_bytes = int64_t{1} << 40;
  h.memory_bandwidth_GBps = 100;
  h.memory_efficiency = 1;
  h.pcie_bandwidth_GBps = 100;
  h.source = "test";
  c.host = h;
  return c;
}

}  // namespace sextant::test
