// Pipeline schedules: bubble fractions and in-flight activations against the closed forms of
// GPipe (Huang et al. 2019), 1F1B (Narayanan et al. 2021) and interleaved 1F1B (Narayanan et al.
// SC'21 §2.2.2), on uniform stages with free communication.
#include <gtest/gtest.h>

#include <list>
#include <map>
#include <random>

#include "sextant/models/lowering.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/memory_model.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/pipeline_schedule.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

constexpr double kRelTol = 1e-6;

struct Case {
  spec::Schedule schedule;
  int64_t pp;
  int64_t vpp;
  int64_t m;
};

// Forward time of one micro-batch through the whole model: layers x 2*b*w*w FLOPs at 100 TFLOP/s.
double model_forward_s(int64_t layers, int64_t width, int64_t b) {
  return static_cast<double>(layers) * 2.0 * static_cast<double>(b) *
         static_cast<double>(width * width) / 100e12;
}

TEST(Pipeline, BubbleFractionOfGpipeAnd1F1B) {
  const int64_t layers = 8, width = 1024, b = 32;
  spec::ClusterSpec cluster = test::ideal_cluster();
  spec::ModelSpec model = test::uniform_mlp(layers, width);
  for (spec::Schedule s : {spec::Schedule::kGpipe, spec::Schedule::k1F1B}) {
    for (int64_t p : {2, 4, 8}) {
      for (int64_t m : {1, 4, 16}) {
        spec::Plan plan = test::make_plan(1, 1, p, b, m * b);
        plan.schedule = s;
        SimulationResult r = simulate(model, cluster, plan, {});
        // One stage's forward f and backward 2f per micro-batch; step = (m + p - 1)(f + b).
        double f = model_forward_s(layers, width, b) / static_cast<double>(p);
        double P = static_cast<double>(p), M = static_cast<double>(m);
        EXPECT_NEAR(r.report.step_time_s, (M + P - 1) * 3 * f, kRelTol * r.report.step_time_s)
            << plan.name();
        EXPECT_NEAR(r.report.breakdown_s.bubble / r.report.step_time_s, (P - 1) / (M + P - 1), 1e-6)
            << plan.name();
      }
    }
  }
}

// PipeDream-2BW (Narayanan et al. 2021 §3) does not flush: the fill and drain of 1F1B are paid once
// per run, so in steady state a batch costs m (f + b) on uniform stages, the 1F1B step less its
// (p - 1)(f + b) bubble (free communication and optimizer here). Its memory holds one more copy
// of the stage's weights (the version the batch in flight stashed) and 1F1B's activations.
TEST(Pipeline, PipeDream2BWHasNoBubbleInSteadyState) {
  const int64_t layers = 8, width = 1024, b = 32;
  spec::ClusterSpec cluster = test::ideal_cluster();
  spec::ModelSpec model = test::uniform_mlp(layers, width);
  for (int64_t p : {2, 4, 8}) {
    for (int64_t m : {p, 2 * p, int64_t{16}}) {
      spec::Plan plan = test::make_plan(1, 1, p, b, m * b);
      plan.schedule = spec::Schedule::kPipeDream2BW;
      SimulationResult r = simulate(model, cluster, plan, {});
      const double f = model_forward_s(layers, width, b) / static_cast<double>(p);
      const double M = static_cast<double>(m);
      EXPECT_NEAR(r.report.step_time_s, M * 3 * f, kRelTol * r.report.step_time_s) << plan.name();
      EXPECT_NEAR(r.report.breakdown_s.bubble, 0, kRelTol * r.report.step_time_s) << plan.name();
      spec::Plan flushed = plan;
      flushed.schedule = spec::Schedule::k1F1B;
      const spec::MemoryBreakdown sync = simulate(model, cluster, flushed, {}).report.memory;
      const spec::MemoryBreakdown async = r.report.memory;
      // Every stage holds layers / p square layers of width^2 parameters (no biases), the copy
      // the kernels read in bf16 (the GPU's default compute dtype): 2 bytes each.
      const int64_t stage_params = layers / p * width * width;
      EXPECT_EQ(async.weights - sync.weights, stage_params * 2) << plan.name();
      EXPECT_EQ(async.activations, sync.activations) << plan.name();
    }
  }
}

