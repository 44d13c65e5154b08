// Readers on the sample files of traces/samples (real runs) and on broken inputs.
#include "sextant/traces/readers.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "expect_input_error.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/traces/compare.hpp"
#include "sextant/traces/kernel_classes.hpp"
#include "test_paths.hpp"

namespace sextant::traces {
namespace {

std::string sample(const std::string& name) {
  return test::source_path("traces/samples/" + name);
}

TEST(NcclTestsReader, ReadsTheSample) {
  Samples s = read_nccl_tests(sample("mpi-2ranks-all_reduce_perf.txt"));
  ASSERT_EQ(s.comm.size(), 4u);  // 4K, 64K, 512K, 4M
  for (const CommSample& c : s.comm) {
    EXPECT_EQ(c.collective, spec::CollectiveKind::kAllReduce);
    EXPECT_EQ(c.ranks, 2);
    EXPECT_GT(c.seconds, 0);
  }
  EXPECT_EQ(s.comm.front().bytes, 4096);
  EXPECT_EQ(read_nccl_tests(sample("mpi-2ranks-all_gather_perf.txt")).comm.front().collective,
            spec::CollectiveKind::kAllGather);
}

TEST(NcclTestsReader, RejectsBrokenOutput) {
  const std::string header =
      "#  Rank  0 Group  0 Pid 1 on h device 0\n#       size         count      type   redop    "
      "root     time   algbw\n";
  EXPECT_INPUT_ERROR(parse_nccl_tests("    1024 256 float sum -1 5.0 0.2\n", "x.txt",
                                      spec::CollectiveKind::kAllReduce),
                     "x.txt: line 1: a data row before the");
  EXPECT_INPUT_ERROR(parse_nccl_tests(header + "    1024 256 float sum -1 abc 0.2\n", "x.txt",
                                      spec::CollectiveKind::kAllReduce),
                     "x.txt: line 3 = abc: expected the time in microseconds");
  EXPECT_INPUT_ERROR(
      parse_nccl_tests("#       size  count type redop root time\n 1024 256 float sum -1 5.0\n",
                       "x.txt", spec::CollectiveKind::kAllReduce),
      "no '#  Rank' lines");
  EXPECT_INPUT_ERROR(parse_nccl_tests(header, "log.txt", std::nullopt),
                     "cannot tell which collective");
  EXPECT_INPUT_ERROR(read_nccl_tests("/nonexistent/all_reduce.txt"), "cannot open");
}

// Found by the trust probe of issue 59: each of these was fitted (a nan time wrote "alpha_us":
// null) or dropped without a word.
TEST(NcclTestsReader, RefusesWhatIsNotAMeasurement) {
  const std::string header =
      "#  Rank  0 Group  0 Pid 1 on h device 0\n"
      "#       size         count      type   redop    root     time   algbw   busbw #wrong     "
      "time   algbw   busbw #wrong\n";
  auto parse = [&](const std::string& rows) {
    return parse_nccl_tests(header + rows, "x.txt", spec::CollectiveKind::kAllReduce);
  };
  const std::string ok = "  1024  256 float sum -1  5.0 0.2 0.3  0  5.1 0.2 0.3  0\n";
  EXPECT_EQ(parse(ok).comm.size(), 1u);
  for (const char* time : {"nan", "inf", "0", "-5.0", "0x10", "5.0us"})
    EXPECT_INPUT_ERROR(
        parse(fmt::format("  1024  256 float sum -1  {} 0.2 0.3  0  5 0 0 0\n", time)),
        fmt::format("x.txt: line 3 = {}: expected the time in microseconds", time));
  for (const char* size : {"12abc", "0x400", "-8", "1e3"})
    EXPECT_INPUT_ERROR(
        parse(fmt::format("  {}  256 float sum -1  5.0 0.2 0.3  0  5 0 0 0\n", size)),
        fmt::format("x.txt: line 3 = {}: expected the size in bytes", size));
  EXPECT_INPUT_ERROR(parse("  1024  256 float sum -1  5.0 0.2 0.3  0  5.1 0.2 0.3  2\n"),
                     "x.txt: line 3 = 2: #wrong must be 0");
  EXPECT_INPUT_ERROR(parse(ok + "  1024  256 float sum -1  50.0 0.2 0.3  0  5.1 0.2 0.3  0\n"),
                     "x.txt: line 4 = 1024: sizes must grow down the table (line 3 has 1024)");
  EXPECT_INPUT_ERROR(parse(ok + "  512  128 float sum -1  4.0 0.2 0.3  0  5.1 0.2 0.3  0\n"),
                     "sizes must grow");
  // nccl-tests -c 0 prints N/A for #wrong; a size-0 row times the call only: left out, said so.
  const Samples s = parse("     0    0 float sum -1  3.0 0.0 0.0  N/A  3.0 0.0 0.0  N/A\n" + ok);
  ASSERT_EQ(s.comm.size(), 1u);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_NE(s.warnings[0].find("x.txt: 1 row(s) of size 0 left out"), std::string::npos);
}

TEST(KinetoReader, ReadsTheSample) {
  Samples s = read_kineto(sample("pytorch-cpu-kineto.json"));
  ASSERT_FALSE(s.compute.empty());
  // The first Linear of the profiled MLP: addmm with [256, 128] @ [128, 512].
  bool found = false;
  for (const ComputeSample& c : s.compute) {
    if (c.name == "aten::addmm" && c.flops == 2.0 * 256 * 512 * 128) found = true;
  }
  EXPECT_TRUE(found);
}

TEST(KinetoReader, RejectsWhatIsNotAProfile) {
  EXPECT_INPUT_ERROR(parse_kineto(spec::Json::parse(R"({"events": []})"), "p.json"),
                     "p.json: /traceEvents: missing");
  EXPECT_INPUT_ERROR(
      parse_kineto(
          spec::Json::parse(
              R"({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 3}]})"),
          "p.json"),
      "record_shapes=True");
  EXPECT_INPUT_ERROR(
      parse_kineto(
          spec::Json::parse(
              R"({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": "x"}]})"),
          "p.json"),
      "p.json: /traceEvents/0/dur = \"x\": expected a number of microseconds");
}

