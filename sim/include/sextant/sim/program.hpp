// A rank's program for one training step: tasks on its streams with dependencies. Ranks of the
// same pipeline stage run the same program; group and peer references are symbolic (my tensor-
// parallel group, my next stage), resolved per rank by the engine.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "sextant/spec/collective.hpp"
#include "sextant/spec/trace.hpp"
#include "sextant/spec/units.hpp"

namespace sextant::sim {

// kLocal: work of a fixed duration off the device's compute stream that moves nothing over the
// network and takes nothing from the device's compute (an offload copy over PCIe by a copy
// engine, the optimizer step on the host CPU).
enum class TaskKind : uint8_t { kCompute, kCollective, kSend, kRecv, kLocal };

// What time spent waiting for a task counts as in the report's breakdown.
// kSpatial: halo exchanges and statistic all-reduces of a spatially split CNN. kCp: context
// parallelism's attention transfers. kEp: expert parallelism's token dispatch and combine.
enum class CommClass : uint8_t { kNone, kTp, kDp, kFsdp, kPp, kOffload, kSpatial, kCp, kEp };

// kTp: the layer group (spec::RankLayout::layer_group: the tensor-parallel ranks). kDp: the ranks
// holding the same parameters (RankLayout::replica_group: data-parallel replicas, with their
// spatial ranks). The embedding group: the first and the last pipeline stage of a (tp, dp)
// position, which hold the tied embedding table. kCp: the ranks splitting each sequence
// (RankLayout::cp_group). kEp: the ranks splitting the routed experts (RankLayout::ep_group);
// kExpertDp: the ranks holding the same experts, which sum their gradients
// (RankLayout::expert_replica_group). kGridX, kGridY, kGridZ: the lines of a 3D tensor grid
// (RankLayout::grid_group); its x*y slice is the layer group. kSpatial: the ranks splitting a CNN's
// samples spatially (RankLayout::spatial_group). kFilterReduce, kChannelGather: the reduce and
// gather groups of a CNN channel split's stationary-w (RankLayout::channel_filter_group).
enum class GroupSlot : uint8_t {
  kTp,
  kDp,
  kEmbedding,
  kCp,
  kEp,
  kExpertDp,
  kGridX,
  kGridY,
  kGridZ,
  kSpatial,
  kFilterReduce,
  kChannelGather,
  // The replicas again, for a layer's own collectives over them (per-op reshards over d): a
  // communicator of their own, so that they never queue into the buckets' reductions, which run
  // on another stream (as NCCL needs a communicator per concurrent stream).
  kDpLayer
};
inline constexpr size_t kGroupSlots = 13;
// A stage-to-stage channel: to (or from) the previous or next pipeline rank; the "Up" pair
// carries GEMS' second replica (spec::chunk_runs_up), so each direction's channel holds one
// replica's transfers in its own order. kX ^ 1 is the slot at the other end.
enum class PeerSlot : uint8_t { kPrev, kNext, kPrevUp, kNextUp };
inline constexpr int kPeerSlots = 4;

// Satisfied once `stream` has completed at least `count` tasks.
struct Dep {
  uint8_t stream = 0;
  int32_t count = 0;
};

// An op as the trace shows it; shared by every task that runs it.
struct OpInfo {
  std::string name;
  spec::OpClass op_class = spec::OpClass::kGemm;
  double flops = 0;
  int64_t bytes = 0;
  std::vector<int64_t> shape;
  int32_t layer = -1;        // -1: not a layer op (optimizer)
  Picoseconds duration = 0;  // compute ops, at full speed
  int32_t kernels = 0;       // kernel launches (models::Op::kernels; 0: none of its own)
};

struct Task {
  TaskKind kind = TaskKind::kCompute;
  spec::Stream stream = spec::Stream::kCompute;
  CommClass comm_class = CommClass::kNone;
  spec::Phase phase = spec::Phase::kNone;
  uint8_t slot = 0;  // GroupSlot (collective) or PeerSlot (send, recv)
  spec::CollectiveKind collective = spec::CollectiveKind::kAllReduce;
  int32_t micro_batch = -1;
  int32_t dep_begin = 0;
  int32_t dep_end = 0;
  int32_t op_begin = 0;  // compute: range of Program::task_ops; others: op_begin = OpInfo index
  int32_t op_end = 0;
  Picoseconds duration = 0;  // compute, at full speed; local
  int64_t bytes = 0;         // communication
  bool optimizer = false;
  // The host's issue of the task's kernels (host_issue.hpp; 0: not modelled): its time, and for
  // compute the earliest the task can end after the host starts issuing it (HostChain; -1: no
  // bound, the task has no kernels to issue).
  Picoseconds host = 0;
  Picoseconds host_critical = -1;
};

struct Program {
  std::vector<Task> tasks;
  std::array<std::vector<int32_t>, spec::kStreamCount> streams;  // task indices in stream order
  std::vector<Dep> deps;
  std::vector<int32_t> task_ops;  // OpInfo indices of compute tasks, concatenated
  std::vector<OpInfo> ops;

  int64_t task_count() const { return static_cast<int64_t>(tasks.size()); }
};

}  // namespace sextant::sim
