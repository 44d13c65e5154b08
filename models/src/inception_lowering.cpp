// An Inception-v3 module lowered to ops through unit_builder.hpp, in the executor's order.
#include "inception_lowering.hpp"

#include "lowering_ops.hpp"
#include "sextant/spec/branch_parallel.hpp"
#include "sextant/spec/inception_module.hpp"

namespace sextant::models {

namespace {

// One branch step: a convolution with batch norm and ReLU (BasicConv2d), or a pool.
// (No builder: a branch another rank runs, of which only the map is followed.)
CellMap lower_step(UnitBuilder* b, const std::string& scope, const spec::InceptionStep& st,
                   const CellMap& in) {
  const bool conv = st.kind == spec::InceptionStep::Kind::kConvBnRelu;
  const CellMap o{conv ? st.channels : in.c, spec::window_output(in.h, st.kh, st.sh, st.ph),
                  spec::window_output(in.w, st.kw, st.sw, st.pw)};
  if (b == nullptr) return o;
  if (!conv) return b->pool(scope, in, st.kh, st.sh, st.ph);
  b->conv_bn_padded(scope, in, st.channels, st.kh, st.kw, st.sh, st.sw, st.ph, st.pw);
  b->relu(scope, o);
  return o;
}

}  // namespace

CellMap add_inception_module(Layer& layer, const std::string& name, const spec::CnnLayer& l,
                             CellMap in, int64_t B, int64_t e, const BranchShare& share,
                             BranchJoin& join) {
  UnitBuilder b(layer, B, e);
  const auto branches = spec::inception_branches(l.module, in.c, l.width, l.divisor);
  CellMap out{0, 0, 0};
  std::vector<int64_t> rank_channels(static_cast<size_t>(share.ranks), 0);
  for (size_t i = 0; i < branches.size(); ++i) {
    const int64_t owner = share.ranks > 1 ? share.owners.at(i) : 0;
    // A branch another rank runs adds only its channels to the join.
    UnitBuilder* own = owner == share.rank ? &b : nullptr;
    CellMap m = in;
    for (size_t j = 0; j < branches[i].steps.size(); ++j)
      m = lower_step(own, spec::inception_step_scope(name, i, j), branches[i].steps[j], m);
    if (!branches[i].split.empty()) {
      CellMap joined{0, 0, 0};
      for (size_t k = 0; k < branches[i].split.size(); ++k) {
        CellMap part = m;
        for (size_t j = 0; j < branches[i].split[k].size(); ++j)
          part = lower_step(own, spec::inception_split_scope(name, i, k, j),
                            branches[i].split[k][j], part);
        joined = {joined.c + part.c, part.h, part.w};
      }
      if (own != nullptr) b.join(spec::inception_branch_scope(name, i), joined);
      m = joined;
    }
    rank_channels[static_cast<size_t>(owner)] += m.c;
    out = {out.c + m.c, m.h, m.w};
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
