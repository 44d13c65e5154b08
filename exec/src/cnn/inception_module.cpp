// An Inception-v3 module as a unit tape (inception_module.hpp).
#include "inception_module.hpp"

#include <vector>

#include "sextant/spec/branch_parallel.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/inception_module.hpp"

namespace sextant::exec {

namespace {

// One branch step: a convolution, batch norm and ReLU (torchvision's BasicConv2d), or a pool.
int inception_step(UnitTape& t, const std::string& scope, const spec::InceptionStep& st, int in) {
  using K = spec::InceptionStep::Kind;
  switch (st.kind) {
    case K::kMaxPool:
      return t.pool(scope, UnitTape::Pool::kMax, in, st.kh, st.sh, st.ph);
    case K::kAvgPool:
      return t.pool(scope, UnitTape::Pool::kAvgIncludingPadding, in, st.kh, st.sh, st.ph);
    case K::kConvBnRelu:
      break;
  }
  const int y =
      t.conv(scope, scope + ".weight", in, st.channels, st.kh, st.kw, st.sh, st.sw, st.ph, st.pw);
  return t.relu(scope, t.batch_norm(scope, y));
}

}  // namespace

UnitTape inception_module(const std::string& name, int32_t layer, const spec::CnnLayer& l,
                          CellMap in, int64_t batch, int64_t ranks, int64_t rank) {
  UnitTape t(name, layer, batch);
  const int x = t.input(in);
  const auto branches = spec::inception_branches(l.module, in.c, l.width, l.divisor);
  const std::vector<spec::BranchOutput> made =
      spec::inception_branch_outputs(l, {in.c, 1, in.h, in.w});
  std::vector<double> macs;
  for (const spec::BranchOutput& o : made) macs.push_back(o.macs);
  const std::vector<int64_t> owners =
      ranks > 1 ? spec::branch_owners(macs, ranks) : std::vector<int64_t>(made.size(), 0);
  // Each rank's branches add their part of the input's gradient: summed over the ranks (the first
  // layer's input needs none).
  if (ranks > 1 && layer > 0) t.branch_sum({x});
  std::vector<int> outputs;
  std::vector<UnitTape::BranchPart> parts;
  for (size_t i = 0; i < branches.size(); ++i) {
    parts.push_back({made[i].map.c, owners[i]});
    if (owners[i] != rank) continue;  // another rank's branch: its channels in the join
    int v = x;
    for (size_t j = 0; j < branches[i].steps.size(); ++j)
      v = inception_step(t, spec::inception_step_scope(name, i, j), branches[i].steps[j], v);
    if (!branches[i].split.empty()) {
      std::vector<int> split;
      for (size_t k = 0; k < branches[i].split.size(); ++k) {
        int part = v;
        for (size_t j = 0; j < branches[i].split[k].size(); ++j)
          part = inception_step(t, spec::inception_split_scope(name, i, k, j),
                                branches[i].split[k][j], part);
        split.push_back(part);
      }
      v = t.concat(spec::inception_branch_scope(name, i), split);
    }
    outputs.push_back(v);
  }
  const spec::CnnMap& last = made.back().map;
  const int out =
      ranks > 1 ? t.branch_gather(name, outputs, parts, rank, ranks, CellMap{0, last.h, last.w})
                : t.concat(name, outputs);
  SEXTANT_CHECK(t.map(out).c == spec::inception_output_channels(l.module, in.c, l.width, l.divisor),
                "{}: joins {} channels", name, t.map(out).c);
  t.finish();
  return t;
}

}  // namespace sextant::exec
