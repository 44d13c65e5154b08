// SUPER's branch split of Inception's modules: rules and placement (branch_parallel.hpp).
#include "sextant/spec/branch_parallel.hpp"

#include <algorithm>
#include <numeric>

#include "sextant/spec/amoeba_cell.hpp"
#include "sextant/spec/inception_module.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::spec {

std::string branch_parallel_problem(const ModelSpec& model, const Plan& plan) {
  if (!plan.branch_parallel) return "";
  if (model.kind() != ModelKind::kCnn || !model.cnn().has_cells())
    return "splits the branches of a CNN's Inception modules or AmoebaNet cells (SUPER): this "
           "model has none";
  if (plan.tp < 2 || plan.tp > kMaxBranchRanks)
    return "needs 2 to 4 tp ranks, at most a module's branches";
  if (plan.spatial.any() || !plan.channel_algorithms.empty() || !plan.per_op.empty() ||
      plan.tp_grid.any())
    return "keeps every map whole on its tp ranks: no spatial split, channel algorithms, per-op "
           "splits or tensor grid";
  return "";
}

std::vector<BranchOutput> inception_branch_outputs(const CnnLayer& l, const CnnMap& in) {
  // A convolution's multiply-adds: output pixels x output channels x input channels x window.
  auto walk = [](const std::vector<InceptionStep>& steps, CnnMap m, double& macs) {
    for (const InceptionStep& s : steps) {
      const CnnMap o{s.kind == InceptionStep::Kind::kConvBnRelu ? s.channels : m.c, 1,
                     window_output(m.h, s.kh, s.sh, s.ph), window_output(m.w, s.kw, s.sw, s.pw)};
      if (s.kind == InceptionStep::Kind::kConvBnRelu)
        macs += static_cast<double>(o.h * o.w) * static_cast<double>(o.c) *
                static_cast<double>(m.c * s.kh * s.kw);
      m = o;
    }
    return m;
  };
  std::vector<BranchOutput> out;
  for (const InceptionBranch& b : inception_branches(l.module, in.c, l.width, l.divisor)) {
    BranchOutput o;
    o.map = walk(b.steps, in, o.macs);
    if (!b.split.empty()) {
      const CnnMap before = o.map;
      o.map.c = 0;
      for (const auto& part : b.split) o.map.c += walk(part, before, o.macs).c;
    }
    out.push_back(o);
  }
  return out;
}

std::vector<double> inception_branch_macs(const CnnLayer& l, const CnnMap& in) {
  std::vector<double> macs;
  for (const BranchOutput& o : inception_branch_outputs(l, in)) macs.push_back(o.macs);
  return macs;
}

namespace {

// The multiply-adds of one sample through an AmoebaNet edge's steps on a state of c channels and
// h x w (spec::amoeba_edge_steps); sets the map it makes.
double edge_macs(const std::vector<AmoebaStep>& steps, int64_t c, int64_t& h, int64_t& w) {
  double macs = 0;
  for (const AmoebaStep& s : steps) {
    const int64_t ph = s.kind == AmoebaStep::Kind::kReluConvBn ? (s.kh - 1) / 2 : s.padding;
    const int64_t pw = s.kind == AmoebaStep::Kind::kReluConvBn ? (s.kw - 1) / 2 : s.padding;
    const int64_t oh = s.kind == AmoebaStep::Kind::kFactorizedReduce
                           ? (h + 1) / 2
                           : window_output(h, s.kh, s.sh, ph),
                  ow = s.kind == AmoebaStep::Kind::kFactorizedReduce
                           ? (w + 1) / 2
                           : window_output(w, s.kw, s.sw, pw);
    const double pixels = static_cast<double>(oh * ow);
    if (s.kind == AmoebaStep::Kind::kReluConvBn)
      macs += pixels * static_cast<double>(s.channels) * static_cast<double>(c * s.kh * s.kw);
    if (s.kind == AmoebaStep::Kind::kFactorizedReduce)  // two 1x1 to half the channels each
      macs += pixels * static_cast<double>(s.channels) * static_cast<double>(c);
    if (s.kind == AmoebaStep::Kind::kReluConvBn) c = s.channels;
    h = oh;
    w = ow;
  }
  return macs;
}

}  // namespace

CellPlacement amoeba_placement(const CnnLayer& l, int64_t h, int64_t w, int64_t ranks) {
  const AmoebaGenotype& g = amoeba_genotype(l.reduction);
  CellPlacement p;
  const std::vector<int> group = amoeba_node_groups(l.reduction);
  p.group_macs.assign(static_cast<size_t>(*std::max_element(group.begin(), group.end()) + 1), 0.0);
  for (size_t e = 0; e < g.edges.size(); ++e) {
    int64_t eh = h, ew = w;
    p.group_macs[static_cast<size_t>(group[e / 2])] += edge_macs(
        amoeba_edge_steps(g.edges[e].op, l.filters, amoeba_edge_stride(l.reduction, g.edges[e])),
        l.filters, eh, ew);
  }
  // The groups, then each joined reduced input at no cost (to the least loaded rank).
  std::vector<double> costs = p.group_macs;
  for (int state : g.concat)
    if (state < 2) costs.push_back(0.0);
  const std::vector<int64_t> owners = branch_owners(costs, ranks);
  for (int n : group) p.node_owner.push_back(owners[static_cast<size_t>(n)]);
  size_t joined_input = p.group_macs.size();
  for (int state : g.concat)
    p.join_owner.push_back(state < 2 ? owners[joined_input++]
                                     : p.node_owner[static_cast<size_t>(state - 2)]);
  p.most_loaded = most_loaded_rank(costs, owners, ranks);
  return p;
}

std::vector<int64_t> branch_owners(const std::vector<double>& macs, int64_t ranks) {
  std::vector<size_t> order(macs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return macs[a] > macs[b]; });
  std::vector<double> load(static_cast<size_t>(ranks), 0.0);
  std::vector<int64_t> owner(macs.size(), 0);
  for (size_t b : order) {
    const auto least = std::min_element(load.begin(), load.end());
    owner[b] = least - load.begin();
    *least += macs[b];
  }
  return owner;
}

int64_t most_loaded_rank(const std::vector<double>& macs, const std::vector<int64_t>& owners,
                         int64_t ranks) {
  std::vector<double> load(static_cast<size_t>(ranks), 0.0);
  for (size_t b = 0; b < macs.size(); ++b) load[static_cast<size_t>(owners[b])] += macs[b];
  return std::max_element(load.begin(), load.end()) - load.begin();
}

int64_t branch_gather_block(const std::vector<int64_t>& parts) {
  return parts.empty() ? 0 : *std::max_element(parts.begin(), parts.end());
}

}  // namespace sextant::spec
