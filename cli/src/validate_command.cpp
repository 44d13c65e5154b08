// `sextant validate`: the public validation suite (validate_suite.hpp), one row per published
// figure, mean absolute error per table, --json, and a bound for CI.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "validate_suite.hpp"

namespace sextant::cli {

namespace {

struct ValidateOptions {
  std::string network = "analytic";
  std::string kineto = "default";
  bool json = false;
  double max_mean_error = 0;  // 0: report only
  double max_row_error = 0;   // 0: report only
};

// The repository's copy of a sample trace, when it is there.
std::string sample_trace(const std::string& name) {
  std::filesystem::path p = std::filesystem::path(SEXTANT_SOURCE_DIR) / "traces/samples" / name;
  return std::filesystem::exists(p) ? p.string() : std::string();
}

// The bounded tables against --max-mean-error and --max-row-error; each miss named on stderr.
bool bounds_met(const std::vector<ValidationTable>& tables, const ValidateOptions& o) {
  bool met = true;
  for (const ValidationTable& t : tables) {
    if (!t.bounded) continue;
    if (o.max_mean_error > 0 && t.mean_abs_error() > o.max_mean_error) {
      fmt::print(stderr, "{}: mean absolute error {:.1f}% is above the allowed {:.1f}%\n", t.id,
                 100 * t.mean_abs_error(), 100 * o.max_mean_error);
      met = false;
    }
    if (o.max_row_error <= 0) continue;
    for (const ValidationRow& r : t.rows) {
      if (std::fabs(r.error()) > o.max_row_error) {
        fmt::print(stderr, "{} {}: error {:.1f}% is above the allowed {:.1f}% for a row\n", t.id,
                   r.name, 100 * r.error(), 100 * o.max_row_error);
        met = false;
      }
    }
  }
  return met;
}

int run(const ValidateOptions& o) {
  auto fidelity = spec::enum_from_name(sim::fidelity_names(), o.network);
  if (!fidelity)
    throw InputError("command line", "--network", o.network, "must be analytic or flow");
  ValidationOptions options;
  options.fidelity = *fidelity;
  options.kineto =
      o.kineto == "default" ? sample_trace("kineto-gpt2-124m-h100-b8.json.gz") : o.kineto;
  options.llama_eager_trace = sample_trace("kineto-llama3-8b-8l-h200-eager.json.gz");
  options.llama_compiled_trace = sample_trace("kineto-llama3-8b-8l-h200-compile.json.gz");
  options.llama_fsdp_eager_trace = sample_trace("kineto-llama3-8b-8l-h200-fsdp2-eager.json.gz");
  options.llama_fsdp_compiled_trace =
      sample_trace("kineto-llama3-8b-8l-h200-fsdp2-compile.json.gz");
  std::vector<ValidationTable> tables = run_validation(options);

  if (o.json) {
    spec::Json out = spec::Json::array();
    for (const ValidationTable& t : tables) {
      spec::Json rows = spec::Json::array();
      for (const ValidationRow& r : t.rows)
        rows.push_back({{"name", r.name},
                        {"published", r.published},
                        {"predicted", r.predicted},
                        {"error", r.error()},
                        {"detail", r.detail}});
      out.push_back({{"table", t.id},
                     {"title", t.title},
                     {"unit", t.unit},
                     {"bounded", t.bounded},
                     {"mean_abs_error", t.mean_abs_error()},
                     {"max_abs_error", t.max_abs_error()},
                     {"note", t.note},
                     {"rows", rows}});
    }
    std::cout << spec::Json{{"tables", out}, {"network", o.network}}.dump(2) << "\n";
  } else {
    for (const ValidationTable& t : tables) {
      fmt::print("{}  {}\n", t.id, t.title);
      if (!t.rows.empty())
        fmt::print("    {:<34} {:>11} {:>11} {:>8}  {}\n", "row", "published", "predicted", "error",
                   t.unit == "MB" ? "" : "plan");
      for (const ValidationRow& r : t.rows)
        fmt::print("    {:<34} {:>11.3f} {:>11.3f} {:>7.1f}%  {}\n", r.name, r.published,
                   r.predicted, 100 * r.error(), r.detail);
      if (!t.rows.empty())
        fmt::print("    {} ({}): mean absolute error {:.1f}%, worst {:.1f}%\n", t.id, t.unit,
                   100 * t.mean_abs_error(), 100 * t.max_abs_error());
      if (!t.note.empty()) fmt::print("    {}\n", t.note);
      fmt::print("\n");
    }
  }
  return bounds_met(tables, o) ? 0 : 1;
}

}  // namespace

void add_validate_command(CLI::App& app) {
  auto o = std::make_shared<ValidateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "validate",
      "Predict the published runs of shared/reference/published.md (Megatron-LM SC'21 Table 1, "
      "Korthikanti et al. Tables 2, 4, 5, Megatron-LM's 2020 scaling tables, NeMo 24.07's H100 "
      "FP8 table, PyTorch-profiler traces) and report the errors");
  cmd->add_option("--network", o->network, "Network fidelity: analytic or flow");
  cmd->add_option("--kineto", o->kineto,
                  "PyTorch-profiler trace for table K1 (default: the repository's copy of the "
                  "reference trace; \"\" skips K1)");
  cmd->add_flag("--json", o->json, "Print JSON");
  cmd->add_option("--max-mean-error", o->max_mean_error,
                  "Exit 1 when a timing table's mean absolute error exceeds this fraction (CI)");
  cmd->add_option("--max-row-error", o->max_row_error,
                  "Exit 1 when a row of a timing table is off by more than this fraction (CI)");
  cmd->callback([o] {
    int rc = run(*o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace sextant::cli
