// The subcommands of `sextant`. Each add_*_command registers its options on `app` and runs when
// selected; options live in state owned by the returned callback (no globals).
#pragma once

#include <CLI/CLI.hpp>

namespace sextant::cli {

void add_models_command(CLI::App& app);
void add_clusters_command(CLI::App& app);
void add_simulate_command(CLI::App& app);
void add_validate_command(CLI::App& app);
void add_plan_command(CLI::App& app);

}  // namespace sextant::cli
