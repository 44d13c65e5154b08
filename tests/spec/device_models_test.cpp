// The cluster file's kernel models are read strictly: every bad tile, curve or alias is refused
// naming its JSON pointer.
#include "sextant/spec/device_models.hpp"

#include <gtest/gtest.h>

#include <functional>

#include "expect_input_error.hpp"
#include "sextant/spec/cluster_catalog.hpp"

namespace sextant::spec {
namespace {

Json cluster_with(const std::function<void(Json&)>& edit) {
  Json j = to_json(builtin_cluster("dgx-h100"));
  edit(j);
  return j;
}

TEST(DeviceModels, ShippedGpuClustersDescribeTheirKernels) {
  for (const char* name : {"dgx-a100", "dgx-h100", "h100-1gpu", "h200-1gpu"}) {
    ClusterSpec c = builtin_cluster(name);
    ASSERT_TRUE(c.device.gemm_model) << name;
    EXPECT_FALSE(c.device.attention_kernels.empty()) << name;
    EXPECT_GT(c.device.runtime_reserved_bytes, 0) << name;
    // Every kernel answers both passes and both masks at a common shape.
    for (const auto& [kernel, data] : c.device.attention_kernels)
      for (bool causal : {false, true})
        for (bool bwd : {false, true})
          EXPECT_GT(
              attention_tflops(c.device.attention_kernels, name, kernel, 128, 4096, causal, bwd),
              0);
  }
}

TEST(DeviceModels, BadKernelModelsAreRefused) {
  auto read = [](const Json& j) { return cluster_from_json(j, "c.json"); };
  EXPECT_INPUT_ERROR(
      read(cluster_with([](Json& j) { j["device"]["gemm_model"]["tiles"] = Json::array(); })),
      "/device/gemm_model/tiles = []: needs at least one tile");
  EXPECT_INPUT_ERROR(
      read(cluster_with([](Json& j) { j["device"]["gemm_model"]["tiles"][0] = {256}; })),
      "/device/gemm_model/tiles/0 = [256]: must be [rows, columns] of a tile");
  EXPECT_INPUT_ERROR(read(cluster_with([](Json& j) {
                       j["device"]["attention_kernels"]["flash3"]["curves"][0]["tflops"].erase(0);
                     })),
                     "/device/attention_kernels/flash3/curves/0/tflops");
  EXPECT_INPUT_ERROR(read(cluster_with([](Json& j) {
                       j["device"]["attention_kernels"]["flash3"]["curves"][0]["seq_len"][1] = 100;
                     })),
                     "/device/attention_kernels/flash3/curves/0/seq_len/1 = 100: must be larger "
                     "than the entry before it");
  EXPECT_INPUT_ERROR(
      read(cluster_with([](Json& j) {
        j["device"]["attention_kernels"]["sdpa"] = {{"same_as", "sdpa"}, {"source", "x"}};
      })),
      "/device/attention_kernels/sdpa/same_as = sdpa: must name another fused kernel");
  EXPECT_INPUT_ERROR(
      read(cluster_with([](Json& j) {
        j["device"]["attention_kernels"]["flash2"] = {{"same_as", "sdpa"}, {"source", "x"}};
        j["device"]["attention_kernels"]["sdpa"] = {{"same_as", "flash2"}, {"source", "x"}};
      })),
      "no cycle");
  EXPECT_INPUT_ERROR(read(cluster_with([](Json& j) {
                       j["device"]["attention_kernels"]["flash3"].erase("curves");
                     })),
                     "/device/attention_kernels/flash3/curves: give \"curves\" or \"same_as\"");
}

TEST(DeviceModels, AKernelWithoutABackwardCurveIsAnInputError) {
  std::map<AttentionKernel, AttentionKernelData> k;
  k[AttentionKernel::kFlash2].curves = {{64, false, "fwd", {1000}, {100}}};
  EXPECT_INPUT_ERROR(attention_tflops(k, "gpu", AttentionKernel::kFlash2, 64, 1000, false, true),
                     "no non-causal bwd curve for head dim 64");
}

}  // namespace
}  // namespace sextant::spec
