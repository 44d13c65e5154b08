// SUPER's branch split of Inception's modules: rules and placement (branch_parallel.hpp).
#include "sextant/spec/branch_parallel.hpp"

#include <algorithm>
#include <numeric>

#include "sextant/spec/inception_module.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::spec {

std::string branch_parallel_problem(const ModelSpec& model, const Plan& plan) {
  if (!plan.branch_parallel) return "";
  if (model.kind() != ModelKind::kCnn || !model.cnn().has_inception())
    return "splits the branches of a CNN's Inception modules (SUPER): this model has none";
  for (const CnnLayer& l : model.cnn().layers)
    if (l.kind == CnnLayerKind::kAmoebaCell)
      return "splits Inception modules' independent branches: AmoebaNet's cells, whose nodes "
             "read each other's states, are not split";
  if (plan.tp < 2 || plan.tp > kMaxBranchRanks)
    return "needs 2 to 4 tp ranks, at most a module's branches";
  if (plan.spatial.any() || !plan.channel_algorithms.empty() || !plan.per_op.empty() ||
      plan.tp_grid.any())
    return "keeps every map whole on its tp ranks: no spatial split, channel algorithms, per-op "
           "splits or tensor grid";
  return "";
}

std::vector<double> inception_branch_macs(const CnnLayer& l, const CnnMap& in) {
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
  std::vector<double> out;
  for (const InceptionBranch& b : inception_branches(l.module, in.c, l.width, l.divisor)) {
    double macs = 0;
    const CnnMap m = walk(b.steps, in, macs);
    for (const auto& part : b.split) walk(part, m, macs);
    out.push_back(macs);
  }
  return out;
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
