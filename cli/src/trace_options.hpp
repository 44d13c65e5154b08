// Command-line trace flags shared by `simulate` and `run`: --trace FILE (gzip when it ends in .gz)
// and which ranks and steps it keeps.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "sextant/spec/plan.hpp"
#include "sextant/spec/trace_selection.hpp"

namespace sextant::cli {

struct TraceFlags {
  std::string file;
  std::string ranks;
  std::string steps;
};

// Registers --trace (described by `what`, e.g. "the predicted trace"), --trace-ranks and
// --trace-steps on `cmd`.
void add_trace_flags(CLI::App& cmd, TraceFlags& flags, const std::string& what);
// The selection the flags ask for on `plan`'s ranks; throws InputError naming the flag.
spec::TraceSelection trace_selection_from(const TraceFlags& flags, const spec::Plan& plan);

}  // namespace sextant::cli
