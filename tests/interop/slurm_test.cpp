// `sextant launch --slurm`'s scripts: the job's size in #SBATCH lines, the ranks' start (srun with
// PMIx for Sextant, torchrun per node for a stack) with every exported setting as one shell word,
// the files the job writes, and refusals naming the flag. tests/slurm/launch.sh submits them to a
// real Slurm.
#include "sextant/interop/slurm.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "expect_input_error.hpp"
#include "sextant/models/zoo.hpp"

namespace sextant::interop {
namespace {

SlurmRequest request() {
  SlurmRequest r;
  r.job_name = "llama-dp4";
  r.directory = "/scratch/runs";
  r.nodes = 2;
  r.ranks_per_node = 8;
  r.gpus = true;
  r.partition = "gpu";
  r.time = "0-02:00";
  return r;
}

// Whether bash parses `script` (bash -n: syntax only, nothing runs).
bool bash_parses(const std::string& script) {
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("sextant_slurm_test_" + std::to_string(getpid()));
  std::ofstream(file) << script;
  const int rc = std::system(("bash -n '" + file.string() + "' 2>/dev/null").c_str());
  std::filesystem::remove(file);
  return rc == 0;
}

Exported megatron_export(std::optional<Trial> trial) {
  spec::Plan p;
  p.dp = 4;
  p.tp = 2;
  p.pp = 2;
  p.zero = 1;
  p.global_batch = 64;
  const spec::ModelSpec m = models::zoo_model("llama2-7b");
  spec::validate_plan(p, m, p.world_size(), "test plan");
  return export_plan(p, m, spec::builtin_stack("megatron-core"), spec::Dtype::kBf16,
                     Target::kMegatronCore, trial);
}

TEST(ShellQuote, PlainWordsStayAndTheRestIsSingleQuoted) {
  EXPECT_EQ(shell_quote("--seq-length"), "--seq-length");
  EXPECT_EQ(shell_quote("/a/b.json"), "/a/b.json");
  EXPECT_EQ(shell_quote("RMSNorm"), "RMSNorm");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("$HOME"), "'$HOME'");
  // A quote ends the quoted part, is escaped, and a new part starts: 'it'\''s'.
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote(""), "''");
}

TEST(SlurmScript, JobNamesKeepWhatSlurmAndFileNamesTake) {
  EXPECT_EQ(job_name("llama3-8b-dp4.tp2.pp1.z1.mb1"), "llama3-8b-dp4.tp2.pp1.z1.mb1");
  EXPECT_EQ(job_name("my model/dp2 (v1)"), "my_model_dp2__v1_");
}

TEST(SlurmScript, SextantRanksAreTasksUnderSrunWithPmix) {
  SlurmRequest r = request();
  const SextantJob job{"/opt/sextant bin/sextant",
                       {"--model", "llama2-7b", "--steps", "20"},
                       "{\"schema\": \"sextant.plan/1\", \"dp\": 16}\n"};
  const std::string s = sbatch_script(r, job);
  EXPECT_EQ(s.rfind("#!/bin/bash\n", 0), 0u);
  for (const char* line :
       {"#SBATCH --job-name=llama-dp4\n", "#SBATCH --nodes=2\n", "#SBATCH --ntasks-per-node=8\n",
        "#SBATCH --gpus-per-node=8\n", "#SBATCH --partition=gpu\n", "#SBATCH --time=0-02:00\n",
        "#SBATCH --output=/scratch/runs/llama-dp4-%j.out\n",
        "plan=/scratch/runs/llama-dp4-\"${SLURM_JOB_ID}\".plan.json\n",
        "<<'SEXTANT_EOF'\n{\"schema\": \"sextant.plan/1\", \"dp\": 16}\nSEXTANT_EOF\n",
        "srun --mpi=pmix '/opt/sextant bin/sextant' run --model llama2-7b --steps 20 --plan "
        "\"$plan\" --log-json /scratch/runs/llama-dp4-\"${SLURM_JOB_ID}\".steps.jsonl\n"})
    EXPECT_NE(s.find(line), std::string::npos) << line << " in\n" << s;
  EXPECT_EQ(s.find("--account"), std::string::npos);  // not asked: the cluster's default
  EXPECT_TRUE(bash_parses(s));
  EXPECT_EQ(s.find("--cpu-bind"), std::string::npos);  // GPU ranks: Slurm's binding
  SextantJob cpu = job;
  cpu.bind_cores = true;
  r.gpus = false;
  EXPECT_NE(sbatch_script(r, cpu).find("srun --mpi=pmix --cpu-bind=cores '/opt/sextant bin/"),
            std::string::npos);
}

