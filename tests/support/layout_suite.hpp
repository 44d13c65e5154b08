// The layout suite: every layout Sextant's executor runs, each on a small model of its family
// (GPT, Llama, MLP, CNNs, U-Nets, AmoebaNet, mixtures of experts). The multi-rank equivalence test
// (tests/exec/layout_equivalence_test.cpp) runs each against the single-rank run; docs/SUPPORT.md
// is generated from it (tests/docs/support_matrix_test.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "sextant/spec/executor_support.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::layout_suite {

enum class Net {
  kGpt,
  kMlp,
  kLlama,
  kLlamaWideVocab,
  kGptOddVocab,
  kCnn,
  kVgg,
  kUnet,
  kUnet3d,
  kUnetTall,
  kVolumeClassifier,
  kAmoeba,
  kInception,
  kMoe,
  kMoeCapacity
};

struct Layout {
  const char* name;
  spec::Plan plan;
  Net net = Net::kGpt;
};

spec::ModelSpec model_of(Net n);
spec::ModelSpec tiny_gpt();
spec::ModelSpec tiny_llama();
spec::ModelSpec tiny_mlp();

// A plan of the suite: one sequence a micro-batch, 8 a step, Sextant's stack with small buckets.
spec::Plan plan_of(int64_t dp, int64_t tp, int64_t pp, int zero = 0, bool sp = false,
                   spec::Schedule schedule = spec::Schedule::k1F1B);
spec::Plan with_ring(spec::Plan p, int64_t cp);
spec::Plan nvme_offloaded(spec::Plan p);
spec::Plan parameters_on_nvme(spec::Plan p);
spec::Plan compressed(spec::Plan p, spec::CompressionKind kind, bool error_feedback = true);

// Whether the suite clips the global gradient norm of `plan`: not under PipeDream-2BW (the
// executor refuses it there), under the other schedules.
bool suite_clips(const spec::Plan& plan);
// How the suite runs `l` on `backend` in `precision`.
spec::ExecutorRun suite_run(const Layout& l, spec::ExecutorBackend backend,
                            spec::ExecutorPrecision precision);

// Every exact layout (each equals the single-rank run).
std::vector<Layout> layouts();
// Lossy compressions: checked for the ops they run, not against the single-rank run.
std::vector<Layout> compressed_layouts();
// A mixture of experts whose capacity drops per tp rank: checked for its ops only.
std::vector<Layout> per_tp_rank_capacity_layouts();

}  // namespace sextant::layout_suite
