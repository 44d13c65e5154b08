// The last backward beside its gradient reduction, against hand-timed cases.
#include "sextant/planner/gradient_drain.hpp"

#include <gtest/gtest.h>

namespace sextant::planner {
namespace {

DrainInput input(std::vector<double> layers, std::vector<int64_t> ready, std::vector<double> cost,
                 double f, bool overlap = true) {
  DrainInput in;
  in.layer_backward = std::move(layers);
  in.bucket_ready_after = std::move(ready);
  in.bucket_seconds = std::move(cost);
  in.slowdown = f;
  in.overlap = overlap;
  return in;
}

TEST(GradientDrain, MatchesHandTimedCases) {
  // Nothing to reduce: the backward's own time.
  Drain d = gradient_drain(input({1, 2}, {}, {}, 0.2));
  EXPECT_NEAR(d.backward, 3, 1e-12);
  EXPECT_NEAR(d.end, 3, 1e-12);
  // One bucket completed by the last layer: reduced after the backward, nothing slowed.
  d = gradient_drain(input({1}, {0}, {0.5}, 0.2));
  EXPECT_NEAR(d.backward, 1, 1e-12);
  EXPECT_NEAR(d.end, 1.5, 1e-12);
  // A bucket of 0.5 s after the first of two 1 s layers, f = 0.2: the second layer does
  // 0.5 / 1.2 of its work while the reduction runs, the rest at full speed:
  // 1 + 0.5 + (1 - 0.5 / 1.2) = 2 + 0.5 * 0.2 / 1.2.
  d = gradient_drain(input({1, 1}, {0}, {0.5}, 0.2));
  EXPECT_NEAR(d.backward, 2 + 0.5 * 0.2 / 1.2, 1e-12);
  EXPECT_NEAR(d.end, d.backward, 1e-12);
  // A reduction longer than what is left to compute: the layer runs slowed throughout (1.5 s at
  // f = 0.5) and the reduction ends at 1 + 3.
  d = gradient_drain(input({1, 1}, {0}, {3.0}, 0.5));
  EXPECT_NEAR(d.backward, 2.5, 1e-12);
  EXPECT_NEAR(d.end, 4, 1e-12);
  // Two buckets ready together queue on the one stream: 1 + 1 + 1.
  d = gradient_drain(input({1, 1}, {0, 0}, {1, 1}, 0));
  EXPECT_NEAR(d.backward, 2, 1e-12);
  EXPECT_NEAR(d.end, 3, 1e-12);
  // The second of them starts when the first ends, in the middle of the second layer (f = 1):
  // [1, 1.5] reduces bucket 0 and does 0.25 of layer 2, [1.5, 2] bucket 1 and 0.25 more, the
  // last 0.5 at full speed: 2.5.
  d = gradient_drain(input({1, 1}, {0, 0}, {0.5, 0.5}, 1));
  EXPECT_NEAR(d.backward, 2.5, 1e-12);
  EXPECT_NEAR(d.end, 2.5, 1e-12);
  // Without overlap every reduction waits for the backward, which nothing slows.
  d = gradient_drain(input({1, 1}, {0, 1}, {0.5, 0.5}, 1, false));
  EXPECT_NEAR(d.backward, 2, 1e-12);
  EXPECT_NEAR(d.end, 3, 1e-12);
}

}  // namespace
}  // namespace sextant::planner
