// An Inception-v3 module lowered to ops through unit_builder.hpp, in the executor's order.
#include "inception_lowering.hpp"

#include "lowering_ops.hpp"
#include "sextant/spec/branch_parallel.hpp"
#include "sextant/spec/inception_module.hpp"

namespace sextant::models {

namespace {

// One branch step: a convolution with batch norm and ReLU (BasicConv2d), or a pool.
// One branch step: a convolution with batch norm and ReLU (BasicConv2d), or a pool.
CellMap lower_step(UnitBuilder& b, const std::string& scope, const spec::InceptionStep& st,
                   const CellMap& in) {
  if (st.kind != spec::InceptionStep::Kind::kConvBnRelu)
    return b.pool(scope, in, st.kh, st.sh, st.ph);
  const CellMap o =
      b.conv_bn_padded(scope, in, st.channels, st.kh, st.kw, st.sh, st.sw, st.ph, st.pw);
  b.relu(scope, o);
  return o;
}

}  // namespace

CellMap add_inception_module(Layer& layer, const std::string& name, const spec::CnnLayer& l,
                             CellMap in, int64_t B, int64_t e, const BranchShare& share,
                             BranchJoin& join) {
  UnitBuilder b(layer, B, e);
  const auto branches = spec::inception_branches(l.module, in.c, l.width, l.divisor);
  const std::vector<spec::BranchOutput> made =
      spec::inception_branch_outputs(l, {in.c, 1, in.h, in.w});
  CellMap out{0, 0, 0};
  std::vector<int64_t> rank_channels(static_cast<size_t>(share.ranks), 0);
  for (size_t i = 0; i < branches.size(); ++i) {
    const int64_t owner = share.ranks > 1 ? share.owners.at(i) : 0;
    const CellMap m{made[i].map.c, made[i].map.h, made[i].map.w};
    rank_channels[static_cast<size_t>(owner)] += m.c;
    out = {out.c + m.c, m.h, m.w};
    if (owner != share.rank) continue;  // another rank's branch: its channels in the join
    CellMap v = in;
    for (size_t j = 0; j < branches[i].steps.size(); ++j)
      v = lower_step(b, spec::inception_step_scope(name, i, j), branches[i].steps[j], v);
    if (branches[i].split.empty()) continue;
    for (size_t k = 0; k < branches[i].split.size(); ++k) {
      CellMap part = v;
      for (size_t j = 0; j < branches[i].split[k].size(); ++j)
        part = lower_step(b, spec::inception_split_scope(name, i, k, j), branches[i].split[k][j],
                          part);
    }
    b.join(spec::inception_branch_scope(name, i), m);
  }
  if (share.ranks > 1) {
    // Each rank's branch outputs, all-gathered in blocks of the largest rank's channels.
    const Op op =
        comm_op(OpName(name, OpId::kUnitBranchAllGather), spec::CollectiveKind::kAllGather,
                share.ranks * spec::branch_gather_block(rank_channels) * B * out.h * out.w * e);
    layer.forward.push_back(op);
    join.gather = op.name;
    join.sum_bytes = B * in.c * in.h * in.w * e;  // the input's gradient
  }
  b.join(name, out);
  return out;
}

}  // namespace sextant::models