// PipeDream (Narayanan et al., SOSP'19) streams batches of one micro-batch with no flush: in
// steady state a batch costs one stage's f + b on uniform stages, the one-micro-batch 1F1B step
// p (f + b) less its (p - 1)(f + b) bubble (free communication and optimizer here), whatever p.
// Stage s stashes p - 1 - s more copies of its weights (bf16 here, 2 bytes each), and holds
// p - s micro-batches' activations, as 1F1B with p micro-batches does.
TEST(Pipeline, PipeDreamStreamsOneMicroBatchABatchWithoutABubble) {
  const int64_t layers = 8, width = 1024, b = 32;
  spec::ClusterSpec cluster = test::ideal_cluster();
  spec::ModelSpec model = test::uniform_mlp(layers, width);
  const models::LoweredModel lowered = models::lower(model, {b, 0, spec::Dtype::kBf16, 1, false});
  for (int64_t p : {2, 4, 8}) {
    spec::Plan plan = test::make_plan(1, 1, p, b, b);
    plan.schedule = spec::Schedule::kPipeDream;
    plan.dtype = spec::Dtype::kBf16;
    SimulationResult r = simulate(model, cluster, plan, {});
    const double f = model_forward_s(layers, width, b) / static_cast<double>(p);
    EXPECT_NEAR(r.report.step_time_s, 3 * f, kRelTol * r.report.step_time_s) << plan.name();
    EXPECT_NEAR(r.report.breakdown_s.bubble, 0, kRelTol * r.report.step_time_s) << plan.name();
    spec::Plan streamed = plan;  // 1F1B with p micro-batches in flight
    streamed.schedule = spec::Schedule::k1F1B;
    streamed.global_batch = p * b;
    const int64_t stage_params = layers / p * width * width;
    for (int64_t s = 0; s < p; ++s) {
      const spec::MemoryBreakdown async = stage_memory(plan, *plan.stack, lowered, s, &cluster);
      const spec::MemoryBreakdown sync =
          stage_memory(streamed, *streamed.stack, lowered, s, &cluster);
      EXPECT_EQ(async.weights - sync.weights, (p - 1 - s) * stage_params * 2)
          << plan.name() << " stage " << s;
      EXPECT_EQ(async.activations, sync.activations) << plan.name() << " stage " << s;
    }
  }
  // Each stage reads its own version: stage s of 4, pp - 1 - s updates behind at batch 5.
  EXPECT_EQ(spec::pipedream_version(5, 4, 0), 2);
  EXPECT_EQ(spec::pipedream_version(5, 4, 3), 5);
  EXPECT_EQ(spec::pipedream_version(1, 4, 0), 0);
}

TEST(Pipeline, InterleavingDividesTheBubbleByTheVirtualStages) {
  const int64_t layers = 16, width = 1024, b = 32;
  spec::ClusterSpec cluster = test::ideal_cluster();
  spec::ModelSpec model = test::uniform_mlp(layers, width);
  for (int64_t p : {2, 4}) {
    for (int64_t v : {2, 4}) {
      const int64_t m = 2 * p;
      spec::Plan plan = test::make_plan(1, 1, p, b, m * b);
      plan.schedule = spec::Schedule::kInterleaved;
      plan.virtual_stages = v;
      SimulationResult r = simulate(model, cluster, plan, {});
      double t = 3 * model_forward_s(layers, width, b) / static_cast<double>(p);  // f + b per stage
      double P = static_cast<double>(p), V = static_cast<double>(v), M = static_cast<double>(m);
      // Megatron-LM SC'21 eq. for the interleaved schedule: bubble = (p - 1) (t_f + t_b) / v.
      EXPECT_NEAR(r.report.step_time_s, M * t + (P - 1) * t / V, kRelTol * r.report.step_time_s)
          << plan.name();
    }
  }
}

TEST(Pipeline, InFlightMicroBatchesOnTheFirstStage) {
  for (int64_t p : {2, 4, 8}) {
    for (int64_t m : {1, 3, 8, 32}) {
      // 1F1B keeps at most p micro-batches alive on the first stage, GPipe all m of them.
      EXPECT_EQ(spec::peak_in_flight(spec::pipeline_schedule(spec::Schedule::k1F1B, p, 1, m, 0)),
                std::min(p, m));
      EXPECT_EQ(spec::peak_in_flight(spec::pipeline_schedule(spec::Schedule::kGpipe, p, 1, m, 0)),
                m);
      // The last stage of 1F1B holds one.
      EXPECT_EQ(
          spec::peak_in_flight(spec::pipeline_schedule(spec::Schedule::k1F1B, p, 1, m, p - 1)), 1);
    }
  }
}

