// A dense transformer block whose ops take their own splits (a plan's per_op; issue 60): the
// block graph walked as models::PerOpBlock walks it for the lowering. Each op runs on the rank's
// blocks of its operands under its split (norms on rows, the four linears as one GEMM of the
// rank's blocks, attention on its sequences and head groups, the activation, the residuals), and
// each reshard step of the walk runs on the tensor it names (mesh_tensor.hpp), traced as the
// lowering names it. Parameter gradients stay on the rank: the replicas sum them as every
// layout's buckets do, the tp ranks those models::PerOpBlock finds partial (Param::tp_partial).
// A bias is added once: by QKV or FC1 on the ranks first along the axes their output is a
// partial sum over, and the projection's and FC2's by the residual after them.
// Runs in fp32 without recompute or offload (spec/executor_support.cpp).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gpt/gpt_layer.hpp"
#include "mesh_tensor.hpp"
#include "sextant/models/per_op_block.hpp"

namespace sextant::exec {

class SplitBlock final : public GptLayer {
 public:
  SplitBlock(const GptParts& parts, ParamStore& store, int32_t layer,
             const models::PerOpBlock& block, const MeshRanks& ranks);
  Tensor forward(const MicroBatch& mb, const Tensor& x) override;
  Tensor backward(const MicroBatch& mb, const Tensor& dy) override;

 private:
  // What an op read and what else its backward needs (a norm's statistics, attention's
  // probabilities and its q, k, v in the kernels' layout).
  struct Saved {
    std::vector<MeshTensor> inputs;
    Tensor mean, rstd, probs, qkv;
  };
  using Cache = std::map<std::string, Saved>;  // by op

  const models::GraphNode& node(const std::string& name) const { return block_.node(name); }
  MeshTensor reshard(const MeshTensor& x, const models::GraphStep& step, int64_t mb);
  // The op's output from its inputs; fills `saved`.
  MeshTensor run(const models::GraphNode& n, Saved& saved, int64_t mb);
  // The gradients of the op's activation inputs (in its operands' order) from its output's.
  std::vector<MeshTensor> run_backward(const models::GraphNode& n, Saved& saved,
                                       const MeshTensor& dout, int64_t mb);
  MeshTensor linear(const models::GraphNode& n, const Saved& s, int64_t mb);
  std::vector<MeshTensor> linear_backward(const models::GraphNode& n, const Saved& s,
                                          const MeshTensor& dout, int64_t mb);
  MeshTensor attention(const models::GraphNode& n, Saved& s, int64_t mb);
  std::vector<MeshTensor> attention_backward(const models::GraphNode& n, const Saved& s,
                                             const MeshTensor& dout, int64_t mb);
  // Attention's q, k, v of the rank's head groups from the graph's [rows, a, c] (group by group)
  // to the kernels' [rows, q | k | v] (QkvLayout), or `back`.
  void to_kernel_layout(const Tensor& from, Tensor& to, const QkvLayout& l, bool back);
  QkvLayout qkv_layout(const MeshTensor& qkv) const;
  // The layout of an op's output, or of the gradient of its operand i.
  spec::TensorLayout output_layout(const models::GraphNode& n) const;
  spec::TensorLayout gradient_layout(const models::GraphNode& n, size_t i) const;
  MeshTensor make(const spec::TensorLayout& l) const;
  Param* param(const std::string& op) const;

  int32_t layer_;
  const models::PerOpBlock& block_;
  const MeshRanks& ranks_;
  models::GraphWalk walk_;
  std::map<std::string, Param*> weights_;  // by op: the linears' weights
  std::map<std::string, Param*> biases_;   // by op: QKV's, FC1's and the residuals' (with biases)
  std::map<std::string, std::pair<Param*, Param*>> norms_;  // by op: gain, bias (LayerNorm)
  std::map<int64_t, Cache> caches_;                         // by micro-batch
};

}  // namespace sextant::exec
