// Starting a command's ranks: `sextant run --np N` and `sextant bench comm --np N` outside an MPI
// launcher replace themselves with `mpirun -np N <this binary> <the same arguments>`.
#pragma once

#include <string>
#include <vector>

namespace sextant::cli {

// Whether this process was started by mpirun, srun or another PMI launcher.
bool under_mpi_launcher();

// Replaces this process with `mpirun -np N --oversubscribe [--allow-run-as-root] <this binary>
// <args without --np>`; throws naming the reason if mpirun cannot be started.
[[noreturn]] void relaunch_under_mpirun(int np, const std::vector<std::string>& args);

}  // namespace sextant::cli
