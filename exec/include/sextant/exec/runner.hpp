// Running a training job on MPI ranks: the communicators of a plan's layout, the context, the
// trace merged from every rank, the per-step log, and the failure policy (a bad plan is refused on
// every rank with one message; a rank that fails ends the job, never a hang).
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "sextant/exec/backend.hpp"
#include "sextant/exec/communicators.hpp"
#include "sextant/exec/context.hpp"
#include "sextant/exec/cuda_backend.hpp"
#include "sextant/exec/trainer.hpp"
#include "sextant/exec/watchdog.hpp"
#include "sextant/spec/executor_support.hpp"
#include "sextant/spec/trace_selection.hpp"

namespace sextant::exec {

// This rank's communicators for a plan (Megatron rank order, spec::RankLayout), of one kind.
// Collective over `world`, which it duplicates (the caller's communicator is left alone).
// `stationary_w`: a CNN channel split runs stationary-w somewhere (models::LoweredModel), which
// needs its reduce and gather groups (Groups::channel_filter).
class Layout {
 public:
  Layout(MPI_Comm world, const spec::Plan& plan, CommKind kind, bool stationary_w = false);
  Groups& groups() { return groups_; }

 private:
  std::unique_ptr<Communicator> world_, tp_, replicas_, spatial_, cp_, ep_, expert_replicas_,
      embedding_;
  std::array<std::unique_ptr<Communicator>, 3> grid_;  // a 3D tensor grid's x, y and z lines
  std::array<std::unique_ptr<Communicator>, 2> channel_filter_;  // stationary-w's groups
  Groups groups_;
};

using BackendKind = spec::ExecutorBackend;

struct Job {
  spec::ModelSpec model;
  spec::Plan plan;
  std::string plan_source;  // where the plan is from, for its errors (empty: "plan NAME")
  TrainOptions train;
  std::string trace_file;                // merged trace of every rank (written by rank 0)
  spec::TraceSelection trace_selection;  // the ranks and steps the trace keeps
  std::string log_json;                  // one JSON object per step (rank 0)
  bool quiet = false;                    // no per-step lines on stdout
  BackendKind backend = BackendKind::kCpu;
  // Collectives: kMpi for the CPU backend. For cuda, run_main picks nccl when every rank on a node
  // has a GPU of its own and host-staged MPI otherwise, unless `comm_choice` names one.
  CommKind comm = CommKind::kMpi;
  std::optional<CommKind> comm_choice;
  // Unset: the backend's default (cpu: fp32; cuda: bf16 mixed precision).
  std::optional<Precision> precision;
  // Ends the job, naming the rank, when a rank makes no progress (exec/watchdog.hpp).
  WatchdogOptions watchdog;
  // A device's peak FLOP/s in the run's precision and the file it is from, for the summary's
  // MFU; 0: not known (no MFU printed).
  double peak_flops = 0;
  std::string peak_source;
  // The step `sextant plan` predicted for this plan (its file's predicted.step_time_s) and the
  // cluster file it was predicted on, for the summary's predicted-against-measured line; 0: none.
  double predicted_step_s = 0;
  std::string predicted_on;
  // Rank 0, after the merged trace is written (not with `quiet`): the caller's reading of it and
  // of the step logs (the cli's: how steady the cores were; exec does not analyse traces).
  std::function<void(const spec::Trace&, const std::vector<StepLog>&)> on_trace;
};

// What the executor is asked to run: the job's backend, its precision (the backend's default when
// unset) and the options that decide what runs (spec/executor_support.hpp).
spec::ExecutorRun executor_run_of(const Job& job);

// Every check of a job before a device or a communicator exists, once per run (run_main): the
// plan against the model and `ranks` (spec::validate_plan), the stack it runs with
// (spec::check_stack_runs) and what the executor runs (spec::check_executor_runs).
void check_job(const Job& job, int64_t ranks);

// Trains `job` on the ranks of `world` (collective) with `backend` and job.comm communicators,
// the job checked (check_job). Returns the step logs (on every rank).
TrainResult run_job(const Job& job, MPI_Comm world, Backend& backend);

// The training loss diverged (NaN or infinite): every rank sees it at the same step.
class TrainingDiverged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The backend a job asks for, on this rank's device; settles job.comm. Throws InputError when
// the choice cannot run here (no GPU, nccl with ranks sharing a GPU).
std::unique_ptr<Backend> make_backend(Job& job, MPI_Comm world);
// The same for any driver (the benches): `comm` receives the settled communicator kind.
std::unique_ptr<Backend> make_backend(BackendKind kind, std::optional<CommKind> choice,
                                      std::optional<Precision> precision, bool quiet,
                                      MPI_Comm world, CommKind& comm);

// Initialises MPI, builds the job with `make_job` (reading files and flags, so that a bad input is
// reported once, by rank 0), runs it on MPI_COMM_WORLD with the job's backend (cuda: device =
// local rank modulo the GPUs of the node), finalises. Returns the process exit status (0 ok,
// 2 bad input or no usable GPU, 1 other failures).
int run_main(const std::function<Job()>& make_job);

}  // namespace sextant::exec
