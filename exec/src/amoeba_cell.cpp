// AmoebaNet-D's cell as a unit tape (amoeba_cell.hpp).
#include "amoeba_cell.hpp"

#include <fmt/format.h>

#include <array>
#include <vector>

#include "sextant/spec/amoeba_cell.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {

namespace {

// ReLU, convolution padded by half its window, batch norm (torchgpipe's relu_conv_bn).
int amoeba_relu_conv_bn(UnitTape& t, const std::string& name, int in, int64_t out_c, int64_t kh,
                        int64_t kw, int64_t sh, int64_t sw) {
  const int a = t.relu(name, in);
  return t.batch_norm(
      name, t.conv(name, name + ".weight", a, out_c, kh, kw, sh, sw, (kh - 1) / 2, (kw - 1) / 2));
}

// ReLU; two 1x1 convolutions of stride 2 to out_c / 2, the second on the map shifted by a pixel
// (pad(x[:, :, 1:, 1:]), zeros past the edge); joined; batch norm.
int factorized_reduce(UnitTape& t, const std::string& name, int in, int64_t out_c) {
  const int a = t.relu(name, in);
  const int first = t.conv(name + ".conv1", name + ".conv1.weight", a, out_c / 2, 1, 1, 2, 2, 0, 0);
  const int shifted = t.shift(a, 1);
  const int second =
      t.conv(name + ".conv2", name + ".conv2.weight", shifted, out_c / 2, 1, 1, 2, 2, 0, 0);
  return t.batch_norm(name, t.concat(name, {first, second}));
}

// The steps of an edge's operation or of the second input's reduction (spec::AmoebaStep).
int amoeba_steps(UnitTape& t, const std::string& name, const std::vector<spec::AmoebaStep>& list,
                 int in) {
  using K = spec::AmoebaStep::Kind;
  for (const spec::AmoebaStep& st : list) {
    switch (st.kind) {
      case K::kReluConvBn:
        in = amoeba_relu_conv_bn(t, name + st.suffix, in, st.channels, st.kh, st.kw, st.sh, st.sw);
        break;
      case K::kMaxPool:
        in = t.pool(name, UnitTape::Pool::kMax, in, st.kh, st.sh, st.padding);
        break;
      case K::kAvgPool:
        in = t.pool(name, UnitTape::Pool::kAvgExcludingPadding, in, st.kh, st.sh, st.padding);
        break;
      case K::kFactorizedReduce:
        in = factorized_reduce(t, name, in, st.channels);
        break;
    }
  }
  return in;
}

}  // namespace

UnitTape amoeba_cell(const std::string& name, int32_t layer, CellMap prev, CellMap prev_prev,
                     bool reduction_prev, int64_t filters, bool reduction, int64_t batch) {
  UnitTape t(name, layer, batch);
  // torchgpipe's Cell: the previous output through relu_conv_bn to `filters` channels; the one
  // before it through a factorized reduction after a reduction cell, through relu_conv_bn when
  // its channels differ, else as it is (models::add_amoeba_cell, in the same order and names).
  const int in1 = t.input(prev), in2 = t.input(prev_prev);
  std::vector<int> states;
  states.push_back(amoeba_relu_conv_bn(t, name + ".reduce1", in1, filters, 1, 1, 1, 1));
  states.push_back(
      amoeba_steps(t, name + ".reduce2",
                   spec::amoeba_second_input_steps(reduction_prev, prev_prev.c, filters), in2));
  const spec::AmoebaGenotype& g = spec::amoeba_genotype(reduction);
  for (size_t node = 0; node < g.edges.size() / 2; ++node) {
    std::array<int, 2> made{};
    for (size_t k = 0; k < 2; ++k) {
      const spec::AmoebaEdge& e = g.edges[2 * node + k];
      const int in = states.at(static_cast<size_t>(e.input));
      made[k] = amoeba_steps(
          t, fmt::format("{}.node{}.{}", name, node, k == 0 ? "a" : "b"),
          spec::amoeba_edge_steps(e.op, t.map(in).c, spec::amoeba_edge_stride(reduction, e)), in);
    }
    states.push_back(t.add(fmt::format("{}.node{}", name, node), made[0], made[1]));
  }
  std::vector<int> joined;
  for (int state : g.concat) joined.push_back(states.at(static_cast<size_t>(state)));
  const int out = t.concat(name, joined);
  SEXTANT_CHECK(t.map(out).c == spec::amoeba_output_channels(filters, reduction),
                "{}: joins {} channels", name, t.map(out).c);
  t.finish();
  return t;
}

}  // namespace sextant::exec
