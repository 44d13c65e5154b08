// Small models built in code for simulator tests.
#pragma once

#include "sextant/spec/model_spec.hpp"

namespace sextant::test {

// An MLP of `layers` identical square linear layers of `width`: every pipeline stage with the
// same number of layers costs the same.
inline spec::ModelSpec uniform_mlp(int64_t layers, int64_t width) {
  spec::ModelSpec m;
  m.name = "uniform-mlp";
  spec::MlpSpec mlp;
  mlp.widths.assign(static_cast<size_t>(layers + 1), width);
  mlp.activation = spec::Activation::kRelu;
  mlp.bias = false;
  m.body = mlp;
  return m;
}

inline spec::Plan make_plan(int64_t dp, int64_t tp, int64_t pp, int64_t micro_batch,
                            int64_t global_batch) {
  spec::Plan p;
  p.dp = dp;
  p.tp = tp;
  p.pp = pp;
  p.micro_batch = micro_batch;
  p.global_batch = global_batch;
  return p;
}

}  // namespace sextant::test