// live_profile keeps only the moments that can be the peak: for any chunk sizes, its largest dot
// product must equal the peak of replaying the schedule unit by unit (what stage_memory did).
TEST(Pipeline, LiveProfileGivesTheReplaysPeakForAnyChunkSizes) {
  std::mt19937 rng(20261123);
  for (spec::Schedule sched :
       {spec::Schedule::kGpipe, spec::Schedule::k1F1B, spec::Schedule::kInterleaved}) {
    for (int64_t p : {1, 2, 4, 8}) {
      for (int64_t v : {1, 2, 3}) {
        if (sched != spec::Schedule::kInterleaved && v > 1) continue;
        for (int64_t m : {1, 2, 8, 16, 24}) {
          if (v > 1 && m % p != 0) continue;
          for (int64_t stage = 0; stage < p; ++stage) {
            const spec::LiveProfile profile = spec::live_profile(sched, p, v, m, stage);
            const std::vector<spec::ScheduleUnit> units =
                spec::pipeline_schedule(sched, p, v, m, stage);
            for (int trial = 0; trial < 4; ++trial) {
              std::vector<int64_t> bytes(static_cast<size_t>(v));
              for (int64_t& b : bytes) b = 1 + static_cast<int64_t>(rng() % 1000);
              const int64_t working = static_cast<int64_t>(rng() % 1000);
              int64_t live = 0, replay = 0, replay_recompute = 0;
              for (const spec::ScheduleUnit& u : units) {
                const int64_t b = bytes[static_cast<size_t>(u.chunk)];
                if (u.forward) {
                  live += b;
                  replay = std::max(replay, live);
                } else {
                  replay_recompute = std::max(replay_recompute, live + working);
                  live -= b;
                }
              }
              auto best = [&](const std::vector<std::vector<int64_t>>& moments) {
                int64_t out = 0;
                for (const std::vector<int64_t>& counts : moments) {
                  int64_t sum = 0;
                  for (size_t c = 0; c < counts.size(); ++c) sum += counts[c] * bytes[c];
                  out = std::max(out, sum);
                }
                return out;
              };
              EXPECT_EQ(best(profile.after_forward), replay);
              EXPECT_EQ(best(profile.during_backward) + working, replay_recompute);
            }
          }
        }
      }
    }
  }
}

// The planner's makespan of the schedule against the closed forms, on p uniform stages with
// forward f and backward b per micro-batch: GPipe and 1F1B take (m + p - 1)(f + b) (the first
// micro-batch's forward fills p - 1 stages, the last one's backward drains them); interleaved
// over v chunks of f/v and b/v, (m + (p - 1)/v)(f + b) (Narayanan et al. SC'21 §2.2.2).
TEST(Pipeline, MakespanMatchesTheClosedForms) {
  const double f = 1.0, b = 2.0;
  for (int64_t p : {2, 4, 8}) {
    for (int64_t m : {8, 16}) {
      auto uniform = [&](int64_t v, double each) {
        return std::vector<std::vector<double>>(static_cast<size_t>(p),
                                                std::vector<double>(static_cast<size_t>(v), each));
      };
      const double pm = static_cast<double>(p), mm = static_cast<double>(m);
      for (spec::Schedule s : {spec::Schedule::kGpipe, spec::Schedule::k1F1B}) {
        EXPECT_NEAR(spec::pipeline_makespan(s, p, 1, m, uniform(1, f), uniform(1, b), 0, false),
                    (mm + pm - 1) * (f + b), 1e-9)
            << p << " stages, " << m << " micro-batches";
      }
      // A transfer of d on each boundary never shortens it, and costs at least the fill and
      // drain's 2(p - 1)d.
      const double d = 0.25;
      EXPECT_GE(spec::pipeline_makespan(spec::Schedule::k1F1B, p, 1, m, uniform(1, f),
                                        uniform(1, b), d, false),
                (mm + pm - 1) * (f + b) + 2 * (pm - 1) * d - 1e-9);
      for (int64_t v : {2, 4}) {
        const double vv = static_cast<double>(v);
        EXPECT_NEAR(spec::pipeline_makespan(spec::Schedule::kInterleaved, p, v, m,
                                            uniform(v, f / vv), uniform(v, b / vv), 0, false),
                    (mm + (pm - 1) / vv) * (f + b), 1e-9)
            << p << " stages, " << v << " chunks, " << m << " micro-batches";
      }
    }
  }
  // With a transfer of d = 0.25 per boundary, by hand for 2 stages and 2 micro-batches (f 1, b 2):
  // stage 0 runs F0 [0, 1], F1 [1, 2]; stage 1 F0 [1.25, 2.25], B0 [2.25, 4.25], F1 [4.25, 5.25],
  // B1 [5.25, 7.25]; stage 0 B0 [4.5, 6.5], B1 [7.5, 9.5]: 9.5. Blocking sends: stage 0's F0 holds
  // it until 1.25, so F1 runs [1.25, 2.25] (2.5 with its send), stage 1 F0 [1.25, 2.25], B0
  // [2.25, 4.25] (4.5 sent), F1 [4.5, 5.5], B1 [5.5, 7.5]; stage 0 B0 [4.5, 6.5], B1 [7.75, 9.75].
  EXPECT_NEAR(
      spec::pipeline_makespan(spec::Schedule::k1F1B, 2, 1, 2, {{f}, {f}}, {{b}, {b}}, 0.25, false),
      9.5, 1e-9);
  EXPECT_NEAR(
      spec::pipeline_makespan(spec::Schedule::k1F1B, 2, 1, 2, {{f}, {f}}, {{b}, {b}}, 0.25, true),
      9.75, 1e-9);
  // One stage: m forwards and backwards back to back, transfers or not.
  EXPECT_NEAR(spec::pipeline_makespan(spec::Schedule::k1F1B, 1, 1, 4, {{f}}, {{b}}, 0.5, true),
              4 * (f + b), 1e-9);
}

