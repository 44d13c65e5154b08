// AmoebaNet-D's cell as a tape of steps (amoeba_cell.hpp).
#include "amoeba_cell.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "sextant/exec/conv_kernels.hpp"
#include "sextant/spec/amoeba_cell.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/spatial_split.hpp"

namespace sextant::exec {

namespace {

using models::OpId;
using models::OpName;
using spec::Phase;

}  // namespace

AmoebaCell::AmoebaCell(std::string name, int32_t layer, CellMap prev, CellMap prev_prev,
                       bool reduction_prev, int64_t filters, bool reduction, int64_t batch)
    : name_(std::move(name)), layer_(layer), batch_(batch) {
  // torchgpipe's Cell: the previous output through relu_conv_bn to `filters` channels; the one
  // before it through a factorized reduction after a reduction cell, through relu_conv_bn when
  // its channels differ, else as it is (models::add_amoeba_cell, in the same order and names).
  const int in1 = add_value(prev), in2 = add_value(prev_prev);
  std::vector<int> states;
  states.push_back(relu_conv_bn(name_ + ".reduce1", in1, filters, 1, 1, 1, 1));
  states.push_back(steps(name_ + ".reduce2",
                         spec::amoeba_second_input_steps(reduction_prev, prev_prev.c, filters),
                         in2));
  const spec::AmoebaGenotype& g = spec::amoeba_genotype(reduction);
  for (size_t node = 0; node < g.edges.size() / 2; ++node) {
    std::array<int, 2> made{};
    for (size_t k = 0; k < 2; ++k) {
      const spec::AmoebaEdge& e = g.edges[2 * node + k];
      const int in = states.at(static_cast<size_t>(e.input));
      made[k] = steps(fmt::format("{}.node{}.{}", name_, node, k == 0 ? "a" : "b"),
                      spec::amoeba_edge_steps(e.op, maps_[static_cast<size_t>(in)].c,
                                              spec::amoeba_edge_stride(reduction, e)),
                      in);
    }
    const CellMap a = maps_[static_cast<size_t>(made[0])], b = maps_[static_cast<size_t>(made[1])];
    SEXTANT_CHECK(a.c == b.c && a.h == b.h && a.w == b.w,
                  "{} node {}: its edges make {}x{}x{} and {}x{}x{}", name_, node, a.c, a.h, a.w,
                  b.c, b.h, b.w);
    Step sum;
    sum.kind = Kind::kAdd;
    sum.op = OpName(fmt::format("{}.node{}", name_, node), OpId::kUnitResidual);
    sum.in = {made[0], made[1]};
    sum.out = add_value(a);
    steps_.push_back(sum);
    states.push_back(sum.out);
  }
  Step join;
  join.kind = Kind::kConcat;
  join.op = OpName(name_, OpId::kUnitConcat);
  CellMap out = maps_[static_cast<size_t>(states.at(static_cast<size_t>(g.concat.front())))];
  out.c = 0;
  for (int state : g.concat) {
    join.in.push_back(states.at(static_cast<size_t>(state)));
    out.c += maps_[static_cast<size_t>(join.in.back())].c;
  }
  SEXTANT_CHECK(out.c == spec::amoeba_output_channels(filters, reduction), "{}: joins {} channels",
                name_, out.c);
  join.out = add_value(out);
  steps_.push_back(join);
  out_ = out;
  // Every value a step makes is read by a later one (or is the output), so backward reaches each
  // step with its output's gradient.
  std::vector<bool> read(maps_.size(), false);
  for (const Step& st : steps_)
    for (int v : st.in) read[static_cast<size_t>(v)] = true;
  for (const Step& st : steps_)
    SEXTANT_CHECK(st.out == join.out || read[static_cast<size_t>(st.out)],
                  "{}: value {} is made and never read", name_, st.out);
}

int AmoebaCell::add_value(CellMap m) {
  maps_.push_back(m);
  return static_cast<int>(maps_.size() - 1);
}

int AmoebaCell::relu(const std::string& name, int in) {
  Step s;
  s.kind = Kind::kRelu;
  s.op = OpName(name, OpId::kUnitRelu);
  s.in = {in};
  s.out = add_value(maps_[static_cast<size_t>(in)]);
  steps_.push_back(s);
  return s.out;
}

int AmoebaCell::conv(const std::string& op_scope, const std::string& weight, int in, int64_t out_c,
                     int64_t kh, int64_t kw, int64_t sh, int64_t sw) {
  const CellMap m = maps_[static_cast<size_t>(in)];
  Step s;
  s.kind = Kind::kConv;
  s.op = OpName(op_scope, OpId::kUnitProduct);
  s.in = {in};
  s.param = weight;
  s.kh = kh;
  s.kw = kw;
  s.sh = sh;
  s.sw = sw;
  s.ph = (kh - 1) / 2;
  s.pw = (kw - 1) / 2;
  s.out = add_value(
      {out_c, spec::window_output(m.h, kh, sh, s.ph), spec::window_output(m.w, kw, sw, s.pw)});
  steps_.push_back(s);
  params_.push_back(
      {weight, {out_c, m.c, kh, kw}, std::sqrt(2.0f / static_cast<float>(m.c * kh * kw)), 0.0f});
  return s.out;
}

int AmoebaCell::batch_norm(const std::string& name, int in) {
  const CellMap m = maps_[static_cast<size_t>(in)];
  Step s;
  s.kind = Kind::kBatchNorm;
  s.op = OpName(name, OpId::kUnitBatchNorm);
  s.in = {in};
  s.param = name + ".bn";
  s.out = add_value(m);
  steps_.push_back(s);
  params_.push_back({s.param + ".weight", {m.c}, 0.0f, 1.0f});
  params_.push_back({s.param + ".bias", {m.c}, 0.0f, 0.0f});
  return s.out;
}

int AmoebaCell::relu_conv_bn(const std::string& name, int in, int64_t out_c, int64_t kh, int64_t kw,
                             int64_t sh, int64_t sw) {
  const int a = relu(name, in);
  return batch_norm(name, conv(name, name + ".weight", a, out_c, kh, kw, sh, sw));
}

int AmoebaCell::factorized_reduce(const std::string& name, int in, int64_t out_c) {
  // ReLU; two 1x1 convolutions of stride 2 to out_c / 2, the second on the map shifted by a
  // pixel (pad(x[:, :, 1:, 1:]), zeros past the edge); joined; batch norm.
  const int a = relu(name, in);
  const int first = conv(name + ".conv1", name + ".conv1.weight", a, out_c / 2, 1, 1, 2, 2);
  Step shift;
  shift.kind = Kind::kShift;
  shift.in = {a};
  shift.ph = shift.pw = 1;
  shift.out = add_value(maps_[static_cast<size_t>(a)]);
  steps_.push_back(shift);
  const int second =
      conv(name + ".conv2", name + ".conv2.weight", shift.out, out_c / 2, 1, 1, 2, 2);
  Step join;
  join.kind = Kind::kConcat;
  join.op = OpName(name, OpId::kUnitConcat);
  join.in = {first, second};
  CellMap m = maps_[static_cast<size_t>(first)];
  m.c = out_c;
  join.out = add_value(m);
  steps_.push_back(join);
  return batch_norm(name, join.out);
}

int AmoebaCell::pool(const std::string& name, Kind kind, int in, int64_t k, int64_t s, int64_t p) {
  const CellMap m = maps_[static_cast<size_t>(in)];
  Step st;
  st.kind = kind;
  st.op = OpName(name, OpId::kUnitPool);
  st.in = {in};
  st.kh = st.kw = k;
  st.sh = st.sw = s;
  st.ph = st.pw = p;
  st.out = add_value({m.c, spec::window_output(m.h, k, s, p), spec::window_output(m.w, k, s, p)});
  steps_.push_back(st);
  return st.out;
}

int AmoebaCell::steps(const std::string& name, const std::vector<spec::AmoebaStep>& list, int in) {
  using K = spec::AmoebaStep::Kind;
  for (const spec::AmoebaStep& st : list) {
    switch (st.kind) {
      case K::kReluConvBn:
        in = relu_conv_bn(name + st.suffix, in, st.channels, st.kh, st.kw, st.sh, st.sw);
        break;
      case K::kMaxPool:
        in = pool(name, Kind::kMaxPool, in, st.kh, st.sh, st.padding);
        break;
      case K::kAvgPool:
        in = pool(name, Kind::kAvgPool, in, st.kh, st.sh, st.padding);
        break;
      case K::kFactorizedReduce:
        in = factorized_reduce(name, in, st.channels);
        break;
    }
  }
  return in;
}

void AmoebaCell::add_params(std::vector<ParamSpec>& specs, uint64_t seed) const {
  for (const ParamDef& p : params_) {
    ParamSpec s;
    s.name = p.name;
    s.layer = layer_;
    s.shape = p.shape;
    if (p.std_dev > 0) {
      s.init = [seed, name = p.name, std_dev = p.std_dev](int64_t i) {
        return std_dev * init_normal(seed, name, i);
      };
    } else {
      s.init = [value = p.value](int64_t) { return value; };
      s.decay = false;
    }
    specs.push_back(std::move(s));
  }
}

std::vector<int64_t> AmoebaCell::shape(int value) const {
  const CellMap& m = maps_[static_cast<size_t>(value)];
  return {batch_, m.c, m.h, m.w};
}

Tensor AmoebaCell::forward(Context& ctx, ParamStore& params, const Tensor& prev,
                           const Tensor& prev_prev, int64_t micro_batch, Cache& cache) const {
  SEXTANT_CHECK(prev.shape() == shape(0) && prev_prev.shape() == shape(1),
                "{}: inputs of {} and {} elements", name_, prev.numel(), prev_prev.numel());
  cache.values.assign(maps_.size(), Tensor());
  cache.saved.assign(steps_.size(), Tensor());
  cache.stats.assign(steps_.size(), Tensor());
  cache.values[0] = prev;
  cache.values[1] = prev_prev;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& step = steps_[i];
    if (step.op) {
      auto s = ctx.recorder->scope(ctx.op(*step.op, layer_, Phase::kFwd, micro_batch));
      cache.values[static_cast<size_t>(step.out)] = run(ctx, params, step, i, micro_batch, cache);
    } else {
      cache.values[static_cast<size_t>(step.out)] = run(ctx, params, step, i, micro_batch, cache);
    }
  }
  return cache.values[static_cast<size_t>(steps_.back().out)];
}

