// ClusterSpec: where a model is trained. Nodes of identical devices (GPUs or CPU ranks), a
// hierarchical network (a level inside a node, a level across nodes), the efficiencies the compute
// model applies, per-rank/per-link slow-downs, and where calibrated numbers came from.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sextant/spec/device_models.hpp"
#include "sextant/spec/dtype.hpp"
#include "sextant/spec/json_reader.hpp"
#include "sextant/spec/power_model.hpp"
#include "sextant/spec/trace.hpp"

namespace sextant::spec {

enum class DeviceKind { kGpu, kCpu };
EnumNames<DeviceKind> device_kind_names();

// A calibrated op's efficiency at one size: `work` is its FLOPs for a matrix op, its bytes
// otherwise. Between points interpolated linearly in log(work); outside, clamped. The same op
// name runs at different speeds at different sizes (a GEMM split by tensor parallelism, an
// activation that fits a CPU's L2 at one micro-batch and not at the next).
struct WorkEfficiency {
  double work = 0;
  double efficiency = 0;
};

// One point of the GEMM efficiency curve: achieved fraction of peak for a GEMM of `flops` FLOPs.
// Between points the efficiency is interpolated linearly in log(flops); outside, clamped.
struct EfficiencyPoint {
  double flops = 0;
  double efficiency = 0;
};

// How much slower one device computes while other devices of its node compute too, measured by
// `sextant bench cores --co-run` (the executor's GEMM and a streaming add on each core alone, then
// on `devices` cores at once). CPU ranks on the two hardware threads of one core share its FMA
// units and caches; the cores of a socket share its memory bandwidth and run an all-core turbo
// clock below the one-core clock. Absent: devices compute independently (GPUs).
struct CoRunSlowdown {
  int64_t devices = 2;  // busy at once in the measurement
  double matrix = 1;    // GEMM time together over alone
  double memory = 1;    // memory-bound time together over alone
  std::string source;
  // The slowdown with `busy` devices of the node computing: 1 alone, the measured one at
  // `devices` and beyond, linear in between (a resource all of them share; exact for two).
  double at(bool matrix_op, int64_t busy) const;
};

struct DeviceSpec {
  std::string name;
  DeviceKind kind = DeviceKind::kGpu;
  std::map<Dtype, double> peak_tflops;  // dense peak per dtype, 1e12 FLOP/s
  double memory_bandwidth_GBps = 0;     // 1e9 bytes/s, read + write
  // peak_tflops is the fastest this machine's executor GEMMs were seen to run (`sextant
  // clusters detect`), not a physical bound: calibration raises it to a faster GEMM it measures,
  // where a datasheet peak caps the GEMM efficiencies at 1 instead.
  bool peak_measured = false;
  int64_t memory_capacity_bytes = 0;
  double launch_overhead_us = 0;  // fixed cost of every kernel/op
  // Host time per training step outside any op (batch set-up, zeroing gradients, the loss and
  // norm reductions, framework dispatch between ops): measured by calibration as the step time
  // no op or transfer of the step explains.
  double step_overhead_us = 0;
  std::vector<EfficiencyPoint> gemm_efficiency;
  double memory_efficiency = 0;  // achieved fraction of memory bandwidth, memory-bound ops
  // Per op class, where calibration found them to differ (norms and losses do more arithmetic per
  // byte than a residual add); classes not listed use memory_efficiency.
  std::map<OpClass, double> memory_efficiency_by_class;
  // Per kernel family (MemoryKernel, spec/trace.hpp) where eager PyTorch's kernels differ from
  // the class's (bench/eager_kernel_rates.py); families not listed use the op class's.
  std::map<MemoryKernel, double> memory_efficiency_by_kernel;
  // The bandwidth one thread block draws on its own SM, 1e9 bytes/s: a kernel of fewer blocks
  // than SMs (a column reduction over few columns) moves at most blocks x this. 0: not limited.
  double block_bandwidth_GBps = 0;
  // Per op (efficiency_key: the names simulator and executor share, e.g. "attn.softmax" or
  // "attn.softmax:bwd"), measured by calibration: for a matrix op the fraction of peak FLOP/s, for
  // a memory-bound op the fraction of memory bandwidth. Ops not listed use the curves above.
  // Per op key, a curve over the op's size (one point: the same at every size).
  std::map<std::string, std::vector<WorkEfficiency>> efficiency_by_op;
  // The calibrated efficiency of op `key` doing `work` (FLOPs or bytes); nullopt when none.
  std::optional<double> op_efficiency(const std::string& key, double work) const;
  // Shape-aware GEMM model; absent: matrix ops use the gemm_efficiency curve.
  std::optional<GemmModel> gemm_model;
  // Published throughput of fused attention kernels on this device.
  std::map<AttentionKernel, AttentionKernelData> attention_kernels;
  // The clock under the board's power limit; absent: gemm_model's fixed clock_MHz.
  std::optional<PowerModel> power;
  // Memory a training process holds before any tensor: CUDA context, library workspaces.
  int64_t runtime_reserved_bytes = 0;
  // Fraction by which compute slows down while a collective runs beside it on the same device
  // (SMs and memory bandwidth taken by the communication kernels).
  double overlap_slowdown = 0;
  // Relative standard deviation of a rank's compute between two collectives (OS noise, a core
  // shared with another tenant, clock changes): ranks reach a collective at different times and
  // the first wait for the last. Fitted by calibration from measured arrival spreads.
  double compute_jitter = 0;
  // Slowdown of a device's compute while the node's other devices compute (CPU cores sharing a
  // physical core, caches, memory bandwidth or a turbo budget); absent: none.
  std::optional<CoRunSlowdown> co_run;
  // A CPU file made for one machine: the CPU it describes as `sextant clusters detect` reads it
  // from /proc/cpuinfo ("vendor family F model M: model name"); "" when not said.
  std::string host_cpu;
  std::string source;

