// Activation offload (Megatron-LM --cpu-offloading with Transformer Engine's double-buffered
// handler; DeepSpeed's cpu_checkpointing): the plan's rules, which units are offloaded, the
// device and host memory, and the copies the simulator schedules. Every expected figure is
// derived here from the test cluster's numbers.
#include <gtest/gtest.h>

#include "sextant/models/lowering.hpp"
#include "sextant/sim/memory_model.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/error.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

constexpr int64_t kOffloadedLayers = 8, kOffloadedWidth = 1024, kBatch = 1024;
// What an MLP layer keeps for backward (models/mlp_lowering.cpp): its input and its output, B x w
// each, in bf16.
constexpr double kKept = 2.0 * kBatch * kOffloadedWidth * 2;

spec::Plan one_gpu(int64_t activation_layers) {
  spec::Plan p = test::make_plan(1, 1, 1, kBatch, kBatch);
  p.dtype = spec::Dtype::kBf16;
  p.offload.activations = spec::OffloadTarget::kHost;
  p.offload.activation_layers = activation_layers;
  return p;
}

spec::Json plan_json() {
  return {{"schema", "sextant.plan/1"},
          {"dp", 1},
          {"tp", 1},
          {"pp", 2},
          {"zero", 0},
          {"micro_batch", 1},
          {"global_batch", 2},
          {"offload", {{"activations", "host"}, {"activation_layers", 2}}}};
}

