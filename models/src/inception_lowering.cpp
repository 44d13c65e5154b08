// An Inception-v3 module lowered to ops through unit_builder.hpp, in the executor's order.
#include "inception_lowering.hpp"

#include "sextant/spec/inception_module.hpp"

namespace sextant::models {

namespace {

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
                             CellMap in, int64_t B, int64_t e) {
  UnitBuilder b(layer, B, e);
  const auto branches = spec::inception_branches(l.module, in.c, l.width, l.divisor);
  CellMap out{0, 0, 0};
  for (size_t i = 0; i < branches.size(); ++i) {
    CellMap m = in;
    for (size_t j = 0; j < branches[i].steps.size(); ++j)
      m = lower_step(b, spec::inception_step_scope(name, i, j), branches[i].steps[j], m);
    if (!branches[i].split.empty()) {
      CellMap joined{0, 0, 0};
      for (size_t k = 0; k < branches[i].split.size(); ++k) {
        CellMap part = m;
        for (size_t j = 0; j < branches[i].split[k].size(); ++j)
          part = lower_step(b, spec::inception_split_scope(name, i, k, j), branches[i].split[k][j],
                            part);
        joined = {joined.c + part.c, part.h, part.w};
      }
      b.join(spec::inception_branch_scope(name, i), joined);
      m = joined;
    }
    out = {out.c + m.c, m.h, m.w};
  }
  b.join(name, out);
  return out;
}

}  // namespace sextant::models
