// The recording JSON reader: every rejection path names the pointer and says what was expected.
#include "sextant/spec/json_reader.hpp"

#include <gtest/gtest.h>

namespace sextant::spec {
namespace {

std::string problems_of(const Json& j, void (*read)(ObjectReader&)) {
  Diagnostics diag("in.json");
  ObjectReader r(j, "", diag);
  read(r);
  r.finish();
  try {
    diag.throw_if_any();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(JsonReader, ReportsMissingFieldWithPointer) {
  std::string msg = problems_of(Json::parse(R"({})"), [](ObjectReader& r) { r.integer("layers"); });
  EXPECT_EQ(msg, "in.json: /layers: missing required field");
}

TEST(JsonReader, ReportsWrongType) {
  std::string msg = problems_of(Json::parse(R"({"layers": "twelve"})"),
                                [](ObjectReader& r) { r.integer("layers"); });
  EXPECT_EQ(msg, "in.json: /layers = \"twelve\": expected an integer, found a string");
}

TEST(JsonReader, ReportsOutOfRange) {
  std::string msg = problems_of(Json::parse(R"({"bandwidth_GBps": -3})"), [](ObjectReader& r) {
    r.number("bandwidth_GBps", Range::positive());
  });
  EXPECT_EQ(msg, "in.json: /bandwidth_GBps = -3: must be > 0");
}

TEST(JsonReader, ReportsUnknownKeyListingKnownOnes) {
  std::string msg = problems_of(Json::parse(R"({"layers": 2, "layres": 3})"),
                                [](ObjectReader& r) { r.integer("layers"); });
  EXPECT_NE(msg.find("/layres: unknown field (known fields: layers)"), std::string::npos) << msg;
}

TEST(JsonReader, CollectsEveryProblemOfAFile) {
  std::string msg = problems_of(Json::parse(R"({"a": -1, "b": "x", "c": 1})"), [](ObjectReader& r) {
    r.integer("a", Range::at_least(1));
    r.boolean("b");
    r.integer("d");
  });
  EXPECT_NE(msg.find("/a = -1: must be >= 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/b = \"x\": expected true or false"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/d: missing required field"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/c: unknown field"), std::string::npos) << msg;
  EXPECT_EQ(std::count(msg.begin(), msg.end(), '\n'), 3) << "one line per problem: " << msg;
}

TEST(JsonReader, AcceptsIntegralFloatsAsIntegersButNotFractions) {
  Diagnostics diag("in.json");
  const Json doc = Json::parse(R"({"a": 8.589934592e10, "b": 2.5})");
  ObjectReader r(doc, "", diag);
  EXPECT_EQ(r.integer("a"), 85899345920);
  EXPECT_FALSE(r.integer("b").has_value());
  EXPECT_FALSE(diag.ok());
}

TEST(JsonReader, EnumerationListsTheValidNames) {
  std::string msg = problems_of(Json::parse(R"({"kind": "gpu2"})"), [](ObjectReader& r) {
    static const std::pair<std::string_view, int> names[] = {{"gpu", 0}, {"cpu", 1}};
    r.enumeration<int>("kind", names);
  });
  EXPECT_EQ(msg, "in.json: /kind = \"gpu2\": must be one of gpu or cpu (did you mean gpu?)");
}

TEST(JsonReader, NestedPointersAndEscaping) {
  EXPECT_EQ(pointer_join("/network/levels", size_t{1}), "/network/levels/1");
  EXPECT_EQ(pointer_join("", "a/b~c"), "/a~1b~0c");
}

TEST(JsonReader, RootThatIsNotAnObject) {
  Diagnostics diag("x.json");
  const Json doc = Json::parse("[1,2]");
  ObjectReader r(doc, "", diag);
  EXPECT_FALSE(r.is_object());
  EXPECT_THROW(diag.throw_if_any(), InputError);
}

}  // namespace
}  // namespace sextant::spec