  double memory_efficiency_for(OpClass c) const {
    auto it = memory_efficiency_by_class.find(c);
    return it == memory_efficiency_by_class.end() ? memory_efficiency : it->second;
  }
  double memory_efficiency_for(OpClass c, MemoryKernel k) const {
    auto it = memory_efficiency_by_kernel.find(k);
    return it == memory_efficiency_by_kernel.end() ? memory_efficiency_for(c) : it->second;
  }

  // Interpolated GEMM efficiency for a GEMM of `flops` FLOPs.
  double gemm_efficiency_at(double flops) const;
  // Peak FLOP/s for `dtype`; throws InputError when the cluster file gives no peak for it.
  double peak_flops(Dtype dtype) const;
};

enum class LevelScope { kNode, kCluster };
EnumNames<LevelScope> level_scope_names();
enum class Topology { kSwitch, kFatTree, kSharedMemory };
EnumNames<Topology> topology_names();
enum class CollectiveLibrary { kNccl, kMpi };
EnumNames<CollectiveLibrary> collective_library_names();

// Achieved fraction of a level's bandwidth for a collective of `bytes` (measured NCCL libraries
// use fewer channels for mid-size messages); interpolated in log(bytes), clamped at the ends.
struct MessageEfficiencyPoint {
  double bytes = 0;
  double efficiency = 0;
};

struct NetworkLevel {
  std::string name;
  LevelScope scope = LevelScope::kNode;
  double bandwidth_GBps = 0;  // per device (node level) or per NIC (cluster level), per direction
  double latency_us = 0;      // α: per message
  int64_t nics_per_node = 0;  // cluster level: NICs per node (each device uses nic = local % nics)
  Topology topology = Topology::kSwitch;
  double oversubscription = 1.0;  // cluster level: >= 1, divides cross-node bandwidth
  std::vector<MessageEfficiencyPoint> message_efficiency;  // empty: 1 for every size
  std::string source;

  double efficiency_at(double bytes) const;
};

struct NetworkSpec {
  CollectiveLibrary library = CollectiveLibrary::kNccl;
  double reduction_GBps = 0;  // γ = 1 / reduction_GBps: bytes reduced per second by one rank
  // Device memory one communicator (one process group) holds for its buffers.
  int64_t communicator_buffer_bytes = 0;
  std::vector<NetworkLevel> levels;  // [0] inside a node, [1] across nodes (if any)
  std::string source;

  const NetworkLevel& node_level() const { return levels.front(); }
  const NetworkLevel* cluster_level() const { return levels.size() > 1 ? &levels[1] : nullptr; }
};

// The host side of a node, for plans that offload training state to it (ZeRO-Offload,
// ZeRO-Infinity): where offloaded state lives and what moving and updating it costs.
struct HostSpec {
  int64_t memory_bytes = 0;          // host memory of a node
  double memory_bandwidth_GBps = 0;  // a node's DRAM bandwidth, all sockets (the CPU optimizer
                                     // streams its state through it)
  double memory_efficiency = 1;      // achieved fraction of it
  double pcie_bandwidth_GBps = 0;    // per device and direction, device <-> pinned host memory
  double nvme_bandwidth_GBps = 0;    // a node's NVMe bandwidth, each direction; 0: none
  std::string source;
};

// Slows a whole node or one rank down: compute time is divided by `factor` (0.5 = half speed).
struct SpeedOverride {
  std::optional<int64_t> node;
  std::optional<int64_t> rank;
  double factor = 1.0;
};

// Scales the bandwidth of one node's links at a level (node level: every device link of the
// node; cluster level: the node's NICs, or one NIC when `nic` is given).
struct LinkOverride {
  std::string level;
  int64_t node = 0;
  std::optional<int64_t> nic;
  double factor = 1.0;
};

// The key of an op in DeviceSpec::efficiency_by_op: its name, with ":bwd" for its backward pass
// (the same name does different work there).
std::string efficiency_key(std::string_view op_name, Phase phase);

// α and β fitted by calibration for one collective at one level (µs per message and µs per
// byte): the parameters of the collective's ring formula (pairwise for all-to-all and send/recv),
// so that they predict every group size. A library that switches algorithms with the message
// size (Open MPI's tuned collectives, NCCL's protocols) is not one line: fits of one collective
// and level then cover size ranges, each up to its `max_bytes`.
struct CollectiveFit {
  std::string collective;  // all_reduce, reduce_scatter, all_gather, send, ...
  std::string level;       // network level name
  double alpha_us = 0;
  double beta_us_per_byte = 0;
  double r2 = 0;
  int64_t samples = 0;
  int64_t max_bytes = 0;  // the largest message this fit is for; 0: no bound
};

struct ClusterSpec {
  std::string name;
  std::string description;
  int64_t nodes = 0;
  int64_t devices_per_node = 0;
  DeviceSpec device;
  NetworkSpec network;
  std::optional<HostSpec> host;  // absent: plans cannot offload on this cluster
  std::vector<SpeedOverride> speed_overrides;
  std::vector<LinkOverride> link_overrides;
  std::vector<CollectiveFit> collective_fits;
  std::optional<Json> calibrated_from;

  int64_t total_devices() const { return nodes * devices_per_node; }
  // Product of the speed factors that apply to `rank`.
  double speed_factor(int64_t rank) const;
};

inline constexpr std::string_view kClusterSchema = "sextant.cluster/1";

ClusterSpec cluster_from_json(const Json& json, const std::string& source);
Json to_json(const ClusterSpec& cluster);
ClusterSpec read_cluster_file(const std::string& path);

}  // namespace sextant::spec
