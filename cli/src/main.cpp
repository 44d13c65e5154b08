// The `sextant` command: wires the libraries together. Bad input prints one line per problem and
// exits 2; internal errors exit 3.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "commands.hpp"
#include "fitted_output.hpp"
#include "sextant/exec/host_allocator.hpp"
#include "sextant/spec/build_info.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/json_reader.hpp"
#include "strict_values.hpp"

namespace {

// `--wide` anywhere on the command line: output is not wrapped at 100 columns. Taken out before
// CLI11 parses (it belongs to no subcommand); what remains is returned.
std::vector<std::string> take_wide_flag(int argc, char** argv, bool& wide) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::string_view(argv[i]) == "--wide") {
      wide = true;
      continue;
    }
    args.emplace_back(argv[i]);
  }
  return args;
}

// An unknown flag of the subcommand that was being parsed, with the closest known one: CLI11
// would report a missing required flag first ("--model is required" for a typed --modle).
std::string unknown_flag_message(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) {
    std::vector<std::string> names;
    for (const CLI::Option* o : sub->get_options({}))
      for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
    const std::vector<std::string_view> views(names.begin(), names.end());
    for (const std::string& extra : sub->remaining()) {
      if (extra.rfind("--", 0) != 0) continue;
      const std::string flag = extra.substr(0, extra.find('='));
      return fmt::format("unknown flag {} for `sextant {}`{}; see sextant {} --help", flag,
                         sub->get_name(), sextant::spec::did_you_mean(flag, views),
                         sub->get_name());
    }
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  // Every command reuses the memory it frees (host_allocator.hpp): on the CI VM a page fault is
  // expensive, and `plan` refaulted its simulations' memory after each leader.
  sextant::exec::keep_freed_host_memory();
  bool wide = false;
  std::vector<std::string> args = take_wide_flag(argc, argv, wide);
  sextant::cli::wrap_stdout(wide ? 0 : sextant::cli::kOutputColumns);
  CLI::App app{"Sextant: predict, plan, run and calibrate parallel training of neural networks"};
  app.formatter(std::make_shared<sextant::cli::WrappingFormatter>());
  app.footer("Output is wrapped at 100 columns; --wide (anywhere) leaves it unwrapped.");
  app.set_version_flag("--version", fmt::format("sextant {} ({})", sextant::spec::kVersion,
                                                sextant::spec::git_commit()));
  app.require_subcommand(1);
  sextant::cli::add_models_command(app);
  sextant::cli::add_clusters_command(app);
  sextant::cli::add_stacks_command(app);
  sextant::cli::add_simulate_command(app);
  sextant::cli::add_plan_command(app);
  sextant::cli::add_export_command(app);
  sextant::cli::add_import_command(app);
  sextant::cli::add_launch_command(app);
  sextant::cli::add_tune_command(app);
  // The ranks mpirun starts for `run --np` get the same arguments, --wide included.
  std::vector<std::string> relaunch = args;
  if (wide) relaunch.emplace_back("--wide");
  sextant::cli::add_run_command(app, relaunch);
  sextant::cli::add_bench_command(app, relaunch);
  sextant::cli::add_validate_command(app);
  sextant::cli::add_calibrate_command(app);
  sextant::cli::add_loop_command(app);
  sextant::cli::make_values_strict(app);
  try {
    std::vector<std::string> reversed(args.rbegin(),
                                      args.rend() - 1);  // CLI11 takes them last first
    app.parse(reversed);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // the command reported its failure already
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0) {
      if (const std::string unknown = unknown_flag_message(app); !unknown.empty()) {
        fmt::print(stderr, "error: {}\n", unknown);
        return 2;
      }
    }
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
