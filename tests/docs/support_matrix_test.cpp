// docs/SUPPORT.md is the layout suite (tests/support/layout_suite.hpp) through the executor's table
// (spec::executor_problems): which layouts run on which backend and precision, and what each is
// checked against. The test fails when the file is stale; SEXTANT_UPDATE_DOCS=1 rewrites it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "layout_suite.hpp"
#include "sextant/spec/executor_support.hpp"

namespace sextant::layout_suite {
namespace {

std::string_view family(Net n) {
  switch (n) {
    case Net::kGpt:
      return "GPT";
    case Net::kMlp:
      return "MLP";
    case Net::kLlama:
      return "Llama";
    case Net::kLlamaWideVocab:
      return "Llama, vocabulary 256";
    case Net::kGptOddVocab:
      return "GPT, vocabulary 63";
    case Net::kCnn:
      return "CNN";
    case Net::kVgg:
      return "VGG";
    case Net::kUnet:
      return "U-Net";
    case Net::kUnet3d:
      return "3D U-Net";
    case Net::kUnetTall:
      return "U-Net, tall";
    case Net::kVolumeClassifier:
      return "volume classifier";
    case Net::kAmoeba:
      return "AmoebaNet";
    case Net::kInception:
      return "Inception";
    case Net::kMoe:
      return "mixture of experts";
    case Net::kMoeCapacity:
      return "MoE, capacity";
  }
  return "?";
}

// Whether the executor runs `l` on `backend` in `precision`, as the suite runs it.
std::string_view runs(const Layout& l, spec::ExecutorBackend backend,
                      spec::ExecutorPrecision precision) {
  return spec::executor_problems(model_of(l.net), l.plan, suite_run(l, backend, precision)).empty()
             ? "yes"
             : "-";
}

std::string support_matrix() {
  std::ostringstream s;
  s << "# What Sextant's executor runs\n\n"
       "Generated from the layout suite (`tests/support/layout_suite.cpp`) and the executor's "
       "table\n(`spec/src/executor_support.cpp`); a test fails when this file is stale "
       "(`SEXTANT_UPDATE_DOCS=1\nbuild/release/tests/models_test --gtest_filter='SupportMatrix.*'` "
       "rewrites it).\n\n"
       "Every layout runs on CPU ranks in the multi-rank suite (ctest `exec.mpi.np2`, `np4`, "
       "`np8`).\n**checked**: `one rank` equals the single-rank run's loss to 1e-5 relative over "
       "10 steps\n(fp32; 1e-2 in bf16); `ops` (lossy compression, per-rank capacity) holds the "
       "simulator's ops.\nEach layout's ops also match the simulator's step, rank by rank. The "
       "CPU bf16 column is the\nemulation (`--precision bf16`, ctest `exec.bf16.mpi.np4`); the "
       "CUDA columns say what the table\nlets the GPU backend run (`scripts/gpu-check.sh` runs "
       "them where a GPU is lent).\n\n"
       "| layout | model | ranks | checked | CPU fp32 | CPU bf16 | CUDA fp32 | CUDA bf16 |\n"
       "|---|---|---|---|---|---|---|---|\n";
  using B = spec::ExecutorBackend;
  using P = spec::ExecutorPrecision;
  auto rows = [&](const std::vector<Layout>& list, std::string_view checked) {
    for (const Layout& l : list)
      s << fmt::format("| `{}` | {} | {} | {} | {} | {} | {} | {} |\n", l.name, family(l.net),
                       l.plan.world_size(), checked, runs(l, B::kCpu, P::kFp32),
                       runs(l, B::kCpu, P::kBf16), runs(l, B::kCuda, P::kFp32),
                       runs(l, B::kCuda, P::kBf16));
  };
  rows(layouts(), "one rank");
  rows(compressed_layouts(), "ops");
  rows(per_tp_rank_capacity_layouts(), "ops");
  return s.str();
}

TEST(SupportMatrix, DocsSupportIsTheLayoutSuiteThroughTheExecutorsTable) {
  const std::string path = std::string(SEXTANT_SOURCE_DIR) + "/docs/SUPPORT.md";
  const std::string want = support_matrix();
  if (const char* update = std::getenv("SEXTANT_UPDATE_DOCS"); update && std::string(update) == "1")
    std::ofstream(path) << want;
  std::ifstream in(path);
  std::stringstream have;
  have << in.rdbuf();
  EXPECT_EQ(have.str(), want) << "docs/SUPPORT.md is stale: rerun with SEXTANT_UPDATE_DOCS=1";
  // Every layout runs on CPU ranks in fp32 (the suite's own rule, runs_here).
  for (const auto& list : {layouts(), compressed_layouts(), per_tp_rank_capacity_layouts()})
    for (const Layout& l : list)
      EXPECT_EQ(runs(l, spec::ExecutorBackend::kCpu, spec::ExecutorPrecision::kFp32), "yes")
          << l.name;
}

}  // namespace
}  // namespace sextant::layout_suite
