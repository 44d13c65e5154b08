// Rank groups of a plan.
#include "sextant/spec/rank_layout.hpp"

namespace sextant::spec {

std::vector<int64_t> RankLayout::tp_group(int64_t r) const {
  RankCoord c = coord(r);
  std::vector<int64_t> g;
  for (int64_t t = 0; t < tp_; ++t) g.push_back(rank({c.dp, t, c.pp, c.spatial, c.cp}));
  return g;
}

std::vector<int64_t> RankLayout::dp_group(int64_t r) const {
  RankCoord c = coord(r);
  std::vector<int64_t> g;
  for (int64_t d = 0; d < dp_; ++d) g.push_back(rank({d, c.tp, c.pp, c.spatial, c.cp}));
  return g;
}

std::vector<int64_t> RankLayout::spatial_group(int64_t r) const {
  RankCoord c = coord(r);
  std::vector<int64_t> g;
  for (int64_t s = 0; s < sp_; ++s) g.push_back(rank({c.dp, c.tp, c.pp, s, c.cp}));
  return g;
}

std::vector<int64_t> RankLayout::cp_group(int64_t r) const {
  RankCoord c = coord(r);
  std::vector<int64_t> g;
  for (int64_t k = 0; k < cp_; ++k) g.push_back(rank({c.dp, c.tp, c.pp, c.spatial, k}));
  return g;
}

std::vector<int64_t> RankLayout::layer_group(int64_t r) const {
  return sp_ > 1 ? spatial_group(r) : tp_group(r);
}

std::vector<int64_t> RankLayout::replica_group(int64_t r) const {
  RankCoord c = coord(r);
  std::vector<int64_t> g;
  for (int64_t d = 0; d < dp_; ++d)
    for (int64_t k = 0; k < cp_; ++k)
      for (int64_t s = 0; s < sp_; ++s) g.push_back(rank({d, c.tp, c.pp, s, k}));
  return g;
}

std::vector<int64_t> RankLayout::ep_group(int64_t r) const {
  RankCoord c = coord(r);
  std::vector<int64_t> g;
  const int64_t first = c.dp / ep_ * ep_;
  for (int64_t i = 0; i < ep_; ++i) g.push_back(rank({first + i, c.tp, c.pp, c.spatial, c.cp}));
  return g;
}

std::vector<int64_t> RankLayout::expert_replica_group(int64_t r) const {
  RankCoord c = coord(r);
  std::vector<int64_t> g;
  for (int64_t d = c.dp % ep_; d < dp_; d += ep_)
    for (int64_t k = 0; k < cp_; ++k)
      for (int64_t s = 0; s < sp_; ++s) g.push_back(rank({d, c.tp, c.pp, s, k}));
  return g;
}

int64_t RankLayout::pp_next(int64_t r) const {
  RankCoord c = coord(r);
  c.pp = (c.pp + 1) % pp_;
  return rank(c);
}

int64_t RankLayout::pp_prev(int64_t r) const {
  RankCoord c = coord(r);
  c.pp = (c.pp + pp_ - 1) % pp_;
  return rank(c);
}

}  // namespace sextant::spec
