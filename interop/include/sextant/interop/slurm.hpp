// A plan as a Slurm batch script (`sextant launch --slurm`): the #SBATCH lines of its size and the
// command that starts its ranks. Sextant's own executor runs one task per rank under `srun
// --mpi=pmix` (Open MPI reads its rank and peers from Slurm's PMIx server); a stack runs torchrun
// on every node, its ranks meeting at the first node (c10d rendezvous), with the stack's settings
// of `export_plan` as the entry point's arguments or as a config file written by the job.
#pragma once

#include <string>
#include <vector>

#include "sextant/interop/export.hpp"

namespace sextant::interop {

// What the job asks of the scheduler; empty strings are not written (the cluster's defaults).
struct SlurmRequest {
  std::string job_name;   // also the stem of the files the job writes
  std::string directory;  // absolute: where the job writes them (NAME-JOBID.*)
  int64_t nodes = 1;
  int64_t ranks_per_node = 1;  // the plan's ranks on each node
  bool gpus = false;           // one GPU per rank
  std::string partition;
  std::string account;
  std::string time;    // Slurm's forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
  std::string output;  // stdout and stderr ("%j": the job id); "": DIR/NAME-%j.out
};

// Throws InputError naming the flag ("--partition", ...) for a value Slurm would refuse or that
// would change the script's meaning (white space, quotes, a time not in Slurm's forms).
void check_slurm_request(const SlurmRequest& r);

// How the ranks start.
struct SextantJob {                   // one `sextant run` per rank
  std::string binary;                 // the sextant executable, as every node sees it
  std::vector<std::string> run_args;  // after `run`, without --plan (the job writes the plan)
  std::string plan_json;              // sextant.plan/1
  // CPU ranks: each bound to its core (srun --cpu-bind=cores), as mpirun binds two or fewer ranks
  // by default; unbound ranks of gpt-tiny on 2 cores stepped in 92-103 ms, bound in 97.1-97.9.
  bool bind_cores = false;
  // The cores' check around the ranks (`sextant bench cores --reference ...`; empty: none), run
  // on the job's first node before and after them: what it finds ("before the run: core 1 ran
  // 23% slow ...", one line each) goes to NAME-JOBID.cores, empty when both found the cores quiet.
  // No job of its own: the trial's allocation holds the cores it checks.
  std::vector<std::string> core_check = {};
};
struct StackJob {     // torchrun per node with the stack's entry point
  Exported exported;  // settings and text of export_plan for the target
  // Megatron: pretrain_gpt.py (default "$MEGATRON_LM/pretrain_gpt.py"); DeepSpeed: the training
  // script (required); TorchTitan: unused (the torchtitan.train module).
  std::string entry;
  int64_t rendezvous_port = 29500;  // torchrun's default
};

std::string sbatch_script(const SlurmRequest& request, const SextantJob& job);
// Throws InputError naming the target when it has no launcher here (NeMo-Run submits its own
// jobs) or a required entry point is missing.
std::string sbatch_script(const SlurmRequest& request, const StackJob& job);

// `text` as a job name (and file stem): its characters other than letters, digits, '.', '_' and
// '-' replaced by '_'.
std::string job_name(std::string text);

// `word` as one word of a POSIX shell command line: as it is when it holds only characters no
// shell treats specially, else in single quotes.
std::string shell_quote(const std::string& word);

}  // namespace sextant::interop
