// Submitting a batch script to Slurm, shared by `launch --submit` and `tune --slurm`.
#pragma once

#include <string>

namespace sextant::cli {

// Runs `sbatch --parsable [--wait] script` and returns the job id. Throws std::runtime_error
// naming the script and sbatch's last line when sbatch fails, or (with `wait`) when the job does.
std::string sbatch(const std::string& script, bool wait);

}  // namespace sextant::cli
