// The `sextant` command: wires the libraries together. Bad input prints one line per problem and
// exits 2; internal errors exit 3.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.hpp"
#include "sextant/exec/host_allocator.hpp"
#include "sextant/spec/build_info.hpp"
#include "sextant/spec/error.hpp"
#include "strict_values.hpp"

int main(int argc, char** argv) {
  // Every command reuses the memory it frees (host_allocator.hpp): on the CI VM a page fault is
  // expensive, and `plan` refaulted its simulations' memory after each leader.
  sextant::exec::keep_freed_host_memory();
  CLI::App app{"Sextant: predict, plan, run and calibrate parallel training of neural networks"};
  app.set_version_flag("--version", fmt::format("sextant {} ({})", sextant::spec::kVersion,
                                                sextant::spec::kGitCommit));
  app.require_subcommand(1);
  sextant::cli::add_models_command(app);
  sextant::cli::add_clusters_command(app);
  sextant::cli::add_stacks_command(app);
  sextant::cli::add_simulate_command(app);
  sextant::cli::add_plan_command(app);
  const std::vector<std::string> args(argv, argv + argc);
  sextant::cli::add_run_command(app, args);
  sextant::cli::add_bench_command(app, args);
  sextant::cli::add_validate_command(app);
  sextant::cli::add_calibrate_command(app);
  sextant::cli::add_loop_command(app);
  sextant::cli::make_values_strict(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // the command reported its failure already
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every bad flag or value is bad input: 2, as documented.
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const sextant::InputError& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  } catch (const sextant::InternalError& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
