// Per-operator parallelism: each op of a model graph gets its own split of its dimensions over the
// axes of a device mesh, and the collectives between ops follow from the layouts by the one
// resharding rule (spec/sharding.hpp).
//
// An op is an einsum over named dimensions (Mesh-TensorFlow, Shazeer et al. 2018, §3): its
// operands and its output list their dimensions; a dimension in the operands but not in the
// output is contracted. Splitting a dimension over mesh axes (FlexFlow's sample / attribute /
// parameter dimensions, Jia et al., SysML'19, §3) divides the op's work by the axes' sizes; a
// contracted dimension's axes leave each rank a partial sum of the output. An op that is not a
// pure product (attention, a norm, an activation) gives its FLOPs and names the dimensions it
// needs whole on every rank.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sextant/spec/sharding.hpp"

namespace sextant::models {

struct EinsumOp {
  std::string name;
  std::vector<std::vector<std::string>> operands;  // each operand's dimensions, in order
  std::vector<std::string> output;
  std::map<std::string, int64_t> extents;
  // FLOPs of the whole op: < 0 for a product (2 x the product of every dimension's extent, a
  // multiply-add being 2 FLOPs as Narayanan et al. count), else as given (0: memory-bound).
  double flops = -1;
  // Dimensions every rank must hold whole (a norm's hidden size, attention's sequence).
  std::vector<std::string> whole;
  double total_flops() const;
  bool is_product() const { return flops < 0; }
};

// The mesh axes splitting each of an op's dimensions (absent: not split). An axis splits at most
// one dimension of the op; an axis splitting none leaves the op replicated over it.
using OpSplit = std::map<std::string, std::vector<std::string>>;

struct ShardedOp {
  std::vector<spec::TensorLayout> operands;  // the layout each operand must have
  spec::TensorLayout output;  // partial over the axes splitting a contracted dimension
  double flops = 0;           // one rank's
};

// The op's operand and output layouts and per-rank FLOPs under `split`. Throws InputError naming
// the op when the split uses an axis twice, splits a dimension the op needs whole, names a
// dimension the op lacks, or does not divide a dimension.
ShardedOp shard_op(const spec::DeviceMesh& mesh, const EinsumOp& op, const OpSplit& split);

// The backward op giving the gradient of operand `operand`: a product of the output's gradient
// with the other operands, contracting what the operand lacks (for a product); for another op, the
// same dimensions at `backward_factor` x its FLOPs.
EinsumOp gradient_op(const EinsumOp& op, size_t operand, double backward_factor = 1.0);

// The layout of a tensor of `dims` under an op's split (and partial over `partial`).
spec::TensorLayout layout_of(const std::vector<std::string>& dims,
                             const std::map<std::string, int64_t>& extents, const OpSplit& split,
                             std::vector<std::string> partial = {});

}  // namespace sextant::models
