// `sextant bench comm|compute|cores`: measurements in nccl-tests conventions that calibration
// reads, and the per-core speed check that the calibration loop measures beside.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "executor_flags.hpp"
#include "mpi_launch.hpp"
#include "sextant/exec/bench_main.hpp"
#include "sextant/exec/core_probe.hpp"
#include "sextant/spec/json_io.hpp"
#include "validators.hpp"

namespace sextant::cli {

namespace {

void print_co_run(const exec::CoRunProbe& p, bool json) {
  if (json) {
    std::cout << spec::Json{{"schema", "sextant.bench_co_run/1"},
                            {"cores", p.cores},
                            {"matrix_alone_s", p.matrix_alone_s},
                            {"matrix_together_s", p.matrix_together_s},
                            {"memory_alone_s", p.memory_alone_s},
                            {"memory_together_s", p.memory_together_s},
                            {"matrix_slowdown", p.matrix_slowdown()},
                            {"memory_slowdown", p.memory_slowdown()}}
                     .dump()
              << "\n";
    return;
  }
  fmt::print("{:<26} {:>10} {:>14} {:>9}\n", "kernel", "alone ms",
             fmt::format("{} cores ms", p.cores), "slowdown");
  fmt::print("{:<26} {:>10.3f} {:>14.3f} {:>8.2f}x\n", "GEMM 512x128x384 fp32 x10",
             p.matrix_alone_s * 1e3, p.matrix_together_s * 1e3, p.matrix_slowdown());
  fmt::print("{:<26} {:>10.3f} {:>14.3f} {:>8.2f}x\n", "add over 256 KiB x400",
             p.memory_alone_s * 1e3, p.memory_together_s * 1e3, p.memory_slowdown());
}

// "1K", "64M", "1G" or plain bytes.
int64_t parse_size(const std::string& s) {
  if (s.empty())
    throw InputError("command line", "--sizes", s, "expected a size like 4K or 1048576");
  char unit = s.back();
  int64_t mult = 1;
  std::string digits = s;
  if (unit == 'K' || unit == 'k') mult = 1 << 10;
  if (unit == 'M' || unit == 'm') mult = 1 << 20;
  if (unit == 'G' || unit == 'g') mult = 1 << 30;
  if (mult != 1) digits.pop_back();
  try {
    size_t used = 0;
    int64_t v = std::stoll(digits, &used);
    if (used != digits.size() || v <= 0) throw std::invalid_argument("size");
    return v * mult;
  } catch (const std::exception&) {
    throw InputError("command line", "--sizes", s, "expected a size like 4K, 64M or 1048576");
  }
}

// `bench comm`: collectives across sizes and group sizes.
void add_bench_comm(CLI::App& bench, const std::vector<std::string>& args) {
  struct CommFlags {
    std::vector<std::string> sizes = {"4K", "64K", "1M", "8M"};
    int iterations = 20;
    int warmup = 5;
    bool json = false;
    std::string trace;
    std::string out;
    std::string nccl_tests;
    ExecutorFlags executor;
    int np = 0;
  };
  auto c = std::make_shared<CommFlags>();
  CLI::App* comm =
      bench.add_subcommand("comm", "Collectives across sizes and group sizes (MPI ranks)");
  comm->add_option("--sizes", c->sizes, "Message sizes, e.g. 4K,1M,64M")->delimiter(',');
  comm->add_option("--iterations", c->iterations, "Timed iterations per size")->check(positive());
  comm->add_option("--warmup", c->warmup, "Untimed iterations first")->check(non_negative());
  comm->add_flag("--json", c->json, "Print JSON");
  comm->add_option("--trace", c->trace,
                   "Write the timed collectives as a trace (calibration input)");
  comm->add_option("--out", c->out, "Write the rows as JSON");
  comm->add_option(
      "--nccl-tests", c->nccl_tests,
      "Also write each collective's rows in nccl-tests' layout to PREFIX<kind>_perf.txt");
  add_executor_flags(*comm, c->executor, false);
  comm->add_option("--np", c->np, "Start this many ranks with mpirun")->check(positive());
  comm->callback([c, args] {
    if (c->executor.backend == "nccl") {  // shorthand for --backend cuda --comm nccl
      c->executor.backend = "cuda";
      c->executor.comm = "nccl";
    }
    if (c->np > 0 && !under_mpi_launcher()) relaunch_under_mpirun(c->np, args);
    exec::CommBenchJob job;
    for (const std::string& s : c->sizes) job.options.sizes.push_back(parse_size(s));
    job.options.iterations = c->iterations;
    job.options.warmup = c->warmup;
    job.json = c->json;
    job.trace_file = c->trace;
    job.json_file = c->out;
    job.nccl_tests_prefix = c->nccl_tests;
    job.backend = backend_kind(c->executor);
    job.comm_choice = comm_choice(c->executor);
    int rc = exec::run_comm_bench(job);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

// `bench compute`: GEMMs and memory-bound ops.
void add_bench_compute(CLI::App& bench) {
  struct ComputeFlags {
    bool json = false;
    std::string trace;
    ExecutorFlags executor;
    int iterations = 10;
  };
  auto p = std::make_shared<ComputeFlags>();
  CLI::App* compute =
      bench.add_subcommand("compute", "GEMMs over shapes and memory-bound ops over sizes");
  compute->add_flag("--json", p->json, "Print JSON");
  compute->add_option("--trace", p->trace, "Write the timed ops as a trace (calibration input)");
  compute->add_option("--backend", p->executor.backend, "cpu or cuda (GPU 0)");
  compute->add_option("--precision", p->executor.precision,
                      "bf16 (bf16 tensors; cuda default), bf16-gemm, tf32 or fp32");
  compute->add_option("--iterations", p->iterations, "Timed calls per op")->check(positive());
  compute->callback([p] {
    exec::ComputeBenchJob job;
    job.backend = backend_kind(p->executor);
    job.precision = precision_choice(p->executor);
    job.json = p->json;
    job.trace_file = p->trace;
    job.options.iterations = p->iterations;
    exec::run_compute_bench(job);
  });
}

// `bench attention`: the CPU executor's flash attention.
void add_bench_attention(CLI::App& bench) {
  struct AttentionFlags {
    bool json = false;
    std::vector<int64_t> seq_lens;
    std::vector<int64_t> head_dims;
    int iterations = 5;
  };
  auto a = std::make_shared<AttentionFlags>();
  CLI::App* attention = bench.add_subcommand(
      "attention", "The CPU executor's blockwise flash attention over sequence lengths");
  attention->add_flag("--json", a->json,
                      "Print JSON, with an attention_kernels entry for a cluster file");
  attention->add_option("--seq-len", a->seq_lens, "Sequence lengths (default 128 256 512 1024)")
      ->check(positive());
  attention->add_option("--head-dim", a->head_dims, "Head dimensions (default 64)")
      ->check(positive());
  attention->add_option("--iterations", a->iterations, "Timed calls per point")->check(positive());
  attention->callback([a] {
    exec::AttentionBenchJob job;
    job.json = a->json;
    if (!a->seq_lens.empty()) job.options.seq_lens = a->seq_lens;
    if (!a->head_dims.empty()) job.options.head_dims = a->head_dims;
    job.options.iterations = a->iterations;
    exec::run_attention_bench(job);
  });
}

// `bench cores --reference FILE`: the cores' speeds against the fastest seen so far (FILE, then
// updated with any faster); exit 1 when a core is disturbed.
void judge_against_reference(const std::vector<exec::CoreSpeed>& speeds,
                             const std::string& reference_file, double tolerance, bool json) {
  exec::CoreSpeed best{-1, 0, 0};
  if (std::filesystem::exists(reference_file)) {
    const spec::Json j = spec::read_json_file(reference_file);
    auto time = [&](const char* key) {
      if (!j.is_object() || !j.contains(key) || !j[key].is_number() || j[key].get<double>() <= 0)
        throw InputError(reference_file, std::string("/") + key,
                         j.is_object() && j.contains(key) ? j[key].dump() : "",
                         "expected a positive time in seconds (a file bench cores wrote)");
      return j[key].get<double>();
    };
    best.multiply_add_s = time("multiply_add_s");
    best.pointer_chase_s = time("pointer_chase_s");
    if (j.contains("together_s")) best.together_s = time("together_s");  // since 2026-11-29
  }
  const exec::CoreVerdict v = exec::judge_cores(speeds, best, tolerance);
  spec::Json reference = {{"multiply_add_s", best.multiply_add_s},
                          {"pointer_chase_s", best.pointer_chase_s}};
  if (best.together_s > 0) reference["together_s"] = best.together_s;
  spec::write_json_file(reference_file, reference);
  if (!json) {
    fmt::print("{}: {}\n", v.quiet ? "quiet" : "disturbed", v.description);
  } else {
    fmt::print("{}\n", spec::Json{{"schema", "sextant.bench_cores_verdict/1"},
                                  {"quiet", v.quiet},
                                  {"slowest_cpu", v.slowest_cpu},
                                  {"slowdown", v.slowdown},
                                  {"description", v.description}}
                           .dump());
  }
  if (!v.quiet) throw CLI::RuntimeError(1);
}

// `bench cores`: is every core at its undisturbed speed?
void add_bench_cores(CLI::App& bench) {
  struct CoresFlags {
    bool json = false;
    bool co_run = false;
    int repeats = 3;
    std::string reference;
    double tolerance = 0.08;
  };
  auto k = std::make_shared<CoresFlags>();
  CLI::App* cores = bench.add_subcommand("cores",
                                         "Each core's speed alone on two fixed kernels, and all "
                                         "at once (is the machine undisturbed?)");
  cores->add_flag("--json", k->json, "Print JSON");
  cores->add_flag("--co-run", k->co_run,
                  "How much slower a core computes while every core computes (a cluster "
                  "file's device.co_run), not each core's speed");
  cores->add_option("--repeats", k->repeats, "Timings per kernel and core; the best is kept")
      ->check(positive());
  cores->add_option("--reference", k->reference,
                    "JSON file of the fastest times seen so far (created, then updated): exit 1 "
                    "when a core runs more than --tolerance above them");
  cores
      ->add_option("--tolerance", k->tolerance,
                   "Slowdown over the reference that counts as disturbed (default 0.08)")
      ->check(CLI::Range(0.0, 10.0));
  cores->callback([k] {
    if (k->co_run) {
      if (!k->reference.empty())
        throw InputError("command line", "--reference", k->reference,
                         "no reference with --co-run (it measures the cores together, not their "
                         "speed against the best seen)");
      print_co_run(exec::probe_co_run(k->repeats), k->json);
      return;
    }
    const std::vector<exec::CoreSpeed> speeds = exec::probe_cores(k->repeats);
    if (!k->reference.empty()) {
      judge_against_reference(speeds, k->reference, k->tolerance, k->json);
      return;
    }
    if (k->json) {
      spec::Json rows = spec::Json::array();
      for (const exec::CoreSpeed& s : speeds)
        rows.push_back({{"cpu", s.cpu},
                        {"multiply_add_s", s.multiply_add_s},
                        {"pointer_chase_s", s.pointer_chase_s},
                        {"together_s", s.together_s}});
      fmt::print("{}\n", spec::Json{{"schema", "sextant.bench_cores/1"}, {"cores", rows}}.dump());
      return;
    }
    fmt::print("{:>5} {:>16} {:>17} {:>20}\n", "cpu", "multiply-add ms", "pointer chase ms",
               "all cores at once ms");
    for (const exec::CoreSpeed& s : speeds)
      fmt::print("{:>5} {:>16.3f} {:>17.3f} {:>20.3f}\n", s.cpu, s.multiply_add_s * 1e3,
                 s.pointer_chase_s * 1e3, s.together_s * 1e3);
  });
}

}  // namespace

void add_bench_command(CLI::App& app, const std::vector<std::string>& args) {
  CLI::App* bench =
      app.add_subcommand("bench", "Measure collectives and compute (calibration input)");
  bench->require_subcommand(1);
  add_bench_comm(*bench, args);
  add_bench_compute(*bench);
  add_bench_attention(*bench);
  add_bench_cores(*bench);
}

}  // namespace sextant::cli
