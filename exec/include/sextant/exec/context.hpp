// What the executor's layers need at hand: the backend, this rank's communicators and place in the
// layout, the recorder, and the lowering (for the FLOPs and bytes each traced op reports).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "sextant/exec/backend.hpp"
#include "sextant/exec/communicator.hpp"
#include "sextant/exec/recorder.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/step_ops.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::exec {

// One axis of AxoNN's 3D tensor grid (Plan::tp_grid) or of a CNN channel split's stationary-w
// grid (spec::ChannelFilterGrid): the rank's line of ranks along it.
struct GridAxis {
  Communicator* comm = nullptr;
  int64_t rank = 0, size = 1;
};

struct Groups {
  Communicator* world = nullptr;
  // The group a layer's own collectives run in (spec::RankLayout::layer_group, the simulator's
  // tp slot): the tensor-parallel ranks, or on a 3D tensor grid the x * y ranks of the rank's z
  // slice, which hold the same sequences and split the vocabulary; tp_rank and tp_size are the
  // rank's place in it and its size.
  Communicator* tp = nullptr;
  // On a 3D tensor grid, the rank's lines along x, y and z (RankLayout::grid_group); empty
  // (null communicators) without one.
  std::array<GridAxis, 3> grid{};
  // Under a CNN channel split running stationary-w somewhere, the rank's reduce group ([0]) and
  // gather group ([1]) (RankLayout::channel_filter_group); null communicators otherwise.
  std::array<GridAxis, 2> channel_filter{};
  // The ranks holding the same parameters, whose gradients are summed (spec::RankLayout::
  // replica_group): the data-parallel ranks, each with its spatial ranks when a CNN's maps are
  // split. Without a spatial split, the data-parallel group itself.
  Communicator* replicas = nullptr;
  // The ranks splitting this rank's samples spatially (RankLayout::spatial_group), or null.
  Communicator* spatial = nullptr;
  // The ranks splitting this rank's sequences (RankLayout::cp_group, context parallelism), or
  // null.
  Communicator* cp = nullptr;
  // The ranks splitting the routed experts (RankLayout::ep_group, expert parallelism), and the
  // ranks holding this rank's experts, which sum their gradients (expert_replica_group); null
  // without expert parallelism (the replicas hold every expert then).
  Communicator* ep = nullptr;
  Communicator* expert_replicas = nullptr;
  Communicator* embedding = nullptr;  // first and last pipeline stage (tied embeddings), or null
  int64_t tp_rank = 0, tp_size = 1;
  int64_t dp_rank = 0, dp_size = 1;  // which samples this rank trains: the plan's dp
  int64_t replica_rank = 0, replica_size = 1;
  int64_t spatial_rank = 0, spatial_size = 1;  // row-major over the plan's h x w grid
  int64_t cp_rank = 0, cp_size = 1;
  int64_t ep_rank = 0, ep_size = 1;
  int64_t expert_replica_rank = 0, expert_replica_size = 1;
  int64_t pp_rank = 0, pp_size = 1;
  int prev = -1;  // world rank of the previous / next pipeline stage, around a ring (pp > 1)
  int next = -1;
};

struct Context {
  Backend* backend = nullptr;
  Groups* groups = nullptr;
  Recorder* recorder = nullptr;
  const spec::Plan* plan = nullptr;
  const models::LoweredModel* lowered = nullptr;  // for the op figures in the trace
  bool sequence_parallel = false;

  // A recorder event for op `name` of lowered layer `layer`, with its FLOPs, bytes and shape.
  Recorder::Event op(const models::OpName& name, int32_t layer, spec::Phase phase,
                     int64_t micro_batch) const;
  // A recorder event for a collective or transfer.
  Recorder::Event comm(const models::OpName& name, spec::OpClass cls, spec::Stream stream,
                       int64_t bytes, int64_t group_size, spec::Phase phase,
                       std::optional<int64_t> layer, std::optional<int64_t> micro_batch) const;
  // The same for one of the step's own ops (models/step_ops.hpp) over `group_size` ranks.
  Recorder::Event comm(const models::StepOp& op, int64_t group_size, spec::Phase phase,
                       std::optional<int64_t> layer, std::optional<int64_t> micro_batch) const;
  // A recorder event for an offload op (a device-host copy, the host optimizer step) on the
  // stream models::offload_stream gives it.
  Recorder::Event offload(models::OpId id, spec::OpClass cls, int64_t bytes, spec::Phase phase,
                          std::optional<int64_t> layer, std::optional<int64_t> micro_batch) const;
  // The same for one of the step's own offload ops (models/step_ops.hpp).
  Recorder::Event offload(const models::StepOp& op, spec::Phase phase, std::optional<int64_t> layer,
                          std::optional<int64_t> micro_batch) const;
};

}  // namespace sextant::exec
