// The order in which one pipeline stage runs the forward and backward passes of its micro-batches
// under GPipe, 1F1B (PipeDream-Flush, Narayanan et al. 2021) and interleaved 1F1B (Megatron-LM,
// SC'21 §2.2.2). Shared by the simulator and the executor so both run the same order.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sextant/spec/gradient_drain.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::spec {

struct ScheduleUnit {
  bool forward = true;
  int64_t micro_batch = 0;
  int64_t chunk =
      0;  // model chunk on this stage, 0..virtual_stages-1 (global chunk = chunk*pp + stage)
};

// Units of `stage` for `micro_batches` micro-batches. Interleaving needs micro_batches % pp == 0.
// PipeDream-2BW's units for one batch on its own are 1F1B's.
std::vector<ScheduleUnit> pipeline_schedule(Schedule schedule, int64_t pp, int64_t virtual_stages,
                                            int64_t micro_batches, int64_t stage);

// PipeDream-2BW (Narayanan et al., ICML 2021, "Memory-Efficient Pipeline-Parallel DNN Training",
// §3.1, Figure 3): 1F1B without a flush, so a stage starts the next batch's forwards while the
// current batch's backwards drain. Each stage updates its weights as soon as its part of a batch
// is done, and the new version is first used by the batch after the next one: batch t runs
// forward and backward on version t - 1 (the weights after t - 1 updates; batch 0 on the initial
// ones), W(t+1) = W(t) - lr * grad f_t(W(t-1)). With m >= pp micro-batches per batch no more than
// two versions are ever needed on a stage: the one the in-flight batch stashed and the newest.

// The units of `stage` over `batches` consecutive batches of `micro_batches` each, micro-batch i
// of batch b numbered b * micro_batches + i.
std::vector<ScheduleUnit> pipedream_2bw_units(int64_t pp, int64_t micro_batches, int64_t batches,
                                              int64_t stage);
// The weight version (the number of updates applied) batch `batch` runs with.
int64_t pipedream_2bw_version(int64_t batch);
// Why `plan` cannot use the schedule: "" if it can (validate_plan asks).
std::string pipedream_2bw_problem(const Plan& plan);

// Asynchronous PipeDream with weight stashing (Narayanan et al., SOSP'19, §3.3, "PipeDream:
// Generalized Pipeline Parallelism for DNN Training"): each batch is one micro-batch per replica,
// and each stage updates its weights after every backward, with no flush. Under 1F1B stage s has
// pp - s batches in flight, so batch t's forward there reads the version after
// max(0, t - (pp - 1 - s)) updates, and its backward the same version, stashed (weight stashing);
// the update applies to the newest: W_s(t+1) = W_s(t) - lr * grad_s f_t(the stages' versions).
// Stage s keeps pp - s versions. Without vertical sync each stage's staleness is its own.
int64_t pipedream_version(int64_t batch, int64_t pp, int64_t stage);
// Why `plan` cannot use the schedule: "" if it can (validate_plan asks).
std::string pipedream_problem(const Plan& plan);

// GEMS' MAST (Jain et al., SC'20, "GEMS: GPU-Enabled Memory-Aware Model-Parallelism System for
// Distributed DNN Training", §IV-A): a second replica of the model's pp stages on the same pp
// ranks in the opposite direction, which computes while the first one's pipeline would leave a
// rank idle. Replica A runs model stage s on rank s and its forward goes down the ranks, replica
// B runs stage s on rank pp - 1 - s and goes up; A takes micro-batches [0, m/2), B [m/2, m).
// Rank r holds stages r and pp - 1 - r, the lower one as its local chunk 0, so a rank and its
// mirror hold the same parameters in the same order and sum their gradients with the replicas
// (RankLayout::replica_group). Synchronous: one update a step, as 1F1B's. Needs an even pp.
// A rank's local chunks: 2 under GEMS, else the plan's virtual stages.
int64_t local_chunks(const Plan& plan);
// The model chunk (stage index in model order; chunk * pp + rank when interleaved) of local chunk
// `local` on pipeline rank `rank`.
int64_t chunk_stage(const Plan& plan, int64_t rank, int64_t local);
// The model chunks a pipeline runs through: pp under GEMS (each twice), else pp x virtual stages.
int64_t model_chunks(const Plan& plan);
// Whether local chunk `local` of rank `rank` sends its forward output to the previous rank
// (GEMS' replica B); otherwise to the next one around the ring.
bool chunk_runs_up(const Plan& plan, int64_t rank, int64_t local);
// Why `plan` cannot use GEMS: "" if it can (validate_plan asks).
std::string gems_problem(const Plan& plan);

