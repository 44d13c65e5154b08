// A plan's per-operator splits (Plan::per_op; issue 60): for named ops of every transformer block
// (models/block_graph.hpp: norm1, qkv, attention, proj, residual1, norm2, fc1, activation, fc2,
// residual2), the mesh axes splitting each of the op's dimensions, overriding the split the plan's
// uniform layout gives it. The mesh is the plan's: axis "d" of dp ranks (the replicas) and axis
// "t" of tp ranks (the layer group). What the override changes (the collectives between ops, each
// rank's work, parameters and activations) follows from models::walk_graph.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "sextant/spec/json_reader.hpp"

namespace sextant::spec {

struct Plan;

// op -> dimension -> the mesh axes splitting it (major first; empty: not split).
using OpSplits = std::map<std::string, std::map<std::string, std::vector<std::string>>>;

// The mesh axes a per-op split may name.
inline constexpr const char* kDataAxis = "d";
inline constexpr const char* kTensorAxis = "t";

// Reads `per_op` of a plan file (reader `plan`); problems go to its diagnostics.
OpSplits read_op_splits(ObjectReader& plan);
Json op_splits_json(const OpSplits& splits);
// As a plan name's suffix, the ops grouped by split: ".op-b:dt=attention+qkv-b:d,s:t=fc1+fc2"
// ("" when there are none).
std::string op_splits_text(const OpSplits& splits);
// What a per-op plan does not combine with ("" when it combines): the splits cover dense
// transformer blocks on the plan's dp x tp mesh only.
std::string per_op_problem(const Plan& plan);

}  // namespace sextant::spec