Tensor AmoebaCell::run(Context& ctx, ParamStore& params, const Step& step, size_t index,
                       int64_t /*mb*/, Cache& cache) const {
  Backend& be = *ctx.backend;
  const Tensor& x = cache.values[static_cast<size_t>(step.in.front())];
  Tensor y = be.empty(shape(step.out));
  // A window's input grown by its padding (filled with `fill`), or x itself.
  auto padded = [&](float fill) {
    if (step.ph == 0 && step.pw == 0) return x;
    Tensor t = be.empty({x.dim(0), x.dim(1), x.dim(2) + 2 * step.ph, x.dim(3) + 2 * step.pw});
    conv::shift_map(x, -step.ph, -step.pw, fill, t);
    return t;
  };
  switch (step.kind) {
    case Kind::kRelu:
      be.relu(x, y);
      break;
    case Kind::kConv:
      cache.saved[index] = padded(0.0f);
      conv::convolution(cache.saved[index], params.get(step.param).compute, nullptr,
                        conv::Strides{step.sh, step.sw}, y);
      break;
    case Kind::kBatchNorm:
      cache.stats[index] = be.empty({4 * x.dim(1)});
      be.batch_norm_whole(x, params.get(step.param + ".weight").compute,
                          params.get(step.param + ".bias").compute, y, cache.stats[index]);
      break;
    case Kind::kMaxPool:
      cache.saved[index] = padded(-std::numeric_limits<float>::infinity());
      be.max_pool(cache.saved[index], step.kh, step.sh, y);
      break;
    case Kind::kAvgPool:
      conv::avg_pool_excluding_padding(x, step.kh, step.sh, step.ph, y);
      break;
    case Kind::kShift:
      conv::shift_map(x, step.ph, step.pw, 0.0f, y);
      break;
    case Kind::kConcat: {
      std::vector<Tensor> parts;
      for (int v : step.in) parts.push_back(cache.values[static_cast<size_t>(v)]);
      conv::concat_channels(parts, y);
      break;
    }
    case Kind::kAdd:
      be.add(x, cache.values[static_cast<size_t>(step.in[1])], y);
      break;
  }
  return y;
}

