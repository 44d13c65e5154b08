// A multi-branch unit as a tape of steps (unit_tape.hpp).
#include "unit_tape.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "sextant/exec/conv_kernels.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/model_spec.hpp"

namespace sextant::exec {

namespace {

using models::OpId;
using models::OpName;
using spec::Phase;

}  // namespace

UnitTape::UnitTape(std::string name, int32_t layer, int64_t batch)
    : name_(std::move(name)), layer_(layer), batch_(batch) {}

int UnitTape::add_value(CellMap m) {
  maps_.push_back(m);
  return static_cast<int>(maps_.size() - 1);
}

int UnitTape::push(Step step, CellMap made) {
  step.out = add_value(made);
  steps_.push_back(std::move(step));
  return steps_.back().out;
}

int UnitTape::input(CellMap m) {
  SEXTANT_CHECK(steps_.empty() && inputs_ == static_cast<int>(maps_.size()),
                "{}: inputs come before every step", name_);
  ++inputs_;
  return add_value(m);
}

int UnitTape::relu(const std::string& name, int in) {
  Step s;
  s.kind = Kind::kRelu;
  s.op = OpName(name, OpId::kUnitRelu);
  s.in = {in};
  return push(s, map(in));
}

int UnitTape::conv(const std::string& op_scope, const std::string& weight, int in, int64_t out_c,
                   int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  const CellMap m = map(in);
  Step s;
  s.kind = Kind::kConv;
  s.op = OpName(op_scope, OpId::kUnitProduct);
  s.in = {in};
  s.param = weight;
  s.kh = kh;
  s.kw = kw;
  s.sh = sh;
  s.sw = sw;
  s.ph = ph;
  s.pw = pw;
  params_.push_back({weight,
                     {out_c, m.c, kh, kw},
                     std::sqrt(2.0f / static_cast<float>(m.c * kh * kw)),
                     0.0f,
                     replicated_});
  return push(s,
              {out_c, spec::window_output(m.h, kh, sh, ph), spec::window_output(m.w, kw, sw, pw)});
}

int UnitTape::batch_norm(const std::string& name, int in) {
  const CellMap m = map(in);
  Step s;
  s.kind = Kind::kBatchNorm;
  s.op = OpName(name, OpId::kUnitBatchNorm);
  s.in = {in};
  s.param = name + ".bn";
  params_.push_back({s.param + ".weight", {m.c}, 0.0f, 1.0f, replicated_});
  params_.push_back({s.param + ".bias", {m.c}, 0.0f, 0.0f, replicated_});
  return push(s, m);
}

int UnitTape::pool(const std::string& name, Pool kind, int in, int64_t k, int64_t s, int64_t p) {
  const CellMap m = map(in);
  Step st;
  st.kind = kind == Pool::kMax                   ? Kind::kMaxPool
            : kind == Pool::kAvgExcludingPadding ? Kind::kAvgPool
                                                 : Kind::kAvgPoolPadded;
  st.op = OpName(name, OpId::kUnitPool);
  st.in = {in};
  st.kh = st.kw = k;
  st.sh = st.sw = s;
  st.ph = st.pw = p;
  return push(st, {m.c, spec::window_output(m.h, k, s, p), spec::window_output(m.w, k, s, p)});
}

int UnitTape::shift(int in, int64_t by) {
  Step s;
  s.kind = Kind::kShift;
  s.in = {in};
  s.ph = s.pw = by;
  return push(s, map(in));
}

int UnitTape::concat(const std::string& name, const std::vector<int>& in) {
  Step s;
  s.kind = Kind::kConcat;
  s.op = OpName(name, OpId::kUnitConcat);
  s.in = in;
  CellMap joined = map(in.front());
  joined.c = 0;
  for (int v : in) {
    SEXTANT_CHECK(map(v).h == joined.h && map(v).w == joined.w,
                  "{}: joins a {}x{} map to a {}x{} one", name, map(v).h, map(v).w, joined.h,
                  joined.w);
    joined.c += map(v).c;
  }
  return push(s, joined);
}

int UnitTape::add(const std::string& name, int a, int b) {
  const CellMap x = map(a), y = map(b);
  SEXTANT_CHECK(x.c == y.c && x.h == y.h && x.w == y.w, "{}: sums {}x{}x{} and {}x{}x{}", name, x.c,
                x.h, x.w, y.c, y.h, y.w);
  Step s;
  s.kind = Kind::kAdd;
  s.op = OpName(name, OpId::kUnitResidual);
  s.in = {a, b};
  return push(s, x);
}

int UnitTape::branch_gather(const std::string& name, const std::vector<int>& mine,
                            const std::vector<BranchPart>& parts, int64_t rank, int64_t ranks,
                            CellMap joined) {
  Step s;
  s.kind = Kind::kBranchGather;
  s.op = OpName(name, OpId::kUnitConcat);
  s.in = mine;
  s.parts = parts;
  s.rank = rank;
  s.ranks = ranks;
  joined.c = 0;
  size_t k = 0;
  for (const BranchPart& p : parts) {
    joined.c += p.channels;
    if (p.owner != rank) continue;
    SEXTANT_CHECK(k < mine.size() && map(mine[k]).c == p.channels, "{}: branch outputs differ",
                  name);
    ++k;
  }
  SEXTANT_CHECK(k == mine.size(), "{}: {} branch outputs, {} owned", name, mine.size(), k);
  return push(s, joined);
}

void UnitTape::branch_sum(const std::vector<int>& values) {
  Step s;
  s.kind = Kind::kBranchSum;
  s.in = values;
  s.out = -1;  // makes nothing
  steps_.push_back(std::move(s));
}

void UnitTape::finish() const {
  SEXTANT_CHECK(!steps_.empty() && steps_.back().out >= 0, "{}: a unit without an output", name_);
  std::vector<bool> read(maps_.size(), false);  // (a sum gives its values their gradients)
  for (const Step& st : steps_)
    for (int v : st.in) read[static_cast<size_t>(v)] = true;
  for (const Step& st : steps_)
    SEXTANT_CHECK(st.kind == Kind::kBranchSum || st.out == steps_.back().out ||
                      read[static_cast<size_t>(st.out)],
                  "{}: value {} is made and never read", name_, st.out);
}

void UnitTape::add_params(std::vector<ParamSpec>& specs, uint64_t seed) const {
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
    s.tp_replicated = p.replicated;
    s.tp_partial = false;  // whole on each rank: the tape sums their inputs' gradients itself
    specs.push_back(std::move(s));
  }
}

