// `sextant clusters list|show`: the shipped cluster descriptions.
#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "commands.hpp"
#include "fitted_output.hpp"
#include "format.hpp"
#include "sextant/spec/cluster_catalog.hpp"

namespace sextant::cli {

namespace {

void run_list() {
  fmt::print("{:<12} {:>6} {:>6}  {:<21} {}\n", "name", "nodes", "dev/nd", "device", "description");
  for (const std::string& name : spec::builtin_cluster_names()) {
    spec::ClusterSpec c = spec::builtin_cluster(name);
    // The description wraps under its own column (column 50: after the device).
    fmt::print("{:<12} {:>6} {:>6}  {:<21} {}\n", name, c.nodes, c.devices_per_node, c.device.name,
               wrap_from(c.description, 50));
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
    fmt::print("  peak {:<5} {:>9.1f} TFLOP/s\n", spec::enum_name(spec::dtype_names(), dtype),
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
  fmt::print("  collectives: {}, reduction {:.0f} GB/s\n",
             spec::enum_name(spec::collective_library_names(), c.network.library),
             c.network.reduction_GBps);
  if (c.calibrated_from) fmt::print("  calibrated from: {}\n", c.calibrated_from->dump());
}

}  // namespace

void add_clusters_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("clusters", "List or show cluster descriptions");
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
}

}  // namespace sextant::cli