// The gradient drain (spec::PipelineDrain) by hand, 2 stages, 2 micro-batches, f 1, b 2, no
// transfer time: stage 0 F0 [0, 1], F1 [1, 2]; stage 1 F0 [1, 2], B0 [2, 4], F1 [4, 5], B1
// [5, 7]; stage 0 B0 [4, 6], B1 [7, 9]: 9 = (m + p - 1)(f + b). Each stage's last backward (one
// layer of 2 s) completes a bucket whose reduction takes 3 s (stage 1) and 0.5 s (stage 0), with a
// tied table's 0.25 s after it on stage 0: stage 1 ends at 7 + 3 = 10, stage 0 at
// 9 + 0.5 + 0.25 = 9.75. A bucket completed halfway (two layers of 1 s, the first's bucket of
// 1 s, f = 1) slows the second: stage 1 B1 [5, 6] then [6, 7] beside the reduction does 0.5, the
// last 0.5 at [7, 7.5]; stage 0 B1 from 7.5: [7.5, 8.5], then [8.5, 9.5] slowed does 0.5, the rest
// [9.5, 10]: 10. One sweep serves all (its shared prefix).
TEST(Pipeline, MakespanTakesTheGradientDrain) {
  const std::vector<std::vector<double>> f{{1.0}, {1.0}}, b{{2.0}, {2.0}};
  spec::PipelineSweep sweep(spec::Schedule::k1F1B, 2, 1, 2, f, b, 0, false);
  EXPECT_NEAR(sweep.makespan(nullptr), 9, 1e-12);
  // (spec::StageDrain views its arrays: they are kept here.)
  std::list<std::vector<double>> doubles;
  std::list<std::vector<int64_t>> readies;
  std::list<std::vector<size_t>> ends;
  auto stage = [&](std::vector<double> layers, std::vector<int64_t> ready, std::vector<double> cost,
                   double after, double slowdown) {
    spec::StageDrain d;
    d.pass_end = ends.emplace_back(std::vector<size_t>{layers.size()});
    d.layer_backward = doubles.emplace_back(std::move(layers));
    d.bucket_ready_after = readies.emplace_back(std::move(ready));
    d.bucket_seconds = doubles.emplace_back(std::move(cost));
    d.after = after;
    d.slowdown = slowdown;
    return d;
  };
  const spec::PipelineDrain tails{{stage({2}, {0}, {0.5}, 0.25, 0), stage({2}, {0}, {3}, 0, 0)}};
  EXPECT_NEAR(sweep.makespan(&tails), 10, 1e-12);
  const spec::PipelineDrain halfway{{stage({1, 1}, {0}, {1}, 0, 1), stage({1, 1}, {0}, {1}, 0, 1)}};
  EXPECT_NEAR(sweep.makespan(&halfway), 10, 1e-12);
  EXPECT_NEAR(sweep.makespan(nullptr), 9, 1e-12);  // the prefix is not changed by a drain
  EXPECT_NEAR(spec::pipeline_makespan(spec::Schedule::k1F1B, 2, 1, 2, f, b, 0, false, &tails), 10,
              1e-12);
  // A drain of the passes' own times with nothing to reduce changes nothing, on every schedule
  // (interleaved, 2 chunks per stage: from chunk 1's backward of the last micro-batch on, the 4
  // of chunk 0's last group of pp micro-batches follow it).
  for (spec::Schedule s :
       {spec::Schedule::kGpipe, spec::Schedule::k1F1B, spec::Schedule::kInterleaved}) {
    const int64_t v = s == spec::Schedule::kInterleaved ? 2 : 1;
    const std::vector<std::vector<double>> fv(4, std::vector<double>(v, 0.5)),
        bv(4, std::vector<double>(v, 1.25));
    spec::PipelineDrain neutral;
    for (int64_t st = 0; st < 4; ++st) {
      std::vector<double>& layers = doubles.emplace_back();
      std::vector<size_t>& pass_end = ends.emplace_back();
      for (const spec::ScheduleUnit& u : spec::pipeline_schedule(s, 4, v, 8, st)) {
        if (u.forward || (pass_end.empty() && u.micro_batch != 7)) continue;
        layers.push_back(1.25);
        pass_end.push_back(layers.size());
      }
      EXPECT_EQ(pass_end.size(), s == spec::Schedule::kInterleaved ? 5u : 1u);
      spec::StageDrain d;
      d.layer_backward = layers;
      d.pass_end = pass_end;
      neutral.stages.push_back(d);
    }
    spec::PipelineSweep many(s, 4, v, 8, fv, bv, 0.1, true);
    EXPECT_NEAR(many.makespan(&neutral), many.makespan(nullptr), 1e-12);
    EXPECT_NEAR(many.makespan(nullptr), spec::pipeline_makespan(s, 4, v, 8, fv, bv, 0.1, true),
                1e-12);
  }
}