// The batches the simulator and the planner run back to back to price one batch in steady state:
// for PipeDream-2BW 2 (the step is makespan(2 batches) - makespan(1 batch), fill and drain paid
// once in both); for PipeDream pp + 1 (its fill is pp batches long: the step is the
// (makespan(pp + 1) - makespan(1)) / pp); through parameter servers parameter_server_window;
// 1 for the synchronous schedules.
inline constexpr int64_t kPipeDream2BWWindow = 2;
int64_t asynchronous_window(const Plan& plan);

// Most micro-batch-chunks whose activations a stage holds at once under the schedule (forwards
// started and not yet finished by their backward), i.e. the activation multiplier of the stage.
int64_t peak_in_flight(const std::vector<ScheduleUnit>& units);

// The moments of a stage's schedule that can hold its activation peak, as per-chunk counts of the
// micro-batches whose activations are live: after each forward, and while each backward runs
// (before it frees its chunk's activations; recompute rebuilds one layer's working set there).
// Only the moments that no other moment covers in every chunk are kept, so a stage's peak is the
// largest dot product of these counts with its chunks' activation bytes -- the replay of
// pipeline_schedule, without the replay: a planner computes one profile for many plans.
struct LiveProfile {
  std::vector<std::vector<int64_t>> after_forward;
  std::vector<std::vector<int64_t>> during_backward;
};
LiveProfile live_profile(Schedule schedule, int64_t pp, int64_t virtual_stages,
                         int64_t micro_batches, int64_t stage);

// The makespan of a pipeline's compute under the schedule: every stage runs its units in order
// (pipeline_schedule); a forward of global chunk g waits for the forward of chunk g - 1 on the
// previous stage plus a transfer of `p2p` seconds, a backward for the backward of chunk g + 1 plus
// a transfer, or, on the model's last chunk, for its own forward. forward[s][c] and
// backward[s][c]: seconds of local chunk c of stage s for one micro-batch. `blocking`: a stage
// also waits for each of its sends (no overlap of stage transfers). The planner's estimate of the
// fill, steady state and drain that the simulator runs event by event.
// What the data-parallel gradient reduction does to each stage at the end of a step (the
// planner's closed form of it, gradient_drain.hpp): from the stage's first backward of the last
// micro-batch on, its passes run beside the reduction, each started when the schedule lets it, and
// the stage finishes when its last reduction does.
struct PipelineDrain {
  std::vector<StageDrain> stages;
};
double pipeline_makespan(Schedule schedule, int64_t pp, int64_t virtual_stages,
                         int64_t micro_batches, const std::vector<std::vector<double>>& forward,
                         const std::vector<std::vector<double>>& backward, double p2p,
                         bool blocking, const PipelineDrain* drain = nullptr);

// pipeline_makespan for many drains of one pipeline: every stage's passes before its first
// backward of the last micro-batch (which no drain changes) are timed once, at construction; each
// makespan() times the rest.
class PipelineSweep {
 public:
  // Every stage's units (pipeline_schedule), which many sweeps of one schedule can share.
  using StageUnits = std::vector<std::vector<ScheduleUnit>>;
  static std::shared_ptr<const StageUnits> units(Schedule schedule, int64_t pp,
                                                 int64_t virtual_stages, int64_t micro_batches);

  PipelineSweep(Schedule schedule, int64_t pp, int64_t virtual_stages, int64_t micro_batches,
                std::vector<std::vector<double>> forward, std::vector<std::vector<double>> backward,
                double p2p, bool blocking);
  PipelineSweep(std::shared_ptr<const StageUnits> units, int64_t pp, int64_t virtual_stages,
                int64_t micro_batches, std::vector<std::vector<double>> forward,
                std::vector<std::vector<double>> backward, double p2p, bool blocking);
  // The step's end: the latest stage's, whose end is its last pass's and its drain's. With
  // `stage_ends` (pp entries), each stage's end too.
  double makespan(const PipelineDrain* drain, std::span<double> stage_ends = {}) const;

 private:
  static constexpr double kUnknown = -1;
  struct State {
    std::vector<double> fdone, bdone;  // per (global chunk, micro-batch): when its pass ended
    std::vector<size_t> next;          // per stage: its next unit
    std::vector<double> free;          // per stage: when it can start the next
    std::vector<double> compute_end;   // per stage: when its latest unit ended
  };
  // `drains`: per stage, its drain's stream (none before the drain or without one).
  void sweep(State& state, std::vector<DrainStream>* drains, bool prefix_only) const;

  int64_t pp_, chunks_, m_;
  double p2p_;
  bool blocking_;
  std::vector<std::vector<double>> forward_, backward_;
  std::shared_ptr<const StageUnits> units_;
  std::vector<size_t> drain_start_;  // per stage: its first backward of the last micro-batch
  State prefix_;
};

}  // namespace sextant::spec
