// ClusterSpec decoding, the shipped cluster files, the efficiency curve and overrides.
#include "sextant/spec/cluster_spec.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "expect_input_error.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/host_cpu.hpp"

namespace sextant::spec {
namespace {

TEST(ClusterSpec, EveryShippedClusterLoadsAndRoundTrips) {
  std::vector<std::string> names = builtin_cluster_names();
  ASSERT_GE(names.size(), 4u);
  for (const std::string& name : names) {
    ClusterSpec c = builtin_cluster(name);
    EXPECT_EQ(c.name, name);
    EXPECT_FALSE(c.device.source.empty()) << name << ": hardware numbers must carry a source";
    EXPECT_EQ(to_json(cluster_from_json(to_json(c), "again")), to_json(c)) << name;
  }
}

TEST(ClusterSpec, DgxA100MatchesTheDatasheet) {
  ClusterSpec c = builtin_cluster("dgx-a100");
  EXPECT_EQ(c.devices_per_node, 8);
  EXPECT_DOUBLE_EQ(c.device.peak_flops(Dtype::kBf16), 312e12);  // A100 dense bf16
  EXPECT_EQ(c.device.memory_capacity_bytes, 80LL << 30);
  ASSERT_NE(c.network.cluster_level(), nullptr);
  EXPECT_EQ(c.network.cluster_level()->nics_per_node, 8);
}

TEST(ClusterSpec, GemmEfficiencyInterpolatesInLogFlops) {
  ClusterSpec c = builtin_cluster("dgx-a100");
  c.device.gemm_efficiency = {{1e8, 0.2}, {1e10, 0.6}};
  // Halfway between 1e8 and 1e10 in log space is 1e9: (0.2 + 0.6) / 2.
  EXPECT_NEAR(c.device.gemm_efficiency_at(1e9), 0.4, 1e-12);
  EXPECT_DOUBLE_EQ(c.device.gemm_efficiency_at(1e3), 0.2);   // clamped below
  EXPECT_DOUBLE_EQ(c.device.gemm_efficiency_at(1e15), 0.6);  // clamped above
}

TEST(ClusterSpec, UnknownUnitTypoIsRejected) {
  Json j = to_json(builtin_cluster("dgx-a100"));
  j["network"]["levels"][1]["bandwidth_Gbps"] = 200;
  EXPECT_INPUT_ERROR(cluster_from_json(j, "x.json"),
                     "x.json: /network/levels/1/bandwidth_Gbps: unknown field");
}

TEST(ClusterSpec, NegativeBandwidthIsRejectedWithThePointer) {
  Json j = to_json(builtin_cluster("dgx-a100"));
  j["network"]["levels"][1]["bandwidth_GBps"] = -3;
  EXPECT_INPUT_ERROR(cluster_from_json(j, "clusters/x.json"),
                     "clusters/x.json: /network/levels/1/bandwidth_GBps = -3: must be > 0");
}

TEST(ClusterSpec, CoRunSlowdownIsReadAndLinearInTheBusyDevices) {
  Json j = to_json(builtin_cluster("local-cpu"));
  j["device"]["co_run"] = {{"devices", 4}, {"matrix", 1.6}, {"memory", 1.2}, {"source", "t"}};
  j["device"]["host_cpu"] = "GenuineIntel family 6 model 85: Intel Xeon";
  const ClusterSpec c = cluster_from_json(j, "x.json");
  ASSERT_TRUE(c.device.co_run);
  const CoRunSlowdown& co = *c.device.co_run;
  EXPECT_EQ(co.devices, 4);
  EXPECT_EQ(c.device.host_cpu, "GenuineIntel family 6 model 85: Intel Xeon");
  // Alone: none. At the measured 4: the measured figure. Between: 1 + (f - 1)(busy - 1)/3, so two
  // busy GEMM cores 1 + 0.6/3 = 1.2, three 1.4; beyond the measurement it stays at f.
  EXPECT_DOUBLE_EQ(co.at(true, 1), 1.0);
  EXPECT_DOUBLE_EQ(co.at(true, 2), 1.2);
  EXPECT_DOUBLE_EQ(co.at(true, 3), 1.4);
  EXPECT_DOUBLE_EQ(co.at(true, 4), 1.6);
  EXPECT_DOUBLE_EQ(co.at(true, 8), 1.6);
  EXPECT_DOUBLE_EQ(co.at(false, 4), 1.2);
  // It survives the round trip.
  const ClusterSpec again = cluster_from_json(to_json(c), "y.json");
  ASSERT_TRUE(again.device.co_run);
  EXPECT_DOUBLE_EQ(again.device.co_run->memory, 1.2);
  EXPECT_EQ(again.device.host_cpu, c.device.host_cpu);
  // A core beside others is slowed, never sped up.
  j["device"]["co_run"]["matrix"] = 0.9;
  EXPECT_INPUT_ERROR(cluster_from_json(j, "x.json"), "x.json: /device/co_run/matrix = 0.9");
}

TEST(HostCpu, AFileMadeForAnotherCpuIsNamedWithTheWayOut) {
  // The identity is vendor, family and model; the model name after ": " may differ.
  EXPECT_TRUE(same_host_cpu("AuthenticAMD family 26 model 2: AMD EPYC",
                            "AuthenticAMD family 26 model 2: AMD EPYC 9R45"));
  EXPECT_FALSE(same_host_cpu("AuthenticAMD family 26 model 2: AMD EPYC",
                             "GenuineIntel family 6 model 85: Intel Xeon"));
  const std::string here = this_host_cpu();
  if (here.empty()) GTEST_SKIP() << "no /proc/cpuinfo";
  ClusterSpec c = builtin_cluster("local-cpu");
  c.device.host_cpu = here;
  EXPECT_EQ(host_cpu_mismatch(c), "");
  c.device.host_cpu = "NoVendor family 0 model 0: a CPU that does not exist";
  const std::string why = host_cpu_mismatch(c);
  EXPECT_NE(why.find("local-cpu was made for another CPU (NoVendor family 0 model 0"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("sextant clusters detect --out FILE"), std::string::npos) << why;
  c.device.host_cpu.clear();  // a file that does not say: no verdict
  EXPECT_EQ(host_cpu_mismatch(c), "");
  ClusterSpec gpu = builtin_cluster("dgx-h100");
  gpu.device.host_cpu = "NoVendor family 0 model 0: x";
  EXPECT_EQ(host_cpu_mismatch(gpu), "");
}

TEST(ClusterSpec, KernelFamiliesAreReadByName) {
  Json j = to_json(builtin_cluster("dgx-a100"));
  j["device"]["memory_efficiency_by_kernel"] = {{"native_norm", 0.6}, {"mixed_dtype", 0.4}};
  j["device"]["block_bandwidth_GBps"] = 45.5;
  const ClusterSpec c = cluster_from_json(j, "x.json");
  EXPECT_DOUBLE_EQ(c.device.memory_efficiency_for(OpClass::kNorm, MemoryKernel::kNativeNorm), 0.6);
  EXPECT_DOUBLE_EQ(c.device.memory_efficiency_for(OpClass::kElementwise, MemoryKernel::kMixedDtype),
                   0.4);
  // A family the file leaves out is the class's.
  EXPECT_DOUBLE_EQ(c.device.memory_efficiency_for(OpClass::kNorm, MemoryKernel::kGeneric),
                   c.device.memory_efficiency_for(OpClass::kNorm));
  EXPECT_DOUBLE_EQ(c.device.block_bandwidth_GBps, 45.5);
  j["device"]["memory_efficiency_by_kernel"] = {{"aten_norm", 0.6}};
  EXPECT_INPUT_ERROR(cluster_from_json(j, "x.json"),
                     "x.json: /device/memory_efficiency_by_kernel/aten_norm: unknown field");
  j["device"]["memory_efficiency_by_kernel"] = {{"mixed_dtype", 1.5}};
  EXPECT_INPUT_ERROR(cluster_from_json(j, "x.json"),
                     "x.json: /device/memory_efficiency_by_kernel/mixed_dtype = 1.5");
}

TEST(ClusterSpec, MultiNodeClusterNeedsAClusterLevel) {
  Json j = to_json(builtin_cluster("dgx-a100"));
  j["network"]["levels"].erase(1);
  EXPECT_INPUT_ERROR(cluster_from_json(j, "x.json"), "needs a level with scope \"cluster\"");
}

TEST(ClusterSpec, EfficiencyCurveMustIncrease) {
  Json j = to_json(builtin_cluster("dgx-a100"));
  j["device"]["gemm_efficiency"] = Json::parse(R"([{"flops": 1e9, "efficiency": 0.5},
                                                   {"flops": 1e8, "efficiency": 0.6}])");
  EXPECT_INPUT_ERROR(cluster_from_json(j, "x.json"), "increasing flops order");
}

TEST(ClusterSpec, SpeedOverridesMultiply) {
  Json j = to_json(builtin_cluster("dgx-a100"));
  j["overrides"] =
      Json::parse(R"({"speed": [{"node": 1, "factor": 0.5}, {"rank": 9, "factor": 0.5}],
                                   "links": [{"level": "infiniband", "node": 3, "factor": 0.25}]})");
  ClusterSpec c = cluster_from_json(j, "x.json");
  EXPECT_DOUBLE_EQ(c.speed_factor(0), 1.0);
  EXPECT_DOUBLE_EQ(c.speed_factor(8), 0.5);   // node 1
  EXPECT_DOUBLE_EQ(c.speed_factor(9), 0.25);  // node 1 and rank 9
  ASSERT_EQ(c.link_overrides.size(), 1u);
}

TEST(ClusterSpec, OverrideNamingAMissingLevelIsRejected) {
  Json j = to_json(builtin_cluster("dgx-a100"));
  j["overrides"] = Json::parse(R"({"links": [{"level": "ethernet", "node": 0, "factor": 0.5}]})");
  EXPECT_INPUT_ERROR(cluster_from_json(j, "x.json"),
                     "must name a network level (nvlink or infiniband)");
}

TEST(ClusterSpec, UnknownClusterNameListsTheShippedOnes) {
  EXPECT_INPUT_ERROR(builtin_cluster("dgx-b200"), "dgx-a100");
}

TEST(ClusterSpec, PeakOfAMissingDtypeIsAClearError) {
  ClusterSpec c = builtin_cluster("local-cpu");
  EXPECT_INPUT_ERROR(c.device.peak_flops(Dtype::kBf16), "no peak given for this dtype");
}

}  // namespace
}  // namespace sextant::spec
