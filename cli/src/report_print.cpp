// Prints a report as a short table.
#include "report_print.hpp"

#include <fmt/format.h>

#include <cstdlib>

#include "format.hpp"

namespace sextant::cli {

void print_report(const spec::Report& r, const std::optional<PublishedMfu>& reference) {
  fmt::print("{} on {} x {} ({}), plan {}, stack {}\n", r.model, r.gpus, r.cluster, r.network,
             r.plan, r.stack);
  fmt::print("  step time        {}\n", human_seconds(r.step_time_s));
  // A CNN's samples are its items (tokens_per_s == samples_per_s): no tokens/s for it.
  if (r.tokens_per_s != r.samples_per_s)
    fmt::print("  throughput       {:.0f} tokens/s, {:.2f} samples/s\n", r.tokens_per_s,
               r.samples_per_s);
  else
    fmt::print("  throughput       {:.2f} samples/s\n", r.samples_per_s);
  fmt::print(
      "  per GPU          {:.1f} model TFLOP/s (MFU {:.1f}%), {:.1f} hardware TFLOP/s (HFU "
      "{:.1f}%)\n",
      r.model_tflops_per_gpu, 100 * r.mfu, r.hardware_tflops_per_gpu, 100 * r.hfu);
  fmt::print("{}", mfu_plausibility_line(r.mfu, reference));
  const spec::TimeBreakdown& b = r.breakdown_s;
  auto pct = [&](double x) { return 100 * x / r.step_time_s; };
  fmt::print("  breakdown        compute {} ({:.1f}%), optimizer {} ({:.1f}%)\n",
             human_seconds(b.compute), pct(b.compute), human_seconds(b.optimizer),
             pct(b.optimizer));
  fmt::print(
      "                   exposed tp {} ({:.1f}%), dp {} ({:.1f}%), pp {} ({:.1f}%), fsdp {} "
      "({:.1f}%)\n",
      human_seconds(b.tp_comm_exposed), pct(b.tp_comm_exposed), human_seconds(b.dp_comm_exposed),
      pct(b.dp_comm_exposed), human_seconds(b.pp_comm_exposed), pct(b.pp_comm_exposed),
      human_seconds(b.fsdp_comm_exposed), pct(b.fsdp_comm_exposed));
  fmt::print("                   pipeline bubble {} ({:.1f}%)\n", human_seconds(b.bubble),
             pct(b.bubble));
  if (b.spatial_comm_exposed > 0)
    fmt::print("                   spatial (halos, batch-norm and pool all-reduces) {} ({:.1f}%)\n",
               human_seconds(b.spatial_comm_exposed), pct(b.spatial_comm_exposed));
  if (b.cp_comm_exposed > 0)
    fmt::print(
        "                   context parallel (attention's key/value transfers) {} ({:.1f}%)\n",
        human_seconds(b.cp_comm_exposed), pct(b.cp_comm_exposed));
  if (b.ep_comm_exposed > 0)
    fmt::print(
        "                   expert parallel (token dispatch and combine all-to-alls) {} "
        "({:.1f}%)\n",
        human_seconds(b.ep_comm_exposed), pct(b.ep_comm_exposed));
  if (b.offload_exposed > 0)
    fmt::print("                   offload (host copies, host optimizer) {} ({:.1f}%)\n",
               human_seconds(b.offload_exposed), pct(b.offload_exposed));
  if (b.host_bound > 0)
    fmt::print("                   waiting for the host to launch kernels {} ({:.1f}%)\n",
               human_seconds(b.host_bound), pct(b.host_bound));
  const spec::MemoryBreakdown& m = r.memory;
  fmt::print(
      "  memory per GPU   {} of {} ({}, {} {}): weights {}, gradients {}, optimizer {}, "
      "activations {}, buffers {}, reserved {}\n",
      human_bytes(static_cast<double>(m.peak_bytes)),
      human_bytes(static_cast<double>(m.capacity_bytes)), m.fits ? "fits" : "DOES NOT FIT",
      human_bytes(static_cast<double>(std::abs(m.headroom_bytes))),
      m.headroom_bytes >= 0 ? "free" : "over", human_bytes(static_cast<double>(m.weights)),
      human_bytes(static_cast<double>(m.gradients)), human_bytes(static_cast<double>(m.optimizer)),
      human_bytes(static_cast<double>(m.activations)), human_bytes(static_cast<double>(m.buffers)),
      human_bytes(static_cast<double>(m.reserved)));
  if (!m.explained.empty()) {
    fmt::print("  memory explained (the most loaded pipeline stage's rank)\n");
    for (const spec::MemoryItem& i : m.explained)
      fmt::print("    {:<12} {:>10}  {}\n", i.part, human_bytes(static_cast<double>(i.bytes)),
                 i.detail);
    fmt::print("    {:<12} {:>10}  {} of {}\n", m.headroom_bytes >= 0 ? "free" : "over",
               human_bytes(static_cast<double>(std::abs(m.headroom_bytes))),
               human_bytes(static_cast<double>(m.peak_bytes)),
               human_bytes(static_cast<double>(m.capacity_bytes)));
  }
  if (m.host_bytes > 0)
    fmt::print("  host memory      {} of this rank's share {} of its node's memory\n",
               human_bytes(static_cast<double>(m.host_bytes)),
               human_bytes(static_cast<double>(m.host_capacity_bytes)));
  if (r.simulated_ranks > 0 && r.simulated_ranks < r.gpus) {
    fmt::print(
        "  simulated        {} events in {} ({} of {} ranks; the others are symmetric copies)\n",
        r.events, human_seconds(r.sim_wall_s), r.simulated_ranks, r.gpus);
  } else {
    fmt::print("  simulated        {} events in {}\n", r.events, human_seconds(r.sim_wall_s));
  }
}

}  // namespace sextant::cli