// Found by fuzz/: a numeric "name" or a non-object "args" in one event stopped the read with the
// JSON library's own exception. Fields of another type count as absent; the other events are read.
TEST(KinetoReader, FieldsOfAnotherTypeCountAsAbsent) {
  const spec::Json trace = spec::Json::parse(R"({"traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": 7, "dur": 3},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 2, "args": [1, 2]},
    {"ph": "X", "cat": 5, "name": "aten::mm", "dur": 2},
    {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "dur": 4, "args": {"External id": "x"}},
    {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "dur": 6, "args": {"External id": 1}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 10,
     "args": {"Input Dims": [[4, 8], [8, 2]], "External id": 1}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::add", "dur": 10,
     "args": {"Input Dims": [[4611686018427387904, 4]], "External id": 2}}
  ]})");
  const Samples s = parse_kineto(trace, "p.json");
  // Only the well-formed mm: 2 * 4 * 2 * 8 FLOPs in its kernel's 6 us. The add's 2^62 x 4
  // elements are past any tensor and left out (said so) instead of overflowing the bytes.
  ASSERT_EQ(s.compute.size(), 1u);
  EXPECT_EQ(s.compute[0].flops, 2.0 * 4 * 2 * 8);
  EXPECT_DOUBLE_EQ(s.compute[0].seconds, 6e-6);
  EXPECT_EQ(s.ran_on.at("p.json"), spec::DeviceKind::kGpu);
  const KernelTimes k = kernel_times(trace, "p.json");
  EXPECT_EQ(k.kernels, 2);
}

