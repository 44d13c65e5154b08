// Submitting a batch script with sbatch (slurm_submit.hpp).
#include "slurm_submit.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "sextant/loop/process_machine.hpp"

namespace sextant::cli {

std::string sbatch(const std::string& script, bool wait) {
  const std::string log = script + ".sbatch.log";
  std::vector<std::string> args = {"sbatch", "--parsable"};
  if (wait) args.push_back("--wait");
  args.push_back(script);
  // --wait returns when the job ends: a trial's length, bounded by the job's own --time.
  const std::optional<int> rc = loop::run_child(args, log, 7 * 24 * 3600.0);
  std::ifstream in(log);
  std::string id, line, last;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    last = line;
    if (std::all_of(line.begin(), line.end(),
                    [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || c == ';'; }))
      id = line.substr(0, line.find(';'));  // --parsable: "ID" or "ID;CLUSTER"
  }
  std::filesystem::remove(log);
  if (id.empty())
    throw std::runtime_error(fmt::format("sbatch {} failed (exit {}): {}", script, rc.value_or(-1),
                                         last.empty() ? "no output" : last));
  if (rc.value_or(1) != 0)
    throw std::runtime_error(fmt::format("job {} of {} failed (sbatch --wait exit {}{})", id,
                                         script, rc.value_or(-1), last == id ? "" : ": " + last));
  return id;
}

}  // namespace sextant::cli
