// Slurm batch scripts for a plan: Sextant's ranks under srun with PMIx, or a stack's under
// torchrun.
#include "sextant/interop/slurm.hpp"

#include <fmt/format.h>

#include <regex>

#include "sextant/spec/error.hpp"

namespace sextant::interop {

namespace {

void check_word(Diagnostics& diag, const char* flag, const std::string& value, const char* re,
                const char* expected) {
  if (!value.empty() && !std::regex_match(value, std::regex(re))) diag.add(flag, value, expected);
}

// The job's file NAME-JOBID.SUFFIX in its directory, as the script's shell expands it.
std::string job_file(const SlurmRequest& r, const std::string& suffix) {
  return shell_quote(r.directory + "/" + r.job_name + "-") + "\"${SLURM_JOB_ID}\"" +
         shell_quote(suffix);
}

std::string header(const SlurmRequest& r, const std::string& what,
                   const std::vector<std::string>& notes = {}) {
  std::string s = "#!/bin/bash\n";
  s += fmt::format("# {} (written by `sextant launch --slurm`)\n", what);
  for (const std::string& note : notes) s += "# note: " + note + "\n";
  s += fmt::format("#SBATCH --job-name={}\n", r.job_name);
  s += fmt::format("#SBATCH --nodes={}\n", r.nodes);
  if (r.gpus) s += fmt::format("#SBATCH --gpus-per-node={}\n", r.ranks_per_node);
  if (!r.partition.empty()) s += fmt::format("#SBATCH --partition={}\n", r.partition);
  if (!r.account.empty()) s += fmt::format("#SBATCH --account={}\n", r.account);
  if (!r.time.empty()) s += fmt::format("#SBATCH --time={}\n", r.time);
  s += fmt::format("#SBATCH --output={}\n",
                   r.output.empty() ? r.directory + "/" + r.job_name + "-%j.out" : r.output);
  return s;
}

// A heredoc that writes `text` to the job's file `suffix`, into the shell variable `var`.
std::string write_file(const SlurmRequest& r, const std::string& var, const std::string& suffix,
                       const std::string& text) {
  // The quoted delimiter keeps the shell from expanding anything in the text; a text holding
  // the delimiter line itself cannot come from export_plan or sextant.plan/1 (JSON, TOML).
  return fmt::format("{}={}\ncat > \"${}\" <<'SEXTANT_EOF'\n{}{}SEXTANT_EOF\n", var,
                     job_file(r, suffix), var, text,
                     text.empty() || text.back() == '\n' ? "" : "\n");
}

// torchrun on every node (one task each), `entry` and its arguments after it.
std::string torchrun(const SlurmRequest& r, const StackJob& job, const std::string& entry) {
  return fmt::format(
      "head=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
      "srun --ntasks-per-node=1 torchrun --nnodes=\"$SLURM_NNODES\" --nproc-per-node={} \\\n"
      "  --rdzv-id=\"$SLURM_JOB_ID\" --rdzv-backend=c10d --rdzv-endpoint=\"$head:{}\" \\\n"
      "  {}",
      r.ranks_per_node, job.rendezvous_port, entry);
}

// Megatron's arguments one per line, each value a shell word.
std::string argument_lines(const std::vector<Setting>& settings) {
  std::string text;
  for (const Setting& s : settings) {
    text += " \\\n  " + s.name;
    if (s.value.is_array()) {
      for (const spec::Json& v : s.value)
        text += " " + shell_quote(v.is_string() ? v.get<std::string>() : v.dump());
    } else if (!(s.value.is_boolean() && s.value.get<bool>())) {
      text += " " + shell_quote(s.value.is_string() ? s.value.get<std::string>() : s.value.dump());
    }
  }
  return text + "\n";
}

}  // namespace

std::string job_name(std::string text) {
  for (char& c : text)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  return text;
}

std::string shell_quote(const std::string& word) {
  static const std::regex plain("[A-Za-z0-9_./:=,+@%^-]+");
  if (std::regex_match(word, plain)) return word;
  std::string q = "'";
  for (char c : word) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

void check_slurm_request(const SlurmRequest& r) {
  Diagnostics diag("command line");
  check_word(diag, "--job-name", r.job_name, "[A-Za-z0-9._-]+",
             "letters, digits, '.', '_' and '-' (it names the job's files too)");
  check_word(diag, "--partition", r.partition, "[A-Za-z0-9._-]+(,[A-Za-z0-9._-]+)*",
             "a partition name or a comma-separated list of them");
  check_word(diag, "--account", r.account, "[A-Za-z0-9._-]+", "an account name");
  // sbatch(1), --time: "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
  // "days-hours:minutes" and "days-hours:minutes:seconds".
  check_word(diag, "--time", r.time, R"(\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2})",
             "minutes, M:S, H:M:S, D-H, D-H:M or D-H:M:S (sbatch --time)");
  // #SBATCH lines are not shell: no quoting there, and '%' is sbatch's file-name pattern.
  check_word(diag, "--dir", r.directory, R"(/[^\s'"\\%$`]*)",
             "an absolute path without white space, quotes, '%', '$' or '`'");
  check_word(diag, "--output", r.output, R"([^\s'"\\$`]+)",
             "a file name without white space, quotes, '$' or '`' ('%j': the job id)");
  if (r.job_name.empty()) diag.add("--job-name", "", "a name for the job");
  if (r.directory.empty()) diag.add("--dir", "", "the directory the job writes its files in");
  if (r.nodes < 1 || r.ranks_per_node < 1)
    diag.add("--nodes", std::to_string(r.nodes), "at least one node with at least one rank");
  diag.throw_if_any();
}

std::string sbatch_script(const SlurmRequest& r, const SextantJob& job) {
  check_slurm_request(r);
  std::string s =
      header(r, "Sextant's executor on " + std::to_string(r.nodes * r.ranks_per_node) + " ranks");
  s += fmt::format("#SBATCH --ntasks-per-node={}\n", r.ranks_per_node);
  s += "set -euo pipefail\n\n";
  s += "# The plan, where every node reads it.\n";
  s += write_file(r, "plan", ".plan.json", job.plan_json);
  if (!job.core_check.empty()) {
    s += "\n# The cores' check around the ranks: what it finds disturbed, a line each time.\n";
    s += "cores=" + job_file(r, ".cores") + "\n: >\"$cores\"\ncheck_cores() {\n  if !";
    for (const std::string& a : job.core_check) s += " " + shell_quote(a);
    s += " >\"$cores.$1.log\" 2>&1; then\n"
         "    echo \"$1 the run: $(tail -n 1 \"$cores.$1.log\")\" >>\"$cores\"\n  fi\n}\n"
         "check_cores before\n";
  }
  s += "\n# One task per rank: Open MPI takes its rank and peers from Slurm's PMIx server.\n";
  s += std::string("srun --mpi=pmix ") + (job.bind_cores ? "--cpu-bind=cores " : "") +
       shell_quote(job.binary) + " run";
  for (const std::string& a : job.run_args) s += " " + shell_quote(a);
  s += " --plan \"$plan\" --log-json " + job_file(r, ".steps.jsonl") + "\n";
  if (!job.core_check.empty()) s += "check_cores after\n";
  return s;
}

std::string sbatch_script(const SlurmRequest& r, const StackJob& job) {
  check_slurm_request(r);
  const Target target = job.exported.target;
  const std::string name(spec::enum_name(target_names(), target));
  std::string s;
  switch (target) {
    case Target::kMegatronCore:
    case Target::kMegatronLm: {
      s = header(r, name + ": Megatron-LM's pretrain_gpt.py", job.exported.notes);
      s += "#SBATCH --ntasks-per-node=1\nset -euo pipefail\n\n";
      // Megatron-LM's examples set it: with one hardware queue the tensor-parallel communication
      // kernels are issued in the order overlap needs
      // (examples/gpt3/train_gpt3_175b_distributed.sh).
      s += "export CUDA_DEVICE_MAX_CONNECTIONS=1\n";
      const std::string entry = job.entry.empty()
                                    ? "\"${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout}/"
                                      "pretrain_gpt.py\""
                                    : shell_quote(job.entry);
      s += torchrun(r, job, entry) + argument_lines(job.exported.settings);
      return s;
    }
    case Target::kTorchtitan:
      s = header(r, name + ": torchtitan.train", job.exported.notes);
      s += "#SBATCH --ntasks-per-node=1\nset -euo pipefail\n\n";
      s += write_file(r, "config", ".toml", job.exported.text);
      s += torchrun(r, job, "-m torchtitan.train --job.config_file \"$config\"\n");
      return s;
    case Target::kDeepspeed:
      if (job.entry.empty())
        throw InputError("command line", "--script", "",
                         "the training script that calls deepspeed.initialize (DeepSpeed is a "
                         "library: the loop and the data are the script's)");
      s = header(r, name + ": " + job.entry, job.exported.notes);
      s += "#SBATCH --ntasks-per-node=1\nset -euo pipefail\n\n";
      s += write_file(r, "config", ".deepspeed.json", job.exported.text);
      // deepspeed.add_config_arguments gives the script --deepspeed and --deepspeed_config
      // (deepspeed/__init__.py); deepspeed.init_distributed reads torchrun's environment.
      s += torchrun(r, job,
                    shell_quote(job.entry) + " --deepspeed --deepspeed_config \"$config\"\n");
      return s;
    case Target::kNemo:
      break;
  }
  throw InputError("command line", "--to", name,
                   "a target launched here: NeMo-Run submits its own Slurm jobs (nemo llm pretrain "
                   "--executor slurm with the overrides of `sextant export --to nemo`)");
}

}  // namespace sextant::interop
