// A stage's last backward passes beside its gradient reduction, against hand-timed cases.
#include "sextant/spec/gradient_drain.hpp"

#include <gtest/gtest.h>

namespace sextant::spec {
namespace {

// Each layer a pass of its own; the arrays the drain views, with it.
struct Input {
  Input(std::vector<double> layers, std::vector<int64_t> ready, std::vector<double> cost, double f,
        bool overlap = true)
      : layers_(std::move(layers)), ready_(std::move(ready)), cost_(std::move(cost)) {
    for (size_t i = 0; i < layers_.size(); ++i) pass_end_.push_back(i + 1);
    drain.layer_backward = layers_;
    drain.pass_end = pass_end_;
    drain.bucket_ready_after = ready_;
    drain.bucket_seconds = cost_;
    drain.slowdown = f;
    drain.overlap = overlap;
  }
  Input(const Input&) = delete;
  operator const StageDrain&() const { return drain; }

 private:
  std::vector<double> layers_;
  std::vector<int64_t> ready_;
  std::vector<double> cost_;
  std::vector<size_t> pass_end_;

 public:
  StageDrain drain;
};
Input input(std::vector<double> layers, std::vector<int64_t> ready, std::vector<double> cost,
            double f, bool overlap = true) {
  return Input(std::move(layers), std::move(ready), std::move(cost), f, overlap);
}

TEST(GradientDrain, MatchesHandTimedCases) {
  // Nothing to reduce: the backward's own time.
  Drain d = drain_back_to_back(input({1, 2}, {}, {}, 0.2));
  EXPECT_NEAR(d.backward, 3, 1e-12);
  EXPECT_NEAR(d.end, 3, 1e-12);
  // One bucket completed by the last layer: reduced after the backward, nothing slowed.
  d = drain_back_to_back(input({1}, {0}, {0.5}, 0.2));
  EXPECT_NEAR(d.backward, 1, 1e-12);
  EXPECT_NEAR(d.end, 1.5, 1e-12);
  // A bucket of 0.5 s after the first of two 1 s layers, f = 0.2: the second layer does
  // 0.5 / 1.2 of its work while the reduction runs, the rest at full speed:
  // 1 + 0.5 + (1 - 0.5 / 1.2) = 2 + 0.5 * 0.2 / 1.2.
  d = drain_back_to_back(input({1, 1}, {0}, {0.5}, 0.2));
  EXPECT_NEAR(d.backward, 2 + 0.5 * 0.2 / 1.2, 1e-12);
  EXPECT_NEAR(d.end, d.backward, 1e-12);
  // A reduction longer than what is left to compute: the layer runs slowed throughout (1.5 s at
  // f = 0.5) and the reduction ends at 1 + 3.
  d = drain_back_to_back(input({1, 1}, {0}, {3.0}, 0.5));
  EXPECT_NEAR(d.backward, 2.5, 1e-12);
  EXPECT_NEAR(d.end, 4, 1e-12);
  // Two buckets ready together queue on the one stream: 1 + 1 + 1.
  d = drain_back_to_back(input({1, 1}, {0, 0}, {1, 1}, 0));
  EXPECT_NEAR(d.backward, 2, 1e-12);
  EXPECT_NEAR(d.end, 3, 1e-12);
  // The second of them starts when the first ends, in the middle of the second layer (f = 1):
  // [1, 1.5] reduces bucket 0 and does 0.25 of layer 2, [1.5, 2] bucket 1 and 0.25 more, the
  // last 0.5 at full speed: 2.5.
  d = drain_back_to_back(input({1, 1}, {0, 0}, {0.5, 0.5}, 1));
  EXPECT_NEAR(d.backward, 2.5, 1e-12);
  EXPECT_NEAR(d.end, 2.5, 1e-12);
  // Without overlap every reduction waits for the backward, which nothing slows; a tied
  // table's reduction after all of them.
  Input plain = input({1, 1}, {0, 1}, {0.5, 0.5}, 1, false);
  plain.drain.after = 0.25;
  d = drain_back_to_back(plain);
  EXPECT_NEAR(d.backward, 2, 1e-12);
  EXPECT_NEAR(d.end, 3.25, 1e-12);
}

// Between passes the stage may wait (the schedule's gaps): a reduction runs on there without
// slowing anything. Bucket of 1 s after pass 0 ([0, 1]); pass 1 starts at 1.5 (f = 1): the
// reduction has 0.5 s left, beside which the pass does 0.25 of its 1 s, then 0.75 at full speed:
// it ends at 1.5 + 0.5 + 0.75 = 2.75. Back to back it would end at 1 + 1 + 0.5 = 2.5.
TEST(GradientDrain, ReductionsRunOnWhileTheStageWaits) {
  const Input in = input({1, 1}, {0}, {1.0}, 1);
  DrainStream stream(in);
  EXPECT_NEAR(stream.pass(0), 1, 1e-12);
  EXPECT_NEAR(stream.pass(1.5), 2.75, 1e-12);
  EXPECT_NEAR(stream.finish(2.75), 2.75, 1e-12);
  EXPECT_NEAR(drain_back_to_back(in).backward, 2.5, 1e-12);
  // A wait longer than the reduction: the pass runs at full speed.
  DrainStream later(in);
  later.pass(0);
  EXPECT_NEAR(later.pass(3), 4, 1e-12);
}

}  // namespace
}  // namespace sextant::spec
