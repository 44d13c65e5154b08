// The legal plans for a model on a number of GPUs of a cluster: every factorisation dp*tp*pp with
// tensor parallelism inside a node (unless allowed across), ZeRO stages, sequence parallelism,
// micro-batch sizes that divide the per-replica batch, pipeline schedules with the chunk counts
// that divide the layers, recompute modes, and even or balanced layer splits. What cannot run is
// counted by reason.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::planner {

// A user bound on a plan dimension, e.g. "tp<=8", "pp=1", "zero>=1", "mb<=4".
struct Constraint {
  enum class Dim { kDp, kTp, kPp, kZero, kMicroBatch, kVpp };
  enum class Op { kLess, kLessEqual, kEqual, kGreaterEqual, kGreater };
  Dim dim;
  Op op;
  int64_t value;
  bool allows(const spec::Plan& plan) const;
};
// Parses "tp<=8"; throws InputError naming the flag and listing the dimensions.
Constraint parse_constraint(const std::string& text);

struct SearchRequest {
  spec::ModelSpec model;
  spec::ClusterSpec cluster;
  int64_t gpus = 1;
  int64_t global_batch = 1;
  std::optional<int64_t> seq_len;
  std::vector<Constraint> constraints;
  bool allow_tp_across_nodes = false;
  std::optional<spec::Dtype> dtype;
  std::optional<spec::Stack> stack;  // empty: the cluster kind's default stack
};

struct Enumeration {
  // The candidates, without their stack (a copy each was most of the enumeration's time): every
  // one runs `stack`; with_stack() makes one a complete plan.
  std::vector<spec::Plan> plans;
  spec::Stack stack;
  spec::Plan with_stack(size_t i) const {
    spec::Plan p = plans[i];
    p.stack = stack;
    return p;
  }
  std::map<std::string, int64_t> rejected;  // reason -> count
  int64_t considered = 0;
};

// Checks the request (GPU count, batch, cluster size) and throws InputError with what is wrong.
void check_request(const SearchRequest& request);
Enumeration enumerate_plans(const SearchRequest& request);

// Layers per (virtual) stage that give the first and last stages fewer layers, to make up for the
// embedding and the head they also run. Empty when the even split is already the balanced one.
std::vector<int64_t> balanced_split(int64_t layers, int64_t chunks);

}  // namespace sextant::planner