void expect_refused(const spec::Json& j, const std::string& pointer, const std::string& words) {
  try {
    spec::plan_from_json(j, "p.json");
    FAIL() << "accepted " << j.dump();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(pointer), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(ActivationOffload, PlanRulesAndRoundTrip) {
  const spec::Plan p = spec::plan_from_json(plan_json(), "p.json");
  EXPECT_EQ(p.offload.activations, spec::OffloadTarget::kHost);
  EXPECT_EQ(p.offload.activation_layers, 2);
  EXPECT_TRUE(p.offload.any());
  EXPECT_FALSE(p.offload.state());
  EXPECT_NE(p.name().find(".off-act2"), std::string::npos) << p.name();
  EXPECT_EQ(spec::plan_from_json(spec::to_json(p), "round trip").offload, p.offload);

  spec::Json nvme = plan_json();
  nvme["offload"]["activations"] = "nvme";
  expect_refused(nvme, "/offload/activations", "host memory");
  spec::Json without = plan_json();
  without["offload"].erase("activations");
  expect_refused(without, "/offload/activation_layers", "applies with offload/activations");
  // KARMA's reload window: named, written back, and refused without offloaded activations.
  spec::Json ahead = plan_json();
  ahead["offload"]["prefetch_layers"] = 3;
  const spec::Plan windowed = spec::plan_from_json(ahead, "p.json");
  EXPECT_EQ(windowed.offload.prefetch_layers, 3);
  EXPECT_NE(windowed.name().find(".off-act2-pf3"), std::string::npos) << windowed.name();
  EXPECT_EQ(spec::plan_from_json(spec::to_json(windowed), "round trip").offload, windowed.offload);
  EXPECT_EQ(p.offload.prefetch_layers, 1);
  ahead["offload"]["prefetch_layers"] = 0;
  expect_refused(ahead, "/offload/prefetch_layers", "");
  ahead["offload"] = {{"optimizer", "host"}, {"prefetch_layers", 2}};
  ahead["zero"] = 1;
  expect_refused(ahead, "/offload/prefetch_layers", "applies with offload/activations");

  // Up to the largest stage chunk: 8 units on 2 stages hold 4 each.
  const spec::ModelSpec model = test::uniform_mlp(kOffloadedLayers, kOffloadedWidth);
  spec::Plan five = p;
  five.offload.activation_layers = 5;
  try {
    spec::validate_plan(five, model, 2, "p.json");
    FAIL() << "offloaded more layers than a stage holds";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("largest stage chunk (4)"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(spec::validate_plan(p, model, 2, "p.json"));
}

TEST(ActivationOffload, TheFirstLayersOfEachChunkAreOffloaded) {
  spec::Plan p = spec::plan_from_json(plan_json(), "p.json");
  // 8 units, 2 stages of 4: units 0-1 and 4-5.
  EXPECT_EQ(spec::unit_activation_offload(p, 8),
            (std::vector<bool>{true, true, false, false, true, true, false, false}));
  p.offload.activation_layers = 0;  // every unit
  EXPECT_EQ(spec::unit_activation_offload(p, 8), std::vector<bool>(8, true));
  p.offload.activations = spec::OffloadTarget::kNone;
  EXPECT_EQ(spec::unit_activation_offload(p, 8), std::vector<bool>(8, false));
}

TEST(ActivationOffload, KeptActivationsMoveToTheHost) {
  const spec::ModelSpec model = test::uniform_mlp(kOffloadedLayers, kOffloadedWidth);
  const spec::ClusterSpec cluster = test::ideal_cluster_with_host();
  const models::LoweredModel lowered =
      models::lower(model, {kBatch, 0, spec::Dtype::kBf16, 1, false});
  // One micro-batch in flight (one stage runs each backward right after its forward).
  spec::Plan base = test::make_plan(1, 1, 1, kBatch, kBatch);
  base.dtype = spec::Dtype::kBf16;
  const spec::MemoryBreakdown on_device = stage_memory(base, *base.stack, lowered, 0, &cluster);
  EXPECT_DOUBLE_EQ(static_cast<double>(on_device.activations), kOffloadedLayers * kKept);
  EXPECT_EQ(on_device.host_bytes, 0);

  // The first 3 layers offloaded: the device keeps the other 5 and two layers in transit; the
  // host holds 3.
  spec::Plan off = base;
  off.offload.activations = spec::OffloadTarget::kHost;
  off.offload.activation_layers = 3;
  const spec::MemoryBreakdown m = stage_memory(off, *off.stack, lowered, 0, &cluster);
  EXPECT_DOUBLE_EQ(static_cast<double>(m.activations), (5 + 2) * kKept);
  EXPECT_DOUBLE_EQ(static_cast<double>(m.host_bytes), 3 * kKept);
  EXPECT_EQ(m.weights, on_device.weights);
  EXPECT_EQ(m.optimizer, on_device.optimizer);
  EXPECT_TRUE(m.fits);
}

TEST(ActivationOffload, CopiesOverlapTheNeighbouringLayers) {
  const spec::ModelSpec model = test::uniform_mlp(kOffloadedLayers, kOffloadedWidth);
  const spec::ClusterSpec cluster = test::ideal_cluster_with_host();
  spec::Plan base = one_gpu(0);
  base.offload = {};
  const SimulationResult plain = simulate(model, cluster, base, {});
  SimulationOptions options;
  options.trace = true;
  const SimulationResult off = simulate(model, cluster, one_gpu(0), options);
  // By hand, every layer offloaded. A layer's forward is one GEMM of 2 B w^2 FLOPs at 100
  // TFLOP/s, f = 21.47 us; its backward two, b = 2f; its copy either way kKept = 4 MiB at
  // 100 GB/s, c = 41.94 us > f. Forward: layer k's copy starts when its forward ends, after the
  // copy before it; layer k + 2 waits for it (the double buffer), so from layer 2 on the forward
  // runs at the copies' pace: layer 7 starts after the copies of layers 0-5, at f + 6c, and its
  // copy ends at f + 8c (behind layer 6's). Backward: layer 7's reload (on the stream of copies
  // to the device) waits for that copy to reach the host, f + 9c; from there each reload runs
  // beside the backward of the layer above (c < b), so the backward of the 8 layers runs back to
  // back: the step is f + 9c + 8b, against 8f + 8b without offload, and the compute stream waited
  // 9c - 7f for copies.
  const double f = 2.0 * kBatch * kOffloadedWidth * kOffloadedWidth / 100e12;
  const double b = 2 * f;
  const double c = kKept / 100e9;
  const double exposed = 9 * c - 7 * f;
  EXPECT_NEAR(plain.report.step_time_s, 8 * f + 8 * b, 1e-9);
  EXPECT_NEAR(off.report.step_time_s, f + 9 * c + 8 * b, 1e-9);
  EXPECT_NEAR(off.report.breakdown_s.offload_exposed, exposed, 1e-9);
  ASSERT_TRUE(off.trace.has_value());
  double to_host = 0, to_device = 0;
  int copies = 0;
  for (const spec::TraceEvent& e : off.trace->events) {
    if (e.name == "offload.activations_to_host") {
      EXPECT_EQ(e.phase, spec::Phase::kFwd);
      to_host += static_cast<double>(e.bytes);
      ++copies;
    }
    if (e.name == "offload.activations_to_device") {
      EXPECT_EQ(e.phase, spec::Phase::kBwd);
      to_device += static_cast<double>(e.bytes);
      ++copies;
    }
  }
  EXPECT_EQ(copies, 2 * kOffloadedLayers);
  EXPECT_DOUBLE_EQ(to_host, kOffloadedLayers * kKept);
  EXPECT_DOUBLE_EQ(to_device, kOffloadedLayers * kKept);
}

TEST(ActivationOffload, OnlyTheNamedLayersCopy) {
  const spec::ModelSpec model = test::uniform_mlp(kOffloadedLayers, kOffloadedWidth);
  SimulationOptions options;
  options.trace = true;
  const SimulationResult r = simulate(model, test::ideal_cluster_with_host(), one_gpu(2), options);
  ASSERT_TRUE(r.trace.has_value());
  std::vector<int64_t> layers;
  for (const spec::TraceEvent& e : r.trace->events)
    if (e.name == "offload.activations_to_host") layers.push_back(e.layer.value_or(-1));
  EXPECT_EQ(layers, (std::vector<int64_t>{0, 1}));
  // Two copies of 41.9 us each way beside layers of 21.5 us forward and 42.9 us backward: layer
  // 2 waits for layer 0's copy (c - f), and layer 1's reload, issued when layer 2's backward
  // starts, is done before layer 1's backward (c < b), which layer 0's reload follows... only
  // after layer 1's backward started: it runs beside it. Exposed: c - f.
  const double f = 2.0 * kBatch * kOffloadedWidth * kOffloadedWidth / 100e12;
  const double c = kKept / 100e9;
  EXPECT_NEAR(r.report.breakdown_s.offload_exposed, c - f, 1e-9);
}

// KARMA's swap schedule (spec::Offload::prefetch_layers): the first 2 of 8 layers offloaded over a
// link three times slower (100/3 GB/s: c = 125.8 us a copy, b = 42.9 us a backward, f = 21.5 us
// a forward). Forward, both ways: layer 0's copy out ends at f + c, layer 1's at f + 2c; layer 2
// waits for layer 0's (c - f exposed) and the backward begins at T = 7f + c, after both copies
// (f + 2c <= T since c <= 6f). Backward with the double buffer (window 1): layer 1's reload is
// issued as layer 2's backward starts (T + 5b) and layer 1 waits c - b for it; layer 0's is
// issued as layer 1's backward could start (T + 5b + b) and runs after layer 1's reload, so
// layer 0 waits c - b too: 2 (c - b) exposed in backward. With a window of 6 both reloads start
// at T, one after the other, and end at T + 2c <= T + 6b, before layer 1's backward: nothing
// exposed in backward. The device holds the running layer and the 6 reloaded ahead: 7 kept
// layers' worth of the offloaded ones (2 with the double buffer).
TEST(ActivationOffload, KarmasWindowReloadsTheSwappedLayersBehindTheOnesAbove) {
  const spec::ModelSpec model = test::uniform_mlp(kOffloadedLayers, kOffloadedWidth);
  spec::ClusterSpec cluster = test::ideal_cluster_with_host();
  cluster.host->pcie_bandwidth_GBps = 100.0 / 3;
  const double f = 2.0 * kBatch * kOffloadedWidth * kOffloadedWidth / 100e12;
  const double b = 2 * f;
  const double c = kKept / (100e9 / 3);
  ASSERT_LE(2 * c, 6 * b);
  ASSERT_LE(c, 6 * f);
  auto offloaded = [&](int64_t window) {
    spec::Plan p = one_gpu(2);
    p.offload.prefetch_layers = window;
    return simulate(model, cluster, p, {});
  };
  const SimulationResult buffered = offloaded(1), karma = offloaded(6);
  EXPECT_NEAR(buffered.report.breakdown_s.offload_exposed, (c - f) + 2 * (c - b), 1e-9);
  EXPECT_NEAR(karma.report.breakdown_s.offload_exposed, c - f, 1e-9);
  EXPECT_NEAR(buffered.report.step_time_s - karma.report.step_time_s, 2 * (c - b), 1e-9);
  const models::LoweredModel lowered =
      models::lower(model, {kBatch, 0, spec::Dtype::kBf16, 1, false});
  spec::Plan p = one_gpu(2);
  const int64_t two = stage_memory(p, *p.stack, lowered, 0, &cluster).activations;
  p.offload.prefetch_layers = 6;
  const int64_t seven = stage_memory(p, *p.stack, lowered, 0, &cluster).activations;
  EXPECT_DOUBLE_EQ(static_cast<double>(two), (6 + 2) * kKept);
  EXPECT_DOUBLE_EQ(static_cast<double>(seven - two), 5 * kKept);
}

TEST(ActivationOffload, CopiesEachWayRunAtOnce) {
  // Beside ZeRO-Offload: each layer's gradients go to the host once its backward is done (a
  // bucket per layer) while the layer below reloads its activations. PCIe is full duplex and the
  // device has a copy engine each way, so neither waits for the other: the backward keeps its
  // pace (the reloads hidden as without the optimizer's copies), and what the step waits for
  // beyond the activation copies is the tail the host step needs: layer 0's gradients, the
  // host AdamW and the updated parameters' way back. On one in-order stream each layer's
  // reload would queue behind the gradients of the layer above (c + g > b).
  const spec::ModelSpec model = test::uniform_mlp(kOffloadedLayers, kOffloadedWidth);
  const spec::ClusterSpec cluster = test::ideal_cluster_with_host();
  spec::Plan p = one_gpu(0);
  p.zero = 1;
  p.offload.optimizer = spec::OffloadTarget::kHost;
  p.stack->dp_bucket_bytes = 1;  // a bucket per layer
  SimulationOptions options;
  options.trace = true;
  const SimulationResult r = simulate(model, cluster, p, options);
  ASSERT_TRUE(r.trace.has_value());
  const double f = 2.0 * kBatch * kOffloadedWidth * kOffloadedWidth / 100e12;
  const double c = kKept / 100e9;
  double last_grad = 0, adamw = 0, back = 0;
  std::vector<std::pair<double, double>> grads, reloads;
  for (const spec::TraceEvent& e : r.trace->events) {
    const double begin = ps_to_seconds(e.start_ps), end = ps_to_seconds(e.start_ps + e.duration_ps);
    if (e.name == "offload.grad_to_host") {
      EXPECT_EQ(e.stream, spec::Stream::kOffload);
      grads.emplace_back(begin, end);
      last_grad = ps_to_seconds(e.duration_ps);
    }
    if (e.name == "offload.activations_to_device") {
      EXPECT_EQ(e.stream, spec::Stream::kOffloadIn);
      reloads.emplace_back(begin, end);
    }
    if (e.name == "offload.adamw") adamw = ps_to_seconds(e.duration_ps);
    if (e.name == "offload.params_to_device") back = ps_to_seconds(e.duration_ps);
  }
  ASSERT_EQ(grads.size(), static_cast<size_t>(kOffloadedLayers));
  ASSERT_EQ(reloads.size(), static_cast<size_t>(kOffloadedLayers));
  // A gradient copy runs while a reload does.
  bool overlapped = false;
  for (const auto& [gb, ge] : grads)
    for (const auto& [rb, re] : reloads) overlapped |= gb < re && rb < ge;
  EXPECT_TRUE(overlapped);
  EXPECT_NEAR(r.report.breakdown_s.offload_exposed, (9 * c - 7 * f) + last_grad + adamw + back,
              1e-9);
}

TEST(ActivationOffload, ClusterWithoutHostIsRefused) {
  const spec::ModelSpec model = test::uniform_mlp(kOffloadedLayers, kOffloadedWidth);
  try {
    simulate(model, test::ideal_cluster(100), one_gpu(0), {});
    FAIL() << "offloaded activations without a host section";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no \"host\" section"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sextant::sim