// In a GPU profile an op is timed by its own kernels: an op that launched none (a wrapper around
// another op's kernels, or a CPU-side op) has only a host time, which is not what the GPU spent
// (these 120 ops of the H100 sample made its fit worse than no fit, 102% -> 111%). Times that
// no profiler writes are a damaged file.
TEST(KinetoReader, GpuOpsAreTimedByTheirKernelsAndDamagedTimesRefused) {
  const spec::Json trace = spec::Json::parse(R"({"traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 5, "dur": 6, "args": {"External id": 1}},
    {"ph": "X", "cat": "kernel", "name": "zero", "ts": 6, "dur": 0, "args": {"External id": 3}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 10,
     "args": {"Input Dims": [[4, 8], [8, 2]], "External id": 1}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 2, "dur": 10,
     "args": {"Input Dims": [[4, 8], [8, 2]], "External id": 2}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 3, "dur": 10,
     "args": {"Input Dims": [[4, 8], [8, 2]], "External id": 3}}
  ]})");
  const Samples s = parse_kineto(trace, "g.json");
  ASSERT_EQ(s.compute.size(), 1u);
  EXPECT_DOUBLE_EQ(s.compute[0].seconds, 6e-6);
  ASSERT_EQ(s.warnings.size(), 2u);
  EXPECT_EQ(s.warnings[0], "g.json: 1 op(s) left out: a duration of 0 (first: /traceEvents/4)");
  EXPECT_EQ(s.warnings[1],
            "g.json: 1 op(s) left out: launched no GPU kernel of its own (first: /traceEvents/3)");
  for (const char* bad : {R"("ts": -4)", R"("dur": -1)", R"("dur": 1e300)", R"("dur": "9")"}) {
    spec::Json broken = trace;
    broken["traceEvents"][0].update(spec::Json::parse(std::string("{") + bad + "}"));
    EXPECT_INPUT_ERROR(parse_kineto(broken, "g.json"), "g.json: /traceEvents/0/");
  }
}

TEST(KernelClasses, WallStepRunsFromOptimizerStepToOptimizerStepOnTheGpu) {
  // Three GPU optimizer spans ending at 150, 1150 and 2150 us: two steps of 1000 us each, kernels
  // and gaps between them; the CPU spans count the steps. One span gives no wall step.
  const spec::Json trace = spec::Json::parse(R"({"traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "ts": 200, "dur": 700},
    {"ph": "X", "cat": "gpu_user_annotation", "name": "Optimizer.step#AdamW.step", "ts": 1100,
     "dur": 50},
    {"ph": "X", "cat": "gpu_user_annotation", "name": "Optimizer.step#AdamW.step", "ts": 100,
     "dur": 50},
    {"ph": "X", "cat": "gpu_user_annotation", "name": "Optimizer.step#AdamW.step", "ts": 2100,
     "dur": 50},
    {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#AdamW.step", "ts": 90, "dur": 5}
  ]})");
  const KernelTimes k = kernel_times(trace, "p.json");
  EXPECT_DOUBLE_EQ(k.wall_step_s, 1000e-6);
  EXPECT_EQ(k.steps, 1);
  spec::Json one = trace;
  one["traceEvents"].erase(3);
  one["traceEvents"].erase(2);
  EXPECT_EQ(kernel_times(one, "p.json").wall_step_s, 0);
}

TEST(SextantTraces, TrainingAndBenchmarkSamples) {
  const spec::Trace trace = spec::read_trace_file(sample("run-gpt-tiny-dp2.json"));
  Samples run = samples_from_trace(trace, "run");
  EXPECT_GT(run.compute.size(), 100u);
  // A training collective counts once, as its last member saw it (the others' times include
  // their wait): half of the 2-rank collective events after the first (warm-up) step.
  size_t events = 0;
  for (const spec::TraceEvent& e : trace.events)
    if (e.op_class == spec::OpClass::kAllReduce && e.step > 0) ++events;
  EXPECT_EQ(run.comm.size(), events / 2);
  for (const CommSample& c : run.comm) EXPECT_TRUE(c.in_training);
  for (const ComputeSample& c : run.compute) EXPECT_TRUE(c.flops > 0 || c.bytes > 0) << c.name;
  Samples bench =
      samples_from_trace(spec::read_trace_file(sample("bench-comm-2ranks.json")), "bench");
  EXPECT_EQ(bench.comm.size(), 5u * 4u * 10u);  // 5 collectives, 4 sizes, 10 iterations
}

TEST(Compare, ATraceAgainstItselfIsExact) {
  spec::Trace t = spec::read_trace_file(sample("run-gpt-tiny-dp2.json"));
  Comparison c = compare(t, t);
  EXPECT_DOUBLE_EQ(c.step_error(), 0.0);
  for (const Row& r : c.by_class) EXPECT_DOUBLE_EQ(r.error(), 0.0) << r.key;
  EXPECT_FALSE(c.by_class.empty());
  EXPECT_TRUE(c.mismatched_ops.empty());
}

