// The subcommands of `sextant`. Each add_*_command registers its options on `app` and runs when
// selected; options live in state owned by the returned callback (no globals).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace sextant::cli {

void add_models_command(CLI::App& app);
void add_clusters_command(CLI::App& app);
void add_stacks_command(CLI::App& app);
void add_simulate_command(CLI::App& app);
void add_validate_command(CLI::App& app);
void add_calibrate_command(CLI::App& app);
void add_loop_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_import_command(CLI::App& app);
void add_launch_command(CLI::App& app);
void add_tune_command(CLI::App& app);
// `args`: the process arguments, to start mpirun with the same ones.
void add_run_command(CLI::App& app, const std::vector<std::string>& args);
void add_bench_command(CLI::App& app, const std::vector<std::string>& args);

}  // namespace sextant::cli