std::pair<Tensor, Tensor> AmoebaCell::backward(Context& ctx, ParamStore& params, const Tensor& dout,
                                               int64_t micro_batch, Cache& cache) const {
  SEXTANT_CHECK(dout.shape() == shape(steps_.back().out), "{}: an output gradient of {} elements",
                name_, dout.numel());
  std::vector<Tensor> grads(maps_.size());
  grads[static_cast<size_t>(steps_.back().out)] = dout;
  for (size_t i = steps_.size(); i-- > 0;) {
    const Step& step = steps_[i];
    Tensor& dy = grads[static_cast<size_t>(step.out)];
    SEXTANT_CHECK(!dy.empty(), "{}: value {} has no gradient", name_, step.out);
    if (step.op) {
      auto s = ctx.recorder->scope(ctx.op(*step.op, layer_, Phase::kBwd, micro_batch));
      run_backward(ctx, params, step, i, micro_batch, cache, grads);
    } else {
      run_backward(ctx, params, step, i, micro_batch, cache, grads);
    }
    grads[static_cast<size_t>(step.out)] = Tensor();
    cache.values[static_cast<size_t>(step.out)] = Tensor();
    cache.saved[i] = cache.stats[i] = Tensor();
  }
  cache = Cache{};
  for (int v : {0, 1})
    if (grads[static_cast<size_t>(v)].empty())
      grads[static_cast<size_t>(v)] = ctx.backend->zeros(shape(v));
  return {grads[0], grads[1]};
}

