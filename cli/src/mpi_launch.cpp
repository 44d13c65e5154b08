// The mpirun relaunch shared by the commands that take --np.
#include "mpi_launch.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace sextant::cli {

bool under_mpi_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

void relaunch_under_mpirun(int np, const std::vector<std::string>& args) {
  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(np), "--oversubscribe"};
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
  char self[4096] = {};
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  cmd.push_back(n > 0 ? std::string(self, static_cast<size_t>(n)) : args.front());
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--np") {
      ++i;  // and its value
      continue;
    }
    if (args[i].rfind("--np=", 0) == 0) continue;
    cmd.push_back(args[i]);
  }
  std::vector<char*> argv;
  for (std::string& s : cmd) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::fflush(stdout);  // what this process printed, before mpirun replaces it
  execvp("mpirun", argv.data());
  throw std::runtime_error(
      fmt::format("cannot start mpirun: {} (is Open MPI installed?)", std::strerror(errno)));
}

}  // namespace sextant::cli