TEST(Pipeline, ActivationMemoryFollowsTheSchedule) {
  const int64_t layers = 8, width = 512, b = 16, p = 4, m = 16;
  spec::ModelSpec model = test::uniform_mlp(layers, width);
  models::LoweredModel lowered = models::lower(model, {b, 0, spec::Dtype::kFp32, 1, false});
  int64_t per_mb = 0;
  for (int64_t l = 0; l < layers / p; ++l)
    per_mb += lowered.layers[static_cast<size_t>(l)].saved_bytes;
  spec::Plan plan = test::make_plan(1, 1, p, b, m * b);
  plan.schedule = spec::Schedule::k1F1B;
  EXPECT_EQ(stage_memory(plan, *plan.stack, lowered, 0).activations, p * per_mb);
  plan.schedule = spec::Schedule::kGpipe;
  EXPECT_EQ(stage_memory(plan, *plan.stack, lowered, 0).activations, m * per_mb);
}

TEST(Pipeline, ScheduleUnitsCoverEveryMicroBatchAndChunkOnce) {
  for (auto [s, p, v, m] :
       {Case{spec::Schedule::kGpipe, 4, 1, 7}, Case{spec::Schedule::k1F1B, 4, 1, 7},
        Case{spec::Schedule::kInterleaved, 4, 2, 8}, Case{spec::Schedule::kInterleaved, 2, 3, 6}}) {
    for (int64_t stage = 0; stage < p; ++stage) {
      std::vector<spec::ScheduleUnit> units = spec::pipeline_schedule(s, p, v, m, stage);
      ASSERT_EQ(static_cast<int64_t>(units.size()), 2 * m * v);
      std::set<std::tuple<bool, int64_t, int64_t>> seen;
      for (const spec::ScheduleUnit& u : units) {
        EXPECT_TRUE(seen.insert({u.forward, u.micro_batch, u.chunk}).second);
        // A backward never comes before its own forward.
        if (!u.forward) {
          EXPECT_TRUE(seen.count({true, u.micro_batch, u.chunk}));
        }
      }
    }
  }
}