std::vector<int64_t> UnitTape::shape(int value) const {
  const CellMap& m = map(value);
  return {batch_, m.c, m.h, m.w};
}

Tensor UnitTape::forward(Context& ctx, ParamStore& params, const std::vector<Tensor>& inputs,
                         int64_t micro_batch, Cache& cache) const {
  SEXTANT_CHECK(static_cast<int>(inputs.size()) == inputs_, "{}: {} inputs, {} expected", name_,
                inputs.size(), inputs_);
  cache.values.assign(maps_.size(), Tensor());
  cache.saved.assign(steps_.size(), Tensor());
  cache.stats.assign(steps_.size(), Tensor());
  for (int v = 0; v < inputs_; ++v) {
    SEXTANT_CHECK(inputs[static_cast<size_t>(v)].shape() == shape(v), "{}: input {} of {} elements",
                  name_, v, inputs[static_cast<size_t>(v)].numel());
    cache.values[static_cast<size_t>(v)] = inputs[static_cast<size_t>(v)];
  }
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& step = steps_[i];
    if (step.kind == Kind::kBranchSum) continue;  // a backward step
    if (step.kind == Kind::kBranchGather) {
      cache.values[static_cast<size_t>(step.out)] = gather_branches(ctx, step, cache, micro_batch);
    } else if (step.op) {
      auto s = ctx.recorder->scope(ctx.op(*step.op, layer_, Phase::kFwd, micro_batch));
      cache.values[static_cast<size_t>(step.out)] = run(ctx, params, step, i, cache);
    } else {
      cache.values[static_cast<size_t>(step.out)] = run(ctx, params, step, i, cache);
    }
  }
  return cache.values[static_cast<size_t>(steps_.back().out)];
}

