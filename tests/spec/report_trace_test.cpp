// Report and trace formats: round trips, exact time encoding, Perfetto-compatible structure.
#include <gtest/gtest.h>

#include "sextant/spec/report.hpp"
#include "sextant/spec/trace.hpp"

namespace sextant::spec {
namespace {

TEST(Report, RoundTrips) {
  Report r;
  r.model = "gpt3-175b";
  r.cluster = "dgx-a100";
  r.plan = "dp8.tp8.pp16.z0.mb1.il2";
  r.gpus = 1024;
  r.network = "analytic";
  r.step_time_s = 12.5;
  r.mfu = 0.45;
  r.breakdown_s.bubble = 1.5;
  r.memory.peak_bytes = 70LL << 30;
  r.memory.capacity_bytes = 80LL << 30;
  r.memory.headroom_bytes = 10LL << 30;
  r.memory.fits = true;
  EXPECT_EQ(to_json(report_from_json(to_json(r), "r.json")), to_json(r));
}

TEST(Trace, WritesChromeTraceEventsWithExactMicroseconds) {
  Trace t;
  t.kind = "predicted";
  t.metadata = {{"model", "gpt-tiny"}};
  TraceEvent e;
  e.name = "mlp.fc1";
  e.rank = 3;
  e.stream = Stream::kCompute;
  e.start_ps = 1234567;  // 1.234567 us
  e.duration_ps = 1;     // 0.000001 us: picosecond resolution survives
  e.phase = Phase::kBwd;
  e.flops = 2e9;
  t.events.push_back(e);
  Json j = Json::parse(trace_to_chrome_json(t));
  EXPECT_EQ(j.at("schema"), "sextant.trace/1");
  EXPECT_EQ(j.at("otherData").at("kind"), "predicted");
  const Json& ev = j.at("traceEvents").back();
  EXPECT_EQ(ev.at("ph"), "X");
  EXPECT_EQ(ev.at("pid"), 3);
  EXPECT_DOUBLE_EQ(ev.at("ts").get<double>(), 1.234567);
  EXPECT_EQ(ev.at("args").at("phase"), "bwd");
  // Process and thread names so that Perfetto labels ranks and streams.
  bool named_thread = false;
  for (const Json& m : j.at("traceEvents"))
    if (m.at("ph") == "M" && m.at("name") == "thread_name" && m.at("args").at("name") == "compute")
      named_thread = true;
  EXPECT_TRUE(named_thread);
  Trace back = trace_from_json(j, "t.json");
  ASSERT_EQ(back.events.size(), 1u);
  EXPECT_EQ(back.events[0].start_ps, 1234567);
  EXPECT_EQ(back.events[0].duration_ps, 1);
  EXPECT_EQ(back.events[0].name, "mlp.fc1");
  EXPECT_EQ(back.kind, "predicted");
}

TEST(Trace, EscapesNames) {
  Trace t;
  TraceEvent e;
  e.name = "a\"b\\c";
  t.events.push_back(e);
  Json j = Json::parse(trace_to_chrome_json(t));
  EXPECT_EQ(j.at("traceEvents").back().at("name"), "a\"b\\c");
}

}  // namespace
}  // namespace sextant::spec
