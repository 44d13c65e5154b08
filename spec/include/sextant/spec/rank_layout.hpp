// Where each rank sits in a plan: Megatron-LM's order (parallel_state's "tp-cp-ep-dp-pp"),
// tensor-parallel ranks adjacent (inside a node), then context-parallel, then data-parallel, then
// pipeline stages outermost; the ranks splitting a sample's feature maps (spatial, CNNs)
// innermost of all, since they exchange halos at every layer (Dryden et al. place them on one
// node):
//   rank = spatial_index + S * (tp_index + tp * (cp_index + cp * (dp_index + dp * pp_stage))),
// S = d*h*w, the spatial index row-major over the (d x) h x w grid. (A plan splits samples
// spatially or sequences by context, never both: one of S and cp is 1.) Expert parallelism splits
// dp further (Megatron's "ep" inside "dp"): the ep ranks splitting the experts are ep consecutive
// dp indices. A 3D tensor grid (Plan::tp_grid, spec/tensor_grid.hpp) numbers the tp index x
// fastest:
//   tp_index = gx + x * (gy + y * gz),
// so the x groups, whose all-reduces carry the most bytes per layer, are the most local.
// The simulator and the executor both use this, so their traces number ranks alike.
#pragma once

#include <cstdint>
#include <vector>

#include "sextant/spec/plan.hpp"

namespace sextant::spec {

struct RankCoord {
  int64_t dp = 0;
  int64_t tp = 0;
  int64_t pp = 0;
  int64_t spatial = 0;
  int64_t cp = 0;
};

class RankLayout {
 public:
  explicit RankLayout(const Plan& plan)
      : dp_(plan.dp),
        tp_(plan.tp),
        pp_(plan.pp),
        sp_(plan.spatial.ranks()),
        cp_(plan.cp),
        ep_(plan.ep),
        grid_(plan.tp_grid),
        mirrored_(plan.schedule == Schedule::kGems) {}

  int64_t world_size() const { return sp_ * dp_ * tp_ * cp_ * pp_; }
  int64_t rank(RankCoord c) const {
    return c.spatial + sp_ * (c.tp + tp_ * (c.cp + cp_ * (c.dp + dp_ * c.pp)));
  }
  RankCoord coord(int64_t rank) const {
    const int64_t outer = rank / sp_;  // (tp, cp, dp, pp)
    const int64_t after_tp = outer / tp_;
    return {(after_tp / cp_) % dp_, outer % tp_, after_tp / (cp_ * dp_), rank % sp_,
            after_tp % cp_};
  }
  // Members of the rank's tensor-parallel and data-parallel groups, in group order.
  std::vector<int64_t> tp_group(int64_t rank) const;
  std::vector<int64_t> dp_group(int64_t rank) const;
  // The ranks splitting the rank's samples spatially, in grid order (row-major).
  std::vector<int64_t> spatial_group(int64_t rank) const;
  // The ranks splitting the rank's sequences (context parallelism), in cp order: the ring.
  std::vector<int64_t> cp_group(int64_t rank) const;
  // The group a layer's own collectives run in: the tensor-parallel group (a CNN's channel
  // split; its spatial split's halos and sums run in spatial_group); on a tensor grid the x * y
  // ranks of the rank's z slice, which hold the same sequences (the vocabulary-parallel embedding
  // and output layer run there).
  std::vector<int64_t> layer_group(int64_t rank) const;
  // The ranks holding the same parameters, whose gradients are summed (Plan::replicas): the
  // data-parallel group, each member with its spatial or context-parallel ranks, in (dp, cp,
  // spatial) order.
  std::vector<int64_t> replica_group(int64_t rank) const;
  // The ranks splitting the rank's routed experts (expert parallelism): the ep consecutive dp
  // indices of its block, dp index (d / ep) * ep + i for i < ep, in that order.
  std::vector<int64_t> ep_group(int64_t rank) const;
  // The ranks holding the rank's experts, whose expert gradients are summed
  // (Plan::expert_replicas): the replica group's members at the rank's place in its ep block, in
  // (dp, cp, spatial) order. The replica group when ep is 1.
  std::vector<int64_t> expert_replica_group(int64_t rank) const;
  // The ranks of the rank's tensor grid line along one axis (0: x, 1: y, 2: z), in axis order;
  // the whole tp group when the plan has no grid.
  std::vector<int64_t> grid_group(int64_t rank, int axis) const;
  // The ranks of the rank's stationary-w group (a CNN's channel split, spec/channel_split.hpp's
  // ChannelFilterGrid over its tp ranks): axis 0 the reduce group (consecutive tp ranks), axis 1
  // the gather group (every reduce_ranks-th), in tp order; the whole tp group when tp has no grid.
  std::vector<int64_t> channel_filter_group(int64_t rank, int axis) const;
  // The same (dp, tp) position in the next / previous pipeline stage (wrapping around, which the
  // interleaved schedule uses to go from the last stage back to the first).
  int64_t pp_next(int64_t rank) const;
  int64_t pp_prev(int64_t rank) const;

 private:
  int64_t dp_, tp_, pp_, sp_, cp_, ep_;
  TensorGrid grid_;
  // GEMS: a rank and its mirror (pipeline rank pp - 1 - r) hold the same stages
  // (spec::chunk_stage) and sum their gradients with the replicas.
  bool mirrored_ = false;
};

}  // namespace sextant::spec