Tensor UnitTape::run(Context& ctx, ParamStore& params, const Step& step, size_t index,
                     Cache& cache) const {
  SEXTANT_CHECK(step.kind != Kind::kBranchGather, "{}: a branch gather run as a step", name_);
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
    case Kind::kAvgPoolPadded:
      // Counting the padding: the average of the zero-padded map's windows.
      conv::avg_pool_excluding_padding(padded(0.0f), step.kh, step.sh, 0, y);
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
    case Kind::kBranchGather:
    case Kind::kBranchSum:
      throw std::logic_error("a branch gather or sum runs through its own function");
  }
  return y;
}

std::vector<Tensor> UnitTape::backward(Context& ctx, ParamStore& params, const Tensor& dout,
                                       int64_t micro_batch, Cache& cache) const {
  SEXTANT_CHECK(dout.shape() == shape(steps_.back().out), "{}: an output gradient of {} elements",
                name_, dout.numel());
  std::vector<Tensor> grads(maps_.size());
  grads[static_cast<size_t>(steps_.back().out)] = dout;
  for (size_t i = steps_.size(); i-- > 0;) {
    const Step& step = steps_[i];
    if (step.kind == Kind::kBranchSum) {
      sum_branch_gradients(ctx, step, grads, micro_batch);
      continue;
    }
    SEXTANT_CHECK(!grads[static_cast<size_t>(step.out)].empty(), "{}: value {} has no gradient",
                  name_, step.out);
    if (step.op) {
      auto s = ctx.recorder->scope(ctx.op(*step.op, layer_, Phase::kBwd, micro_batch));
      run_backward(ctx, params, step, i, cache, grads);
    } else {
      run_backward(ctx, params, step, i, cache, grads);
    }
    grads[static_cast<size_t>(step.out)] = Tensor();
    cache.values[static_cast<size_t>(step.out)] = Tensor();
    cache.saved[i] = cache.stats[i] = Tensor();
  }
  cache = Cache{};
  std::vector<Tensor> out;
  for (int v = 0; v < inputs_; ++v) {
    Tensor& g = grads[static_cast<size_t>(v)];
    out.push_back(g.empty() ? ctx.backend->zeros(shape(v)) : g);
  }
  return out;
}

void UnitTape::run_backward(Context& ctx, ParamStore& params, const Step& step, size_t index,
                            Cache& cache, std::vector<Tensor>& grads) const {
  if (step.kind == Kind::kBranchGather) {
    scatter_branch_gradient(ctx, step, grads);
    return;
  }
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
    case Kind::kAvgPoolPadded: {
      Tensor dwindow =
          be.empty({x.dim(0), x.dim(1), x.dim(2) + 2 * step.ph, x.dim(3) + 2 * step.pw});
      conv::avg_pool_excluding_padding_backward(dy, step.kh, step.sh, 0, dwindow);
      dx = unpadded(dwindow);
      break;
    }
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
    case Kind::kBranchGather:
    case Kind::kBranchSum:
      return;  // (above; the sum in backward())
  }
  accumulate(in, dx);
}

namespace {

// Channels each rank's branches of `parts` join.
std::vector<int64_t> rank_channels(const std::vector<UnitTape::BranchPart>& parts, int64_t ranks) {
  std::vector<int64_t> c(static_cast<size_t>(ranks), 0);
  for (const UnitTape::BranchPart& p : parts) c[static_cast<size_t>(p.owner)] += p.channels;
  return c;
}

}  // namespace