// Ops are matched per rank by (name, phase, bytes) in the first step of each trace: a dropped op,
// an op of another size and an extra op each show; ranks only one side holds do not.
TEST(Compare, OpsOnOneSideOrOfOtherSizesAreReported) {
  auto event = [](int64_t rank, const char* name, int64_t bytes, int64_t step = 0) {
    spec::TraceEvent e;
    e.rank = rank;
    e.name = name;
    e.op_class = spec::OpClass::kAllReduce;
    e.phase = spec::Phase::kBwd;
    e.bytes = bytes;
    e.step = step;
    e.duration_ps = 1000;
    return e;
  };
  spec::Trace measured, predicted;
  measured.events = {event(0, "dp.all_reduce", 64),   event(0, "dp.all_reduce", 64),
                     event(0, "sp.all_reduce", 8),    event(1, "dp.all_reduce", 64),
                     event(0, "sp.all_reduce", 8, 1), event(0, "late.op", 4, 1)};
  predicted.events = {event(0, "dp.all_reduce", 64), event(0, "dp.all_reduce", 128),
                      event(0, "pp.all_gather", 32), event(1, "dp.all_reduce", 64),
                      event(2, "rank.two", 1)};
  spec::TraceEvent host = event(0, "step.host", 0);  // a calibrated overhead, not an op
  host.op_class = spec::OpClass::kHost;
  predicted.events.push_back(host);
  std::vector<OpDisagreement> d = op_disagreements(measured, predicted);
  // Rank 0: dp.all_reduce 64 B twice measured, once predicted; 128 B never measured; pp.all_gather
  // only predicted; sp.all_reduce (step 0) only measured. Rank 1 agrees; rank 2, step 1 and the
  // host time are out of the comparison.
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[0].name, "dp.all_reduce");
  EXPECT_EQ(d[0].bytes, 64);
  EXPECT_EQ(d[0].measured, 2);
  EXPECT_EQ(d[0].predicted, 1);
  EXPECT_EQ(d[1].bytes, 128);
  EXPECT_EQ(d[2].name, "pp.all_gather");
  EXPECT_EQ(d[3].name, "sp.all_reduce");
  std::vector<OpMismatch> m = op_mismatches(measured, predicted);
  ASSERT_EQ(m.size(), 3u);
  // dp.all_reduce summed over ranks 0 and 1: 3 measured (192 B), 3 predicted (256 B).
  EXPECT_EQ(m[0].name, "dp.all_reduce");
  EXPECT_EQ(m[0].measured_count, 3);
  EXPECT_EQ(m[0].predicted_count, 3);
  EXPECT_EQ(m[0].measured_bytes, 192);
  EXPECT_EQ(m[0].predicted_bytes, 256);
  EXPECT_FALSE(m[0].one_sided());
  EXPECT_TRUE(m[1].one_sided());  // pp.all_gather
  EXPECT_TRUE(m[2].one_sided());  // sp.all_reduce
  EXPECT_EQ(compare(measured, predicted).mismatched_ops.size(), 3u);
}

TEST(Compare, KendallTauAndRegret) {
  EXPECT_DOUBLE_EQ(kendall_tau({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(kendall_tau({1, 2, 3, 4}, {40, 30, 20, 10}), -1.0);
  // One swapped pair out of six: (5 - 1) / 6.
  EXPECT_NEAR(kendall_tau({1, 2, 3, 4}, {1, 3, 2, 4}), 4.0 / 6.0, 1e-12);
  // The swapped pair (items 1 and 2) tied in the second ranking: 5 concordant, 0 discordant, one
  // tie in b only -> tau-b = 5 / sqrt((5 + 0 + 0) * (5 + 0 + 1)).
  auto middle_tied = [](size_t i, size_t j) { return i == 1 && j == 2; };
  EXPECT_NEAR(kendall_tau({1, 2, 3, 4}, {1, 3, 2, 4}, middle_tied), 5 / std::sqrt(30.0), 1e-12);
  // Predicted best is plan 1, measured 1.2; the measured best is 1.0: 20% regret.
  EXPECT_NEAR(regret({0.5, 0.9, 1.0}, {1.2, 1.0, 1.5}), 0.2, 1e-12);
}

}  // namespace
}  // namespace sextant::traces
