// Context parallelism (Megatron-LM's context parallel, Transformer Engine's context_parallel.py;
// Liu et al. 2023, "Ring Attention with Blockwise Transformers"): each sequence of a micro-batch
// is split over the plan's cp ranks. Every token-wise op (norms, GEMMs, the MLP, the loss) runs on
// the rank's s/cp tokens; attention needs the whole sequence's keys and values, which the ranks
// exchange with one of the plan's three algorithms (spec::ContextAlgorithm). Under a causal mask
// the sequence is cut into 2*cp chunks and rank i holds chunks i and 2cp-1-i (Megatron-LM
// get_batch_on_this_cp_rank), so every rank gets the same share of the masked work. Parameters are
// replicated over the cp ranks, whose weight gradients are summed with the data-parallel replicas
// (Plan::replicas). The one home of the rules: the plan check, the planner and the lowering ask
// them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/stack.hpp"

namespace sextant::spec {

// What is wrong with splitting `model`'s sequences of `seq_len` tokens over plan.cp ranks with
// plan.cp_algorithm (and plan.tp, plan.sequence_parallel around them), or "" when nothing is:
// transformers only; 2*cp must divide the sequence (the load-balanced chunks); under sequence
// parallelism tp must divide the rank's tokens; all-to-all needs cp to divide the heads and the
// key/value heads of each tp rank (each cp rank takes whole heads).
std::string context_parallel_problem(const ModelSpec& model, int64_t seq_len, const Plan& plan);

// What is wrong with running `algorithm` over `cp` ranks with the stack's attention kernel, or "":
// ring attention runs blockwise flash attention, each step merging its block's output by the
// log-sum-exp (Transformer Engine's AttnFuncWithCPAndKVP2P), so it needs a fused kernel.
std::string context_attention_problem(int64_t cp, ContextAlgorithm algorithm,
                                      AttentionKernel attention);

// The positions in its sequence of the tokens context-parallel rank `rank` of `cp` holds, in the
// order it holds them: chunk `rank`, then chunk 2*cp - 1 - rank, of the 2*cp equal chunks of a
// sequence of `seq_len` tokens (2*cp divides it: context_parallel_problem). The executor slices
// its tokens, rotates and masks by them; [0, seq_len) when cp is 1.
std::vector<int32_t> context_positions(int64_t seq_len, int64_t cp, int64_t rank);

}  // namespace sextant::spec