TEST(Pipeline, ABackwardsCollectivesWaitForItsGradient) {
  // Under sequence parallelism a block's backward starts with the all-gather of the gradient
  // that arrived from the next stage (the reduce-scatter's backward): it cannot start before that
  // gradient has arrived. A framework issues it in program order behind the receive (the compute
  // stream waits on the receive, the collective's stream on the compute stream), so every
  // collective of a backward pass starts after its gradient's receive has ended, on every rank,
  // with the transfers blocking or overlapped and the collectives split beside the GEMMs or not.
  spec::ClusterSpec cluster = test::ideal_cluster(100, 100, 100, 1.0);
  spec::ModelSpec model = models::zoo_model("gpt-tiny");
  SimulationOptions options;
  options.trace = true;
  for (bool pp_overlap : {false, true}) {
    for (spec::TpOverlap o : {spec::TpOverlap::kNone, spec::TpOverlap::kPipelined}) {
      spec::Plan plan = test::make_plan(1, 2, 2, 1, 4);
      plan.sequence_parallel = true;
      plan.stack->pp_overlap = pp_overlap;
      plan.stack->tp_overlap = o;
      SimulationResult r = simulate(model, cluster, plan, options);
      ASSERT_TRUE(r.trace.has_value());
      std::map<std::pair<int64_t, int64_t>, int64_t> arrived;  // (rank, micro-batch) -> end, ps
      for (const spec::TraceEvent& e : r.trace->events)
        if (e.name == "pp.recv_gradient")
          arrived[{e.rank, e.micro_batch.value_or(-1)}] = e.start_ps + e.duration_ps;
      ASSERT_EQ(arrived.size(), 2u * 4u) << plan.name();  // stage 0's 2 ranks, 4 micro-batches
      int64_t checked = 0;
      for (const spec::TraceEvent& e : r.trace->events) {
        if (e.stream != spec::Stream::kTpComm || e.phase != spec::Phase::kBwd) continue;
        auto it = arrived.find({e.rank, e.micro_batch.value_or(-1)});
        if (it == arrived.end()) continue;  // the last stage's: no gradient to wait for
        EXPECT_GE(e.start_ps, it->second) << plan.name() << " " << e.name << " rank " << e.rank
                                          << " micro-batch " << e.micro_batch.value_or(-1);
        ++checked;
      }
      EXPECT_GT(checked, 0) << plan.name();
    }
  }
}

}  // namespace
}  // namespace sextant::sim

namespace sextant::sim {
namespace {

// GEMS' MAST by hand on 2 stages of uniform layers, f a stage's forward and b = 2f its backward,
// one micro-batch a replica: rank 0 runs A's stage 0 and B's stage 1 forward (0 .. 2f; B's stage
// 0 ran on rank 1 meanwhile), B's last-stage backward (2f .. 4f), then A's stage-0 backward once
// rank 1's A backward is done (4f .. 6f): 6f, every rank busy throughout. 1F1B with the same two
// micro-batches on the same ranks takes (m + pp - 1)(f + b) = 9f, a bubble of 3f a rank. Each
// rank computes as much (two passes of two stage-sized chunks) and holds both stages' weights.
TEST(Pipeline, GemsFillsTheBubbleWithASecondReplicaRunningTheOtherWay) {
  const int64_t layers = 8, width = 1024, b = 32;
  spec::ClusterSpec cluster = test::ideal_cluster();
  spec::ModelSpec model = test::uniform_mlp(layers, width);
  spec::Plan plan = test::make_plan(1, 1, 2, b, 2 * b);
  plan.dtype = spec::Dtype::kBf16;
  plan.stack->dp_overlap = false;  // (GEMS reduces after the backward either way)
  spec::Plan gems = plan;
  gems.schedule = spec::Schedule::kGems;
  const SimulationResult one_f_one_b = simulate(model, cluster, plan, {});
  const SimulationResult mast = simulate(model, cluster, gems, {});
  const double f = model_forward_s(layers, width, b) / 2;
  EXPECT_NEAR(one_f_one_b.report.breakdown_s.bubble, 3 * f, kRelTol * 9 * f);
  EXPECT_NEAR(mast.report.breakdown_s.bubble, 0, kRelTol * 6 * f);
  EXPECT_NEAR(mast.report.breakdown_s.compute, one_f_one_b.report.breakdown_s.compute,
              kRelTol * 6 * f);
  EXPECT_NEAR(mast.report.breakdown_s.compute, 6 * f, kRelTol * 6 * f);
  const models::LoweredModel lowered = models::lower(model, {b, 0, spec::Dtype::kBf16, 1, false});
  for (int64_t s = 0; s < 2; ++s)
    EXPECT_EQ(stage_memory(gems, *gems.stack, lowered, s, &cluster).weights,
              2 * stage_memory(plan, *plan.stack, lowered, s, &cluster).weights);
}

}  // namespace
}  // namespace sextant::sim
