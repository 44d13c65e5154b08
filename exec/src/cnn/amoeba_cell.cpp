// AmoebaNet-D's cell as a unit tape (amoeba_cell.hpp).
#include "amoeba_cell.hpp"

#include <fmt/format.h>

#include <array>
#include <vector>

#include "sextant/spec/amoeba_cell.hpp"
#include "sextant/spec/branch_parallel.hpp"
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
                     bool reduction_prev, int64_t filters, bool reduction, int64_t batch,
                     int64_t ranks, int64_t rank) {
  UnitTape t(name, layer, batch);
  spec::CnnLayer cell;
  cell.kind = spec::CnnLayerKind::kAmoebaCell;
  cell.filters = filters;
  cell.reduction = reduction;
  const bool split = ranks > 1;
  const spec::CellPlacement placed = spec::amoeba_placement(cell, prev.h, prev.w, ranks);
  // torchgpipe's Cell: the previous output through relu_conv_bn to `filters` channels; the one
  // before it through a factorized reduction after a reduction cell, through relu_conv_bn when
  // its channels differ, else as it is (models::add_amoeba_cell, in the same order and names).
  // Split, every rank reduces both (their parameters whole on each).
  const int in1 = t.input(prev), in2 = t.input(prev_prev);
  t.set_replicated(split);
  std::vector<int> states;
  states.push_back(amoeba_relu_conv_bn(t, name + ".reduce1", in1, filters, 1, 1, 1, 1));
  states.push_back(
      amoeba_steps(t, name + ".reduce2",
                   spec::amoeba_second_input_steps(reduction_prev, prev_prev.c, filters), in2));
  t.set_replicated(false);
  // Each rank's nodes add their part of the reduced states' gradients: summed before the
  // reductions' backward, which then runs alike on every rank.
  if (split) t.branch_sum({states[0], states[1]});
  const spec::AmoebaGenotype& g = spec::amoeba_genotype(reduction);
  for (size_t node = 0; node < g.edges.size() / 2; ++node) {
    if (placed.node_owner[node] != rank) {
      states.push_back(-1);  // another rank's node (its group reads it there)
      continue;
    }
    std::array<int, 2> made{};
    for (size_t k = 0; k < 2; ++k) {
      const spec::AmoebaEdge& e = g.edges[2 * node + k];
      const int in = states.at(static_cast<size_t>(e.input));
      SEXTANT_CHECK(in >= 0, "{} node {}: reads another rank's state {}", name, node, e.input);
      made[k] = amoeba_steps(
          t, fmt::format("{}.node{}.{}", name, node, k == 0 ? "a" : "b"),
          spec::amoeba_edge_steps(e.op, t.map(in).c, spec::amoeba_edge_stride(reduction, e)), in);
    }
    states.push_back(t.add(fmt::format("{}.node{}", name, node), made[0], made[1]));
  }
  // The joined states, all of `filters` channels on the nodes' maps: split, each rank's part of
  // the join all-gathered.
  std::vector<int> mine;
  std::vector<UnitTape::BranchPart> parts;
  for (size_t i = 0; i < g.concat.size(); ++i) {
    const int64_t owner = split ? placed.join_owner[i] : 0;
    parts.push_back({filters, owner});
    if (owner == rank) mine.push_back(states.at(static_cast<size_t>(g.concat[i])));
  }
  const CellMap joined = reduction ? CellMap{filters, prev.h / 2, prev.w / 2} : prev;
  const int out =
      split ? t.branch_gather(name, mine, parts, rank, ranks, joined) : t.concat(name, mine);
  SEXTANT_CHECK(t.map(out).c == spec::amoeba_output_channels(filters, reduction),
                "{}: joins {} channels", name, t.map(out).c);
  t.finish();
  return t;
}

}  // namespace sextant::exec
