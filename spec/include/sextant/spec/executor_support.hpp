// What Sextant's own executor runs: one table of rules over the model, the plan, the backend, the
// precision and the run's options. `run` asks it once before any communication; the planner
// (SearchRequest::executor), `plan --verify`, `tune` and `loop` ask it to propose only plans the
// executor runs. Resources (host memory, GPUs, output paths) are checked where they are known
// (exec/src/train/runner.cpp), not here.
#pragma once

#include <string>
#include <vector>

#include "sextant/spec/collective.hpp"
#include "sextant/spec/dtype.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/executor_kind.hpp"
#include "sextant/spec/json_reader.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/stack.hpp"

namespace sextant::spec {

EnumNames<ExecutorBackend> executor_backend_names();
EnumNames<ExecutorPrecision> executor_precision_names();

// A backend's precision when none is asked: fp32 on CPU ranks, bf16 mixed precision on GPUs.
ExecutorPrecision default_precision(ExecutorBackend backend);
// The dtype a precision multiplies matrices in, as plans and stacks name it (Plan::dtype).
Dtype compute_dtype(ExecutorPrecision precision);
// The dtype a precision stores activations in (fp32 but for mixed precision).
Dtype storage_dtype(ExecutorPrecision precision);

// A run of the executor, as far as it decides what can run.
struct ExecutorRun {
  ExecutorBackend backend = ExecutorBackend::kCpu;
  ExecutorPrecision precision = ExecutorPrecision::kFp32;
  bool synthetic_data = true;  // --data synthetic (else byte-level text of a file)
  bool clipping = true;        // --clip > 0: global gradient-norm clipping
  bool checkpoints = false;    // --checkpoint or --resume
};

// The run with `backend`'s default precision, as `tune` and `loop` start their trials.
ExecutorRun executor_run(ExecutorBackend backend);

// The software stack the executor runs a plan with: the plan's own, else its built-in "sextant"
// (kExecutorStack), on every backend.
Stack executor_stack(const Plan& plan);
// The kernel the executor runs a plan's attention core with: its stack's (a fused kernel is
// FlashAttention-2's algorithm: exec/blockwise_attention.hpp on CPU ranks, flash_attention.cu on
// GPUs), except under all-gather or all-to-all context parallelism and per-op splits, whose
// kernels keep the probabilities (unfused).
AttentionKernel executed_attention(const Plan& plan);

// Whether the CPU executor runs `kind` by `algorithm` when a plan names it (plan
// collective_algorithms; exec/src/comm/p2p_collectives.hpp builds them from point-to-point
// messages): all-reduce by ring, recursive doubling, Rabenseifner or binomial tree; reduce-scatter
// by ring, pairwise or recursive doubling (halving); all-gather by ring or recursive doubling;
// all-to-all and send/recv pairwise; broadcast by binomial tree. Recursive doubling's
// reduce-scatter and all-gather need groups of a power of two. GPU backends run NCCL's own choice
// only.
bool executor_runs_collective(CollectiveKind kind, CollectiveAlgorithm algorithm);

// What keeps the executor from running `plan` of `model` in `run`: one problem per rule broken
// (pointer: the plan's field, "model /..." for the model's, or the flag), none when it runs.
std::vector<Problem> executor_problems(const ModelSpec& model, const Plan& plan,
                                       const ExecutorRun& run);

// Throws InputError with every problem (source: the plan, model, backend and precision).
void check_executor_runs(const ModelSpec& model, const Plan& plan, const ExecutorRun& run);

}  // namespace sextant::spec
