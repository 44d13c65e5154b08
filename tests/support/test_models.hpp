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

// The stack simulator tests state unless they test a stack: Sextant's own (unfused attention,
// one kernel per op, DDP buckets overlapped with backward), with gradients reduced in the compute
// dtype so that the textbook byte counts (ZeRO's 2 + 2 + 12) hold.
inline spec::Stack plain_stack() {
  spec::Stack s = spec::builtin_stack("sextant");
  s.grad_dtype.reset();
  return s;
}

inline spec::Plan make_plan(int64_t dp, int64_t tp, int64_t pp, int64_t micro_batch,
                            int64_t global_batch) {
  spec::Plan p;
  p.stack = plain_stack();
  p.dp = dp;
  p.tp = tp;
  p.pp = pp;
  p.micro_batch = micro_batch;
  p.global_batch = global_batch;
  return p;
}

}  // namespace sextant::test
