// Expert parallelism (GShard, Lepikhin et al. 2020; Megatron-LM's expert-model-parallel group;
// DeepSpeed-MoE): the routed experts of a mixture-of-experts layer are split over `ep` ranks,
// each holding experts/ep of them (whole, or under tp each split over the tp ranks). The ep ranks
// are data-parallel replicas of everything else (Megatron-LM carves the ep group out of dp: rank
// order tp-cp-ep-dp-pp), so each routes its own tokens, sends every token copy to the rank of its
// expert with an all-to-all (dispatch), runs its local experts on what it receives, and sends the
// results back with a second all-to-all (combine). Dense parameters are summed over the replicas
// (Plan::replicas); a routed expert's gradients only over the ranks holding the same experts
// (Plan::expert_replicas), and ZeRO shards each over its own group. The one home of the rules: the
// plan check, the planner and the lowering ask them.
#pragma once

#include <cstdint>
#include <string>

#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::spec {

// What is wrong with the plan's expert parallelism on its own (without a model), or "" when
// nothing is: ep must divide dp (the ep ranks are data-parallel ranks); it does not (yet)
// combine with offload (nor with gradient compression: compression_layout_problem). (With tp > 1
// the model needs sequence parallelism: moe_tensor_parallel_problem.) Under ZeRO-3 the experts'
// shards are gathered from the expert replicas (TorchTitan: FSDP2 of the experts over dp_shard /
// ep).
std::string expert_parallel_problem(const Plan& plan);

// What is wrong with splitting `model`'s routed experts over `ep` ranks, or "": the model must be
// a mixture of experts and ep must divide its experts (each rank holds experts/ep of them).
std::string expert_model_problem(const ModelSpec& model, int64_t ep);

// Whether a MoE block's token dispatcher runs over tensor parallelism: with ep and tp > 1
// (sequence parallel), Megatron-LM's MoEAlltoAllTokenDispatcher: each tp rank routes its own s/tp
// tokens, exchanges their copies over ep, all-gathers the rows its tp group received for the
// experts' column- and row-parallel GEMMs and reduce-scatters their output, in place of the MLP's
// own sequence-parallel gather and reduce-scatter. (Without ep the tp ranks share the routing
// inside that pair: the all-gather dispatcher.) The lowering and the executor both ask it.
inline bool moe_dispatches_over_tp(int64_t tp, int64_t ep) {
  return ep > 1 && tp > 1;
}

// What is wrong with splitting a mixture of experts over `tp` ranks with or without sequence
// parallelism, or "": with tp > 1 a MoE model needs sequence parallelism (Megatron-LM's
// validate_args: "When using MoE and tensor parallelism, sequence parallelism must be used"), for
// each tp rank routes its own tokens (the router's gradient is a sequence-parallel partial sum).
std::string moe_tensor_parallel_problem(const ModelSpec& model, int64_t tp, bool sequence_parallel);

}  // namespace sextant::spec