// The cores' check inside a trial's job, before and after the ranks: run with a stand-in srun and
// a checker that finds the cores disturbed the first time and quiet the second, the job's .cores
// file holds one line, the first check's last line of output, named by when it ran.
TEST(SlurmScript, TheCoresAreCheckedAroundTheRanksInTheTrialsOwnJob) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("sextant_cores_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "bin");
  SlurmRequest r = request();
  r.directory = dir.string();
  r.gpus = false;
  SextantJob job{"sextant", {"--steps", "3"}, "{}\n"};
  job.core_check = {(dir / "check").string(), "--reference", (dir / "cores.json").string()};
  const std::string s = sbatch_script(r, job);
  EXPECT_TRUE(bash_parses(s));
  EXPECT_LT(s.find("check_cores before\n"), s.find("srun --mpi=pmix"));
  EXPECT_GT(s.find("check_cores after\n"), s.find("srun --mpi=pmix"));
  std::ofstream(dir / "bin" / "srun") << "#!/bin/sh\nexit 0\n";
  std::ofstream(dir / "check") << "#!/bin/sh\nif [ -e \"$0.ran\" ]; then echo quiet; exit 0; fi\n"
                                  "touch \"$0.ran\"; echo measuring; echo core 1 ran 23% slow; "
                                  "exit 1\n";
  std::ofstream(dir / "job.sh") << s;
  std::filesystem::permissions(dir / "bin" / "srun", std::filesystem::perms::owner_all);
  std::filesystem::permissions(dir / "check", std::filesystem::perms::owner_all);
  const std::string run = "cd '" + dir.string() + "' && PATH='" + (dir / "bin").string() +
                          ":'\"$PATH\" SLURM_JOB_ID=7 bash job.sh >/dev/null 2>&1";
  ASSERT_EQ(std::system(run.c_str()), 0);
  std::ifstream in(dir / "llama-dp4-7.cores");
  const std::string verdict((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(verdict, "before the run: core 1 ran 23% slow\n");
  std::filesystem::remove_all(dir);
}

TEST(SlurmScript, AStackRunsTorchrunPerNodeWithEveryExportedSetting) {
  const SlurmRequest r = request();
  const StackJob job{megatron_export(Trial{5}), ""};
  const std::string s = sbatch_script(r, job);
  for (const char* line :
       {"#SBATCH --ntasks-per-node=1\n", "#SBATCH --gpus-per-node=8\n",
        "export CUDA_DEVICE_MAX_CONNECTIONS=1\n",
        "srun --ntasks-per-node=1 torchrun --nnodes=\"$SLURM_NNODES\" --nproc-per-node=8 \\\n",
        "--rdzv-backend=c10d --rdzv-endpoint=\"$head:29500\"",
        "\"${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout}/pretrain_gpt.py\" \\\n"})
    EXPECT_NE(s.find(line), std::string::npos) << line << " in\n" << s;
  // Every setting on a line of its own: "  NAME VALUE \" (a bare flag: "  NAME \").
  for (const Setting& set : job.exported.settings) {
    std::string want = "  " + set.name;
    if (!set.value.is_boolean())
      want += " " + (set.value.is_string() ? set.value.get<std::string>() : set.value.dump());
    const bool found = s.find(want + " \\\n") != std::string::npos ||
                       s.find(want + "\n") != std::string::npos;  // the last has no " \\"
    EXPECT_TRUE(found) << want;
  }
  EXPECT_NE(s.find("  --train-iters 5 \\\n"), std::string::npos);
  EXPECT_TRUE(bash_parses(s));
}

TEST(SlurmScript, ConfigFilesAreWrittenByTheJobAndNeedTheirEntryPoint) {
  spec::Plan p;
  p.dp = 16;
  p.zero = 3;
  p.global_batch = 64;
  const spec::ModelSpec m = models::zoo_model("llama3-8b");
  const Exported titan = export_plan(p, m, spec::builtin_stack("torchtitan"), spec::Dtype::kBf16,
                                     Target::kTorchtitan, Trial{5});
  const std::string s = sbatch_script(request(), StackJob{titan, ""});
  EXPECT_NE(s.find("config=/scratch/runs/llama-dp4-\"${SLURM_JOB_ID}\".toml\n"), std::string::npos);
  EXPECT_NE(s.find("<<'SEXTANT_EOF'\n" + titan.text + "SEXTANT_EOF\n"), std::string::npos) << s;
  EXPECT_NE(s.find("-m torchtitan.train --job.config_file \"$config\"\n"), std::string::npos);
  EXPECT_TRUE(bash_parses(s));

  const Exported ds = export_plan(p, m, spec::builtin_stack("deepspeed"), spec::Dtype::kBf16,
                                  Target::kDeepspeed, Trial{5});
  EXPECT_INPUT_ERROR(sbatch_script(request(), StackJob{ds, ""}), "--script");
  const std::string d = sbatch_script(request(), StackJob{ds, "train ds.py"});
  EXPECT_NE(d.find("'train ds.py' --deepspeed --deepspeed_config \"$config\"\n"), std::string::npos)
      << d;
  EXPECT_TRUE(bash_parses(d));

  const Exported nemo =
      export_plan(p, m, spec::builtin_stack("megatron-core"), spec::Dtype::kBf16, Target::kNemo);
  EXPECT_INPUT_ERROR(sbatch_script(request(), StackJob{nemo, ""}), "NeMo-Run");
}

TEST(SlurmScript, ValuesSlurmRefusesOrThatWouldChangeTheScriptAreRefusedByFlag) {
  for (const char* time : {"30", "30:00", "2:00:00", "1-12", "1-12:30", "1-12:30:00"}) {
    SlurmRequest r = request();
    r.time = time;
    EXPECT_NO_THROW(check_slurm_request(r)) << time;
  }
  const std::vector<std::pair<void (*)(SlurmRequest&), const char*>> bad = {
      {[](SlurmRequest& r) { r.time = "1 day"; }, "--time"},
      {[](SlurmRequest& r) { r.time = "2h"; }, "--time"},
      {[](SlurmRequest& r) { r.partition = "gpu batch"; }, "--partition"},
      {[](SlurmRequest& r) { r.account = "a\n#SBATCH --x"; }, "--account"},
      {[](SlurmRequest& r) { r.job_name = "my job"; }, "--job-name"},
      {[](SlurmRequest& r) { r.directory = "runs"; }, "--dir"},
      {[](SlurmRequest& r) { r.directory = "/my runs"; }, "--dir"},
      {[](SlurmRequest& r) { r.output = "/x/'a'.out"; }, "--output"},
      {[](SlurmRequest& r) { r.nodes = 0; }, "--nodes"},
  };
  for (const auto& [change, flag] : bad) {
    SlurmRequest r = request();
    change(r);
    EXPECT_INPUT_ERROR(check_slurm_request(r), flag);
  }
}

}  // namespace
}  // namespace sextant::interop
