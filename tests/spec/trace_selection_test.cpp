// --trace-ranks / --trace-steps, and gzip-compressed traces read back unchanged.
#include "sextant/spec/trace_selection.hpp"

#include <gtest/gtest.h>

#include <filesystem>

#include "sextant/spec/error.hpp"
#include "sextant/spec/gzip.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::spec {
namespace {

Plan plan_of(int64_t dp, int64_t tp, int64_t pp) {
  Plan p;
  p.dp = dp;
  p.tp = tp;
  p.pp = pp;
  p.global_batch = dp;
  return p;
}

TraceEvent event(std::string name, int64_t rank, int64_t step) {
  TraceEvent e;
  e.name = std::move(name);
  e.rank = rank;
  e.step = step;
  return e;
}

std::string error_of(std::string_view ranks, std::string_view steps, const Plan& plan) {
  try {
    parse_trace_selection(ranks, steps, plan);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(TraceSelection, RanksByNumberRangeAndRole) {
  // dp 2, tp 2, pp 2: rank = tp_index + 2 * (dp_index + 2 * stage) (rank_layout.hpp), so stage 1
  // starts at rank 4 and replica 1 at rank 2.
  const Plan p = plan_of(2, 2, 2);
  EXPECT_EQ(parse_trace_selection("0,7", "", p).ranks, (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(parse_trace_selection("last", "", p).ranks, (std::vector<int64_t>{7}));
  EXPECT_EQ(parse_trace_selection("2-4,3", "", p).ranks, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(parse_trace_selection("stages", "", p).ranks, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(parse_trace_selection("replicas", "", p).ranks, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(parse_trace_selection("stages,replicas,last", "", p).ranks,
            (std::vector<int64_t>{0, 2, 4, 7}));
  EXPECT_TRUE(parse_trace_selection("", "", p).keeps_everything());
}

TEST(TraceSelection, StepsAndEvents) {
  const TraceSelection s = parse_trace_selection("1", "0,3-4", plan_of(2, 1, 1));
  EXPECT_TRUE(s.keeps_step(0));
  EXPECT_FALSE(s.keeps_step(2));
  EXPECT_TRUE(s.keeps_step(4));
  Trace t;
  for (int64_t rank : {0, 1})
    for (int64_t step : {0, 1, 2, 3}) t.events.push_back(event("x", rank, step));
  apply(s, t);
  ASSERT_EQ(t.events.size(), 2u);  // rank 1, steps 0 and 3
  EXPECT_EQ(t.events[0].rank, 1);
  EXPECT_EQ(t.events[0].step, 0);
  EXPECT_EQ(t.events[1].step, 3);
}

TEST(TraceSelection, BadSelectionsNameTheFlag) {
  const Plan p = plan_of(2, 2, 1);
  EXPECT_NE(error_of("4", "", p).find("--trace-ranks = 4: ranks of this plan are 0-3"),
            std::string::npos)
      << error_of("4", "", p);
  EXPECT_NE(error_of("0,,1", "", p).find("--trace-ranks"), std::string::npos);
  EXPECT_NE(error_of("first", "", p).find("a rank, a range A-B, last, stages or replicas"),
            std::string::npos);
  EXPECT_NE(error_of("3-1", "", p).find("--trace-ranks"), std::string::npos);
  EXPECT_NE(error_of("", "-1", p).find("--trace-steps = -1"), std::string::npos)
      << error_of("", "-1", p);
  EXPECT_NE(error_of("", "2-x", p).find("--trace-steps"), std::string::npos);
}

TEST(TraceFiles, GzipRoundTripIsExact) {
  Trace t;
  t.kind = "predicted";
  t.events.push_back(event("mlp.fc1", 1, 0));
  t.events.back().start_ps = 1'234'567;
  t.events.back().duration_ps = 89;
  t.events.push_back(event("dp.all_reduce", 0, 0));
  t.events.back().op_class = OpClass::kAllReduce;
  t.events.back().stream = Stream::kDpComm;
  t.events.back().bytes = 4096;
  t.events.back().group_size = 2;
  const auto dir = std::filesystem::temp_directory_path() / "sextant_trace_gzip_test";
  std::filesystem::create_directories(dir);
  write_trace_file((dir / "t.json").string(), t);
  write_trace_file((dir / "t.json.gz").string(), t);
  // Compressed on disk (gzip magic 1f 8b), the same trace when read back.
  const std::string packed = read_text_file(dir / "t.json.gz");
  ASSERT_GE(packed.size(), 2u);
  EXPECT_EQ(static_cast<unsigned char>(packed[0]), 0x1f);
  EXPECT_EQ(static_cast<unsigned char>(packed[1]), 0x8b);
  EXPECT_EQ(read_gzip_file(dir / "t.json.gz"), trace_to_chrome_json(t));
  EXPECT_EQ(trace_to_chrome_json(read_trace_file((dir / "t.json.gz").string())),
            trace_to_chrome_json(read_trace_file((dir / "t.json").string())));
  // A truncated one (a copy cut short) is refused naming it, not read as a shorter trace.
  write_file_atomically(dir / "cut.json.gz", packed.substr(0, packed.size() / 2));
  try {
    read_trace_file((dir / "cut.json.gz").string());
    FAIL() << "read a truncated gzip file";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cut.json.gz: not a readable gzip file"),
              std::string::npos)
        << e.what();
  }
  // A plain file given a .gz name is refused naming it.
  std::filesystem::copy_file(dir / "t.json", dir / "plain.json.gz",
                             std::filesystem::copy_options::overwrite_existing);
  try {
    read_trace_file((dir / "plain.json.gz").string());
    FAIL() << "read a plain file as gzip";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("plain.json.gz: not a readable gzip file"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sextant::spec
