// The flags that choose the executor's backend, collectives and GEMM precision (run, bench).
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "sextant/exec/runner.hpp"

namespace sextant::cli {

struct ExecutorFlags {
  std::string backend = "cpu";
  std::string comm = "auto";
  std::string precision;  // empty: the backend's default
};

// --backend, --comm and (with_precision) --precision on `cmd`.
void add_executor_flags(CLI::App& cmd, ExecutorFlags& flags, bool with_precision);

// Parsed, or InputError naming the flag and the accepted values.
exec::BackendKind backend_kind(const ExecutorFlags& flags);
std::optional<exec::CommKind> comm_choice(const ExecutorFlags& flags);
// Unset when --precision was not given.
std::optional<exec::Precision> precision_choice(const ExecutorFlags& flags);

}  // namespace sextant::cli