void AmoebaCell::run_backward(Context& ctx, ParamStore& params, const Step& step, size_t index,
                              int64_t /*mb*/, Cache& cache, std::vector<Tensor>& grads) const {
  Backend& be = *ctx.backend;
  const Tensor& dy = grads[static_cast<size_t>(step.out)];
  const int in = step.in.front();
  const Tensor& x = cache.values[static_cast<size_t>(in)];
  // Adds t to value v's gradient (a value read by several steps sums their gradients; a new
  // tensor each time, as gradients may be shared).
  auto accumulate = [&](int v, const Tensor& t) {
    Tensor& g = grads[static_cast<size_t>(v)];
    if (g.empty()) {
      g = t;
      return;
    }
    Tensor sum = be.empty(g.shape());
    be.add(g, t, sum);
    g = sum;
  };
  // The gradient of x from its padded window's.
  auto unpadded = [&](const Tensor& dwindow) {
    if (step.ph == 0 && step.pw == 0) return dwindow;
    Tensor dx = be.empty(x.shape());
    conv::shift_map_backward(dwindow, -step.ph, -step.pw, dx);
    return dx;
  };
  Tensor dx = be.empty(x.shape());
  switch (step.kind) {
    case Kind::kRelu:
      be.relu_backward(x, dy, dx);
      break;
    case Kind::kConv: {
      Param& w = params.get(step.param);
      Tensor dwindow = be.empty(cache.saved[index].shape());
      conv::convolution_backward(cache.saved[index], w.compute, dy, conv::Strides{step.sh, step.sw},
                                 &dwindow, w.grad, nullptr);
      dx = unpadded(dwindow);
      break;
    }
    case Kind::kBatchNorm: {
      Tensor dgamma = params.get(step.param + ".weight").grad;
      Tensor dbeta = params.get(step.param + ".bias").grad;
      be.batch_norm_whole_backward(x, dy, params.get(step.param + ".weight").compute,
                                   cache.stats[index], dx, dgamma, dbeta);
      break;
    }
    case Kind::kMaxPool: {
      Tensor dwindow = be.empty(cache.saved[index].shape());
      be.max_pool_backward(cache.saved[index], cache.values[static_cast<size_t>(step.out)], dy,
                           step.kh, step.sh, dwindow);
      dx = unpadded(dwindow);
      break;
    }
    case Kind::kAvgPool:
      conv::avg_pool_excluding_padding_backward(dy, step.kh, step.sh, step.ph, dx);
      break;
    case Kind::kShift:
      conv::shift_map_backward(dy, step.ph, step.pw, dx);
      break;
    case Kind::kConcat: {
      std::vector<Tensor> parts;
      for (int v : step.in) parts.push_back(be.empty(shape(v)));
      conv::split_channels(dy, parts);
      for (size_t k = 0; k < parts.size(); ++k) accumulate(step.in[k], parts[k]);
      return;
    }
    case Kind::kAdd:
      accumulate(step.in[0], dy);
      accumulate(step.in[1], dy);
      return;
  }
  accumulate(in, dx);
}

}  // namespace sextant::exec