Tensor UnitTape::gather_branches(Context& ctx, const Step& step, Cache& cache,
                                 int64_t micro_batch) const {
  // Each rank's block: per sample its branches' channels in branch order, padded to the largest
  // rank's (an all-gather of equal blocks, as the lowering prices it: spec::branch_gather_block).
  const CellMap whole = map(step.out);
  const int64_t hw = whole.h * whole.w;
  const std::vector<int64_t> held = rank_channels(step.parts, step.ranks);
  const int64_t block = batch_ * *std::max_element(held.begin(), held.end()) * hw;
  std::vector<float> send(static_cast<size_t>(block), 0.0f);
  std::vector<float> recv(static_cast<size_t>(block * step.ranks));
  const int64_t mine = held[static_cast<size_t>(step.rank)];
  for (int64_t b = 0; b < batch_; ++b) {
    int64_t at = b * mine * hw;
    for (int v : step.in) {
      const int64_t n = map(v).c * hw;
      const float* from = cache.values[static_cast<size_t>(v)].data() + b * n;
      std::copy(from, from + n, send.begin() + at);
      at += n;
    }
  }
  {
    auto s = ctx.recorder->scope(ctx.comm(
        OpName(name_, OpId::kUnitBranchAllGather), spec::OpClass::kAllGather, spec::Stream::kTpComm,
        step.ranks * block * 4, step.ranks, Phase::kFwd, layer_, micro_batch));
    ctx.groups->tp->all_gather(send.data(), recv.data(), block);
  }
  auto s = ctx.recorder->scope(ctx.op(*step.op, layer_, Phase::kFwd, micro_batch));
  Tensor y = ctx.backend->empty(shape(step.out));
  // Rank q's block holds its branches, in branch order, sample after sample.
  std::vector<int64_t> taken(static_cast<size_t>(step.ranks), 0);  // channels unpacked per rank
  int64_t channel = 0;  // the branch's first channel in the join
  for (const BranchPart& p : step.parts) {
    const size_t q = static_cast<size_t>(p.owner);
    for (int64_t b = 0; b < batch_; ++b) {
      const float* from =
          recv.data() + static_cast<int64_t>(q) * block + (b * held[q] + taken[q]) * hw;
      std::copy(from, from + p.channels * hw, y.data() + (b * whole.c + channel) * hw);
    }
    taken[q] += p.channels;
    channel += p.channels;
  }
  return y;
}

void UnitTape::sum_branch_gradients(Context& ctx, const Step& step, std::vector<Tensor>& grads,
                                    int64_t micro_batch) const {
  // One buffer of every value's gradient (zeros where no step of this rank read it).
  int64_t n = 0;
  for (int v : step.in) n += batch_ * map(v).c * map(v).h * map(v).w;
  std::vector<float> buffer(static_cast<size_t>(n), 0.0f);
  int64_t at = 0;
  for (int v : step.in) {
    const Tensor& g = grads[static_cast<size_t>(v)];
    const int64_t count = batch_ * map(v).c * map(v).h * map(v).w;
    if (!g.empty()) std::copy(g.data(), g.data() + count, buffer.begin() + at);
    at += count;
  }
  {
    auto s = ctx.recorder->scope(ctx.comm(OpName(name_, OpId::kUnitBranchAllReduce),
                                          spec::OpClass::kAllReduce, spec::Stream::kTpComm, n * 4,
                                          ctx.groups->tp_size, Phase::kBwd, layer_, micro_batch));
    ctx.groups->tp->all_reduce(buffer.data(), n);
  }
  at = 0;
  for (int v : step.in) {
    Tensor g = ctx.backend->empty(shape(v));
    std::copy(buffer.begin() + at, buffer.begin() + at + g.numel(), g.data());
    at += g.numel();
    grads[static_cast<size_t>(v)] = g;
  }
}

void UnitTape::scatter_branch_gradient(Context& ctx, const Step& step,
                                       std::vector<Tensor>& grads) const {
  const Tensor& dy = grads[static_cast<size_t>(step.out)];
  const CellMap whole = map(step.out);
  const int64_t hw = whole.h * whole.w;
  int64_t channel = 0;
  size_t k = 0;
  for (const BranchPart& p : step.parts) {
    if (p.owner == step.rank) {
      const int v = step.in[k++];
      Tensor g = ctx.backend->empty(shape(v));
      for (int64_t b = 0; b < batch_; ++b) {
        const float* from = dy.data() + (b * whole.c + channel) * hw;
        std::copy(from, from + p.channels * hw, g.data() + b * p.channels * hw);
      }
      SEXTANT_CHECK(grads[static_cast<size_t>(v)].empty(), "{}: a branch output read twice", name_);
      grads[static_cast<size_t>(v)] = g;
    }
    channel += p.channels;
  }
}

}  // namespace sextant::exec
