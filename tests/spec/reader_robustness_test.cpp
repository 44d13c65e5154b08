// Every reader of spec/ rejects truncated, mistyped and absurd files with an InputError that names
// the source and the field, and never crashes.
#include <gtest/gtest.h>

#include <algorithm>

#include "json_mutations.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/report.hpp"
#include "sextant/spec/trace.hpp"

namespace sextant::spec {
namespace {

template <typename Read>
void expect_rejects_every_mutation(const Json& valid, Read read) {
  ASSERT_NO_THROW(read(valid));
  int checked = 0;
  for (const test::Mutation& m : test::leaf_mutations(valid)) {
    try {
      read(m.document);
      ADD_FAILURE() << m.pointer << ": " << m.description << " was accepted";
    } catch (const InputError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("doc.json"), std::string::npos) << msg;
      EXPECT_NE(msg.find(m.pointer), std::string::npos)
          << m.description << ": the error should name " << m.pointer << ", got: " << msg;
    }
    ++checked;
  }
  EXPECT_GT(checked, 0);
  std::string text = valid.dump(2);
  for (const std::string& cut : test::truncations(text)) {
    EXPECT_THROW(read(parse_json_text(cut, "doc.json")), InputError) << cut.size();
  }
}

// Nesting is refused before parsing past kMaxJsonDepth levels, at the bracket that passes it;
// brackets inside strings do not count, and kMaxJsonDepth levels still parse.
TEST(ReaderRobustness, NestingDepthIsLimitedBeforeParsing) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  try {
    parse_json_text(deep, "deep.json");
    FAIL() << "accepted 100000 levels";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("deep.json"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("nested deeper than 256 levels at line 1, column 257"),
              std::string::npos)
        << e.what();
  }
  const std::string limit = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_NO_THROW(parse_json_text(limit, "limit.json"));
  const std::string in_string = "{\"a\": \"" + std::string(1000, '[') + "\\\"\"}";
  EXPECT_EQ(parse_json_text(in_string, "s.json").at("a").get<std::string>().size(), 1001u);
}

// Found by fuzz/ (libFuzzer): a number past a double's range escaped the JSON reader as the JSON
// library's own exception, without the file's name.
TEST(ReaderRobustness, NumbersPastADoubleAreRefusedNamingTheFile) {
  try {
    parse_json_text("{\"dp\": 1e3082}", "plan.json");
    FAIL() << "accepted 1e3082";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("plan.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("number overflow parsing '1e3082'"), std::string::npos)
        << e.what();
  }
  // The largest double still reads.
  EXPECT_EQ(parse_json_text("[1.7976931348623157e308]", "x.json").at(0).get<double>(),
            1.7976931348623157e308);
}

// Found by fuzz/: a trace event at 7e53 s stopped the reader with an internal check of the
// picosecond conversion; int64 picoseconds hold 9.2e18 ps = 9.2e12 us, so the field is refused.
TEST(ReaderRobustness, TraceTimesPastInt64PicosecondsAreRefusedByField) {
  const auto trace_with = [](double ts) {
    return Json{{"schema", "sextant.trace/1"},
                {"traceEvents",
                 {{{"name", "mlp.fc1"},
                   {"ph", "X"},
                   {"pid", 0},
                   {"tid", 0},
                   {"ts", ts},
                   {"dur", 1.0},
                   {"args", {{"op_class", "gemm"}, {"phase", "fwd"}}}}}}};
  };
  try {
    trace_from_json(trace_with(7.1e59), "t.json");
    FAIL() << "accepted ts = 7.1e59 us";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/traceEvents/0/ts"), std::string::npos) << e.what();
  }
  EXPECT_THROW(trace_from_json(trace_with(9.2e12), "t.json"), InputError);
  // A day into a run (8.64e10 us) is an ordinary time: 8.64e16 ps.
  EXPECT_EQ(trace_from_json(trace_with(8.64e10), "t.json").events.at(0).start_ps,
            int64_t{86'400} * 1'000'000'000'000);
}

// Twenty problems printed, then a count of the rest; every problem is still carried.
TEST(ReaderRobustness, ErrorMessagesStopAfterTwentyProblems) {
  Diagnostics diag("many.json");
  for (int i = 0; i < 25; ++i) diag.add("/points/" + std::to_string(i), "-1", "must be > 0");
  try {
    diag.throw_if_any();
    FAIL();
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_EQ(std::count(what.begin(), what.end(), '\n'), 20);
    EXPECT_NE(what.find("/points/19 = -1"), std::string::npos);
    EXPECT_EQ(what.find("/points/20 = -1"), std::string::npos);
    EXPECT_NE(what.find("many.json: ... and 5 more problem(s)"), std::string::npos);
    EXPECT_EQ(e.problems().size(), 25u);
  }
}

TEST(ReaderRobustness, Clusters) {
  for (const std::string& name : builtin_cluster_names()) {
    SCOPED_TRACE(name);
    expect_rejects_every_mutation(to_json(builtin_cluster(name)),
                                  [](const Json& j) { return cluster_from_json(j, "doc.json"); });
  }
}

TEST(ReaderRobustness, Plans) {
  Plan p;
  p.dp = 2;
  p.global_batch = 8;
  p.micro_batch = 2;
  p.dtype = Dtype::kBf16;
  p.seq_len = 128;
  expect_rejects_every_mutation(to_json(p),
                                [](const Json& j) { return plan_from_json(j, "doc.json"); });
}

TEST(ReaderRobustness, Reports) {
  Report r;
  r.model = "m";
  r.cluster = "c";
  r.plan = "dp1.tp1.pp1.z0.mb1";
  r.gpus = 1;
  r.network = "analytic";
  r.step_time_s = 1;
  expect_rejects_every_mutation(to_json(r),
                                [](const Json& j) { return report_from_json(j, "doc.json"); });
}

TEST(ReaderRobustness, Traces) {
  Trace t;
  t.kind = "measured";
  TraceEvent e;
  e.name = "attn.qkv";
  e.rank = 1;
  e.start_ps = 1000000;
  e.duration_ps = 2000000;
  e.phase = Phase::kFwd;
  e.layer = 3;
  e.micro_batch = 0;
  e.flops = 1e9;
  e.bytes = 4096;
  e.shape = {128, 384, 128};
  e.dtype = Dtype::kFp32;
  t.events.push_back(e);
  Json valid = Json::parse(trace_to_chrome_json(t));
  // Metadata events and otherData are free-form; mutate only the timed event.
  Json only_event = valid;
  only_event["traceEvents"] = Json::array({valid["traceEvents"].back()});
  only_event.erase("otherData");
  expect_rejects_every_mutation(only_event,
                                [](const Json& j) { return trace_from_json(j, "doc.json"); });
}

}  // namespace
}  // namespace sextant::spec
