// AxoNN's 3D tensor parallelism against Megatron-LM's 1D tensor parallelism: the communication
// volume each GPU sends per transformer block (forward and backward) as the lowering gives it,
// for GPT-3 175B at tp 8 to 64, Megatron's 1D layout (where tp divides the 96 heads) and every
// 3D grid; then the simulated step of the best of each on 1024 A100s (dp fills the rest). The
// volume counts what a ring algorithm sends per rank: an all-reduce of S bytes 2 (n-1)/n S, an
// all-gather (S its output) and a reduce-scatter (S its input) (n-1)/n S (Thakur et al. 2005;
// the bandwidth terms of NCCL's ring). Singh et al. (arXiv:2305.13525, §IV-V) argue the 1D volume
// stays ~8 b s h per block whatever tp while a grid's shrinks as it grows; this prints ours. A
// number, never a pass/fail.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "sextant/models/lowering.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/tensor_grid.hpp"

namespace {

using namespace sextant;

// Bytes one rank sends for the collectives of one block's forward and backward.
double block_volume(const models::Layer& block, int64_t tp, const spec::TensorGrid& grid) {
  double sent = 0;
  for (const auto* pass : {&block.forward, &block.backward}) {
    for (const models::Op& op : *pass) {
      if (!op.is_comm()) continue;
      int64_t n = tp;
      if (op.group == models::CommGroup::kGridX) n = grid.x;
      if (op.group == models::CommGroup::kGridY) n = grid.y;
      if (op.group == models::CommGroup::kGridZ) n = grid.z;
      const double share = static_cast<double>(n - 1) / static_cast<double>(n);
      const double factor = op.collective == spec::CollectiveKind::kAllReduce ? 2 * share : share;
      sent += factor * static_cast<double>(op.bytes);
    }
  }
  return sent;
}

}  // namespace

int main() {
  const spec::ModelSpec model = models::zoo_model("gpt3-175b");
  const spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  const int64_t micro_batch = 8;  // sequences per micro-batch of a replica (z splits them)
  fmt::print(
      "GPT-3 175B, micro-batch {} x 2048 tokens, bf16: bytes sent per GPU per block "
      "(forward + backward)\n\n",
      micro_batch);
  fmt::print("{:>4}  {:>10}  {:>12}  {:>10}  {:>12}  {:>8}\n", "tp", "1D GiB", "best grid",
             "grid GiB", "grid / 1D", "grids");
  struct Best {
    int64_t tp;
    spec::TensorGrid grid;
  };
  std::vector<Best> best_grids;
  for (int64_t tp : {8, 16, 32, 64}) {
    models::LoweringOptions o;
    o.micro_batch = micro_batch;
    o.dtype = spec::Dtype::kBf16;
    o.tp = tp;
    double flat = -1;
    if (spec::tensor_parallel_problem(model, tp).empty())
      flat = block_volume(models::lower(model, o).layers[1], tp, {});
    double least = -1;
    spec::TensorGrid arg{};
    int grids = 0;
    for (int64_t x = 1; x <= tp; x *= 2)
      for (int64_t y = 1; x * y <= tp; y *= 2) {
        const spec::TensorGrid g{x, y, tp / (x * y)};
        if (!spec::tensor_grid_model_problem(model, g, micro_batch).empty()) continue;
        o.tp_grid = g;
        const double v = block_volume(models::lower(model, o).layers[1], tp, g);
        ++grids;
        if (least < 0 || v < least) {
          least = v;
          arg = g;
        }
      }
    best_grids.push_back({tp, arg});
    const double gib = 1024.0 * 1024 * 1024;
    fmt::print("{:>4}  {:>10}  {:>12}  {:>10.3f}  {:>12}  {:>8}\n", tp,
               flat < 0 ? std::string("-") : fmt::format("{:.3f}", flat / gib),
               spec::tensor_grid_text(arg), least / gib,
               flat < 0 ? std::string("-") : fmt::format("{:.2f}", least / flat), grids);
  }
  fmt::print(
      "\nSimulated on 1024 x dgx-a100 (stack megatron-lm, no sequence parallelism, "
      "pp 1, zero 1, full recompute, global batch 1536 in one micro-batch per replica): "
      "step time, exposed tensor-parallel time and memory; the grids also with AxoNN's overlap "
      "(the stack's tp_overlap: bulk = --overlap-axonn-comm --overlap-axonn-reduce-scatter, "
      "pipelined = and --overlap-axonn-all-gather)\n\n");
  fmt::print("{:>4}  {:<34}  {:>9}  {:>9}  {:>9}  {:>10}\n", "tp", "plan", "overlap", "step s",
             "tp exp s", "memory GiB");
  for (const Best& b : best_grids) {
    for (bool grid : {false, true}) {
      for (spec::TpOverlap overlap :
           {spec::TpOverlap::kNone, spec::TpOverlap::kBulk, spec::TpOverlap::kPipelined}) {
        if (!grid && overlap != spec::TpOverlap::kNone) continue;
        spec::Plan p;
        p.tp = b.tp;
        p.dp = 1024 / b.tp;
        p.zero = 1;
        // One micro-batch per step, as AxoNN trains (no gradient accumulation): the z axis
        // gathers every weight block once per micro-batch, so accumulation multiplies its volume.
        p.global_batch = 1536;
        p.micro_batch = p.global_batch / p.dp;
        p.recompute = spec::Recompute::kFull;
        p.stack = spec::builtin_stack("megatron-lm");
        p.stack->tp_overlap = overlap;
        if (grid) p.tp_grid = b.grid;
        if (!grid && !spec::tensor_parallel_problem(model, b.tp).empty()) continue;
        if (grid && p.micro_batch % b.grid.z != 0) continue;
        const std::string how(spec::enum_name(spec::tp_overlap_names(), overlap));
        try {
          const spec::Report r = sim::simulate(model, cluster, p, {}).report;
          fmt::print("{:>4}  {:<34}  {:>9}  {:>9.2f}  {:>9.2f}  {:>10.1f}\n", b.tp, p.name(), how,
                     r.step_time_s, r.breakdown_s.tp_comm_exposed,
                     static_cast<double>(r.memory.peak_bytes) / (1024.0 * 1024 * 1024));
        } catch (const std::exception& e) {
          fmt::print("{:>4}  {:<34}  {:>9}  {}\n", b.tp, p.name(), how, e.what());
        }
      }
    }
  }
  return 0;
}
