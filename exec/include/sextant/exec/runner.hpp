// Running a training job on MPI ranks: the communicators of a plan's layout, the context, the
// trace merged from every rank, the per-step log, and the failure policy (a bad plan is refused on
// every rank with one message; a rank that fails ends the job, never a hang).
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>

#include "sextant/exec/backend.hpp"
#include "sextant/exec/context.hpp"
#include "sextant/exec/mpi_communicator.hpp"
#include "sextant/exec/trainer.hpp"

namespace sextant::exec {

// This rank's communicators for a plan (Megatron rank order, spec::RankLayout).
class Layout {
 public:
  Layout(MPI_Comm world, const spec::Plan& plan);
  Groups& groups() { return groups_; }

 private:
  std::unique_ptr<MpiCommunicator> world_, tp_, dp_, embedding_;
  Groups groups_;
};

struct Job {
  spec::ModelSpec model;
  spec::Plan plan;
  TrainOptions train;
  std::string trace_file;  // merged trace of every rank (written by rank 0)
  std::string log_json;    // one JSON object per step (rank 0)
  bool quiet = false;      // no per-step lines on stdout
};

// Trains `job` on the ranks of `world` (collective). Returns the step logs (on every rank).
TrainResult run_job(const Job& job, MPI_Comm world, Backend& backend);

// The training loss diverged (NaN or infinite): every rank sees it at the same step.
class TrainingDiverged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Initialises MPI, builds the job with `make_job` (reading files and flags, so that a bad input is
// reported once, by rank 0), runs it on MPI_COMM_WORLD with the CPU backend, finalises. Returns
// the process exit status (0 ok, 2 bad input, 1 other failures).
int run_main(const std::function<Job()>& make_job);

}  // namespace sextant::exec
