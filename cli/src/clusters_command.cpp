// `sextant clusters list|show|detect`: the shipped cluster descriptions, and a file for this
// machine's CPU cores measured here.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "detect_cluster.hpp"
#include "fitted_output.hpp"
#include "format.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::cli {

namespace {

void run_list() {
  const std::vector<std::string> names = spec::builtin_cluster_names();
  size_t width = 4;  // "name"
  for (const std::string& name : names) width = std::max(width, name.size());
  // The description wraps under its own column, after the device's.
  const size_t description_column = width + 1 + 6 + 1 + 6 + 2 + 21 + 1;
  fmt::print("{:<{}} {:>6} {:>6}  {:<21} {}\n", "name", width, "nodes", "dev/nd", "device",
             "description");
  for (const std::string& name : names) {
    spec::ClusterSpec c = spec::builtin_cluster(name);
    fmt::print("{:<{}} {:>6} {:>6}  {:<21} {}\n", name, width, c.nodes, c.devices_per_node,
               c.device.name, wrap_from(c.description, description_column));
  }
}

void run_show(const std::string& name, bool json) {
  spec::ClusterSpec c = spec::resolve_cluster(name);
  if (json) {
    std::cout << spec::to_json(c).dump(2) << "\n";
    return;
  }
  fmt::print("{}: {}\n", c.name, c.description);
  fmt::print("  {} nodes x {} {} = {} devices\n", c.nodes, c.devices_per_node, c.device.name,
             c.total_devices());
  for (const auto& [dtype, tflops] : c.device.peak_tflops)
    fmt::print("  peak {:<5} {:>9.4g} TFLOP/s\n", spec::enum_name(spec::dtype_names(), dtype),
               tflops);
  fmt::print("  memory      {} at {:.0f} GB/s (efficiency {:.2f})\n",
             human_bytes(static_cast<double>(c.device.memory_capacity_bytes)),
             c.device.memory_bandwidth_GBps, c.device.memory_efficiency);
  fmt::print("  GEMM efficiency: ");
  for (const spec::EfficiencyPoint& p : c.device.gemm_efficiency)
    fmt::print("{:.0e} FLOP -> {:.2f}  ", p.flops, p.efficiency);
  fmt::print("\n  launch overhead {:.1f} us\n", c.device.launch_overhead_us);
  for (const spec::NetworkLevel& l : c.network.levels) {
    fmt::print("  network {:<14} {:<7} {:>7.1f} GB/s per {}, latency {:.1f} us, {}\n", l.name,
               spec::enum_name(spec::level_scope_names(), l.scope), l.bandwidth_GBps,
               l.scope == spec::LevelScope::kNode ? "device" : "NIC", l.latency_us,
               spec::enum_name(spec::topology_names(), l.topology));
  }
  if (c.device.co_run)
    fmt::print("  beside {} busy devices: GEMMs {:.2f}x, memory-bound ops {:.2f}x as long\n",
               c.device.co_run->devices, c.device.co_run->matrix, c.device.co_run->memory);
  if (!c.device.host_cpu.empty()) fmt::print("  made for: {}\n", c.device.host_cpu);
  fmt::print("  collectives: {}, reduction {:.0f} GB/s\n",
             spec::enum_name(spec::collective_library_names(), c.network.library),
             c.network.reduction_GBps);
  if (c.calibrated_from) fmt::print("  calibrated from: {}\n", c.calibrated_from->dump());
}

void run_detect(const std::string& out) {
  if (std::string why = spec::unwritable_reason(out); !why.empty())
    throw InputError("command line", "--out", out, why);
  fmt::print(stderr, "measuring this machine's CPU cores (about 15 seconds)\n");
  const std::string dir = std::filesystem::path(out).parent_path().string();
  const spec::ClusterSpec c = detect_local_cluster(
      dir.empty() ? "." : dir, [](const std::string& line) { fmt::print(stderr, "{}\n", line); });
  spec::write_json_file(out, spec::to_json(c));
  spec::read_cluster_file(out);  // what was written reads back
  fmt::print("wrote {}: {} x {}\n", out, c.devices_per_node, c.device.name);
  fmt::print(
      "  fp32 peak {:.3f} TFLOP/s (the executor's fastest GEMM), memory {:.0f} GB/s (a core "
      "streaming its L2)\n",
      c.device.peak_tflops.at(spec::Dtype::kFp32), c.device.memory_bandwidth_GBps);
  if (c.device.co_run)
    fmt::print("  beside {} busy cores: GEMMs {:.2f}x, memory-bound ops {:.2f}x as long\n",
               c.device.co_run->devices, c.device.co_run->matrix, c.device.co_run->memory);
  fmt::print("use it with --cluster {}; scripts/calibrate-local.sh fits it to training runs\n",
             out);
}

}  // namespace

void add_clusters_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "clusters", "List or show cluster descriptions, or detect this machine's CPU");
  cmd->require_subcommand(1);
  cmd->add_subcommand("list", "List the shipped clusters")->callback([] { run_list(); });
  struct Options {
    std::string name;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* show = cmd->add_subcommand("show", "Show one cluster");
  show->add_option("cluster", o->name, "Shipped cluster name or cluster file")->required();
  show->add_flag("--json", o->json, "Print JSON");
  show->callback([o] { run_show(o->name, o->json); });
  auto out = std::make_shared<std::string>();
  CLI::App* detect = cmd->add_subcommand(
      "detect", "Measure this machine's CPU cores into a cluster file (for local CPU runs)");
  detect->add_option("--out", *out, "The cluster file to write")->required();
  detect->callback([out] { run_detect(*out); });
}

}  // namespace sextant::cli
