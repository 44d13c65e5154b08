// Where each rank sits in a plan: Megatron-LM's order, tensor-parallel ranks adjacent (inside a
// node), then data-parallel, then pipeline stages outermost:
//   rank = tp_index + tp * (dp_index + dp * pp_stage).
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
};

class RankLayout {
 public:
  explicit RankLayout(const Plan& plan) : dp_(plan.dp), tp_(plan.tp), pp_(plan.pp) {}

  int64_t world_size() const { return dp_ * tp_ * pp_; }
  int64_t rank(RankCoord c) const { return c.tp + tp_ * (c.dp + dp_ * c.pp); }
  RankCoord coord(int64_t rank) const {
    return {(rank / tp_) % dp_, rank % tp_, rank / (tp_ * dp_)};
  }
  // Members of the rank's tensor-parallel and data-parallel groups, in group order.
  std::vector<int64_t> tp_group(int64_t rank) const;
  std::vector<int64_t> dp_group(int64_t rank) const;
  // The same (dp, tp) position in the next / previous pipeline stage (wrapping around, which the
  // interleaved schedule uses to go from the last stage back to the first).
  int64_t pp_next(int64_t rank) const;
  int64_t pp_prev(int64_t rank) const;

 private:
  int64_t dp_, tp_, pp_;
};

}  // namespace sextant::spec
