// ClusterSpec JSON decoding and validation.
#include "sextant/spec/cluster_spec.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "sextant/spec/json_io.hpp"
#include "sextant/spec/units.hpp"

namespace sextant::spec {

namespace {
constexpr std::array<std::pair<std::string_view, DeviceKind>, 2> kDeviceKinds{
    {{"gpu", DeviceKind::kGpu}, {"cpu", DeviceKind::kCpu}}};
constexpr std::array<std::pair<std::string_view, LevelScope>, 2> kScopes{
    {{"node", LevelScope::kNode}, {"cluster", LevelScope::kCluster}}};
constexpr std::array<std::pair<std::string_view, Topology>, 3> kTopologies{
    {{"switch", Topology::kSwitch},
     {"fat_tree", Topology::kFatTree},
     {"shared_memory", Topology::kSharedMemory}}};
constexpr std::array<std::pair<std::string_view, CollectiveLibrary>, 2> kLibraries{
    {{"nccl", CollectiveLibrary::kNccl}, {"mpi", CollectiveLibrary::kMpi}}};
const Range kPositiveInt = Range::at_least(1);
}  // namespace

EnumNames<DeviceKind> device_kind_names() {
  return kDeviceKinds;
}
EnumNames<LevelScope> level_scope_names() {
  return kScopes;
}
EnumNames<Topology> topology_names() {
  return kTopologies;
}
EnumNames<CollectiveLibrary> collective_library_names() {
  return kLibraries;
}

double CoRunSlowdown::at(bool matrix_op, int64_t busy) const {
  const double full = matrix_op ? matrix : memory;
  if (busy <= 1 || devices <= 1) return busy <= 1 ? 1.0 : full;
  const double share =
      std::min(1.0, static_cast<double>(busy - 1) / static_cast<double>(devices - 1));
  return 1.0 + (full - 1.0) * share;
}

double DeviceSpec::gemm_efficiency_at(double flops) const {
  SEXTANT_CHECK(!gemm_efficiency.empty(), "device {} has no GEMM efficiency curve", name);
  if (flops <= gemm_efficiency.front().flops) return gemm_efficiency.front().efficiency;
  if (flops >= gemm_efficiency.back().flops) return gemm_efficiency.back().efficiency;
  for (size_t i = 1; i < gemm_efficiency.size(); ++i) {
    const EfficiencyPoint& hi = gemm_efficiency[i];
    if (flops <= hi.flops) {
      const EfficiencyPoint& lo = gemm_efficiency[i - 1];
      double t = (std::log(flops) - std::log(lo.flops)) / (std::log(hi.flops) - std::log(lo.flops));
      return lo.efficiency + t * (hi.efficiency - lo.efficiency);
    }
  }
  return gemm_efficiency.back().efficiency;
}

std::optional<double> DeviceSpec::op_efficiency(const std::string& key, double work) const {
  auto it = efficiency_by_op.find(key);
  if (it == efficiency_by_op.end() || it->second.empty()) return std::nullopt;
  const std::vector<WorkEfficiency>& c = it->second;
  if (work <= c.front().work) return c.front().efficiency;
  for (size_t i = 1; i < c.size(); ++i) {
    if (work <= c[i].work) {
      const double t = (std::log(work) - std::log(c[i - 1].work)) /
                       (std::log(c[i].work) - std::log(c[i - 1].work));
      return c[i - 1].efficiency + t * (c[i].efficiency - c[i - 1].efficiency);
    }
  }
  return c.back().efficiency;
}

double DeviceSpec::peak_flops(Dtype dtype) const {
  auto it = peak_tflops.find(dtype);
  if (it == peak_tflops.end()) {
    std::vector<std::string_view> have;
    for (const auto& [d, v] : peak_tflops) have.push_back(enum_name(dtype_names(), d));
    throw InputError("device " + name, "/device/peak_tflops",
                     std::string(enum_name(dtype_names(), dtype)),
                     "no peak given for this dtype (the file gives " + join_names(have) + ")");
  }
  return it->second * kFlopsPerTflop;
}

std::string efficiency_key(std::string_view op_name, Phase phase) {
  std::string key(op_name);
  if (phase == Phase::kBwd) key += ":bwd";
  return key;
}

double NetworkLevel::efficiency_at(double bytes) const {
  if (message_efficiency.empty()) return 1.0;
  if (bytes <= message_efficiency.front().bytes) return message_efficiency.front().efficiency;
  if (bytes >= message_efficiency.back().bytes) return message_efficiency.back().efficiency;
  for (size_t i = 1; i < message_efficiency.size(); ++i) {
    const MessageEfficiencyPoint& hi = message_efficiency[i];
    if (bytes <= hi.bytes) {
      const MessageEfficiencyPoint& lo = message_efficiency[i - 1];
      double t = (std::log(bytes) - std::log(lo.bytes)) / (std::log(hi.bytes) - std::log(lo.bytes));
      return lo.efficiency + t * (hi.efficiency - lo.efficiency);
    }
  }
  return message_efficiency.back().efficiency;
}

double ClusterSpec::speed_factor(int64_t rank) const {
  double f = 1.0;
  int64_t node = rank / devices_per_node;
  for (const SpeedOverride& o : speed_overrides) {
    if ((o.node && *o.node == node) || (o.rank && *o.rank == rank)) f *= o.factor;
  }
  return f;
}

namespace {

DeviceSpec decode_device(ObjectReader& r) {
  DeviceSpec d;
  d.name = r.string("name").value_or("");
  d.kind = r.enumeration("kind", device_kind_names()).value_or(d.kind);
  if (auto peaks = r.object("peak_tflops")) {
    for (const auto& [dtype, name] :
         std::array<std::pair<Dtype, std::string_view>, 5>{{{Dtype::kFp32, "fp32"},
                                                            {Dtype::kTf32, "tf32"},
                                                            {Dtype::kBf16, "bf16"},
                                                            {Dtype::kFp16, "fp16"},
                                                            {Dtype::kFp8, "fp8"}}}) {
      if (auto v = peaks->number(name, Range::positive(), Presence::kOptional))
        d.peak_tflops[dtype] = *v;
    }
    peaks->finish();
    if (peaks->diagnostics().ok() && d.peak_tflops.empty())
      peaks->problem("", "{}", "must give the peak of at least one dtype (fp32, bf16, ...)");
  }
  d.memory_bandwidth_GBps = r.number("memory_bandwidth_GBps", Range::positive()).value_or(1);
  d.memory_capacity_bytes = r.integer("memory_capacity_bytes", kPositiveInt).value_or(1);
  d.launch_overhead_us = r.number("launch_overhead_us", Range::non_negative()).value_or(0);
  d.step_overhead_us =
      r.number("step_overhead_us", Range::non_negative(), Presence::kOptional).value_or(0);
  d.memory_efficiency = r.number("memory_efficiency", Range::fraction()).value_or(1);
  if (auto by = r.object("memory_efficiency_by_class", Presence::kOptional)) {
    for (const auto& [name, cls] : op_class_names()) {
      if (is_communication(cls)) continue;
      if (auto v = by->number(name, Range::fraction(), Presence::kOptional))
        d.memory_efficiency_by_class[cls] = *v;
    }
    by->finish();
  }
  if (auto by = r.object("memory_efficiency_by_kernel", Presence::kOptional)) {
    for (const auto& [name, kernel] : memory_kernel_names()) {
      if (kernel == MemoryKernel::kGeneric) continue;
      if (auto v = by->number(name, Range::fraction(), Presence::kOptional))
        d.memory_efficiency_by_kernel[kernel] = *v;
    }
    by->finish();
  }
  d.block_bandwidth_GBps =
      r.number("block_bandwidth_GBps", Range::positive(), Presence::kOptional).value_or(0);
  if (auto by = r.object("efficiency_by_op", Presence::kOptional)) {
    const Json* raw = r.value("efficiency_by_op", Presence::kOptional);
    for (const auto& [name, v] : raw->items()) {
      if (!v.is_array()) {
        if (auto e = by->number(name, Range::fraction())) d.efficiency_by_op[name] = {{1, *e}};
        continue;
      }
      const Json* curve = by->array(name);
      const std::string base = pointer_join(by->pointer(), name);
      std::vector<WorkEfficiency>& points = d.efficiency_by_op[name];
      for (size_t i = 0; i < curve->size(); ++i) {
        ObjectReader p = element_reader(*curve, base, i, r.diagnostics());
        WorkEfficiency e;
        e.work = p.number("work", Range::positive()).value_or(1);
        e.efficiency = p.number("efficiency", Range::fraction()).value_or(1);
        p.finish();
        if (!points.empty() && e.work <= points.back().work)
          p.problem("work", fmt::format("{}", e.work), "points must be in increasing work order");
        points.push_back(e);
      }
      if (curve->empty()) by->problem(name, "[]", "needs at least one point");
    }
    by->finish();
  }
  if (const Json* curve = r.array("gemm_efficiency")) {
    std::string base = pointer_join(r.pointer(), "gemm_efficiency");
    for (size_t i = 0; i < curve->size(); ++i) {
      ObjectReader p = element_reader(*curve, base, i, r.diagnostics());
      EfficiencyPoint e;
      e.flops = p.number("flops", Range::positive()).value_or(1);
      e.efficiency = p.number("efficiency", Range::fraction()).value_or(1);
      p.finish();
      if (!d.gemm_efficiency.empty() && e.flops <= d.gemm_efficiency.back().flops) {
        p.problem("flops", fmt::format("{}", e.flops), "points must be in increasing flops order");
      }
      d.gemm_efficiency.push_back(e);
    }
    if (curve->empty()) r.problem("gemm_efficiency", "[]", "needs at least one point");
  }
  if (auto g = r.object("gemm_model", Presence::kOptional)) d.gemm_model = decode_gemm_model(*g);
  if (auto a = r.object("attention_kernels", Presence::kOptional))
    d.attention_kernels = decode_attention_kernels(*a);
  if (auto p = r.object("power", Presence::kOptional)) d.power = decode_power_model(*p);
  const std::string gemm_clock = pointer_join(pointer_join(r.pointer(), "gemm_model"), "clock_MHz");
  if (d.gemm_model && d.power && d.gemm_model->clock_MHz > 0)
    r.diagnostics().add(gemm_clock, fmt::format("{}", d.gemm_model->clock_MHz),
                        "must be left out when the device has a power object (the power model "
                        "decides the clock)");
  if (d.gemm_model && !d.power && d.gemm_model->clock_MHz <= 0)
    r.diagnostics().add(gemm_clock, "(missing)", "is required when the device has no power object");
  d.runtime_reserved_bytes =
      r.integer("runtime_reserved_bytes", Range::non_negative(), Presence::kOptional).value_or(0);
  d.overlap_slowdown =
      r.number("overlap_slowdown", Range::between(0, 1), Presence::kOptional).value_or(0);
  d.compute_jitter =
      r.number("compute_jitter", Range::between(0, 1), Presence::kOptional).value_or(0);
  if (auto c = r.object("co_run", Presence::kOptional)) {
    CoRunSlowdown co;
    co.devices = c->integer("devices", Range::at_least(2)).value_or(2);
    // Sharing slows a core down, never up; 10x would be a measurement gone wrong.
    co.matrix = c->number("matrix", Range::between(1, 10)).value_or(1);
    co.memory = c->number("memory", Range::between(1, 10)).value_or(1);
    co.source = c->string("source").value_or("");
    c->finish();
    d.co_run = co;
  }
  d.host_cpu = r.string("host_cpu", Presence::kOptional).value_or("");
  d.peak_measured = r.boolean("peak_measured", Presence::kOptional).value_or(false);
  d.source = r.string("source").value_or("");
  r.finish();
  return d;
}

NetworkLevel decode_level(ObjectReader& r) {
  NetworkLevel l;
  l.name = r.string("name").value_or("");
  l.scope = r.enumeration("scope", level_scope_names()).value_or(l.scope);
  l.bandwidth_GBps = r.number("bandwidth_GBps", Range::positive()).value_or(1);
  l.latency_us = r.number("latency_us", Range::non_negative()).value_or(0);
  l.topology = r.enumeration("topology", topology_names()).value_or(l.topology);
  if (l.scope == LevelScope::kCluster) {
    l.nics_per_node = r.integer("nics_per_node", kPositiveInt).value_or(1);
    l.oversubscription =
        r.number("oversubscription", Range::at_least(1), Presence::kOptional).value_or(1);
  }
  if (const Json* curve = r.array("message_efficiency", Presence::kOptional)) {
    std::string base = pointer_join(r.pointer(), "message_efficiency");
    for (size_t i = 0; i < curve->size(); ++i) {
      ObjectReader p = element_reader(*curve, base, i, r.diagnostics());
      MessageEfficiencyPoint e;
      e.bytes = p.number("bytes", Range::positive()).value_or(1);
      e.efficiency = p.number("efficiency", Range::fraction()).value_or(1);
      p.finish();
      if (!l.message_efficiency.empty() && e.bytes <= l.message_efficiency.back().bytes)
        p.problem("bytes", fmt::format("{}", e.bytes), "points must be in increasing bytes order");
      l.message_efficiency.push_back(e);
    }
  }
  l.source = r.string("source").value_or("");
  r.finish();
  return l;
}

NetworkSpec decode_network(ObjectReader& r) {
  NetworkSpec n;
  n.library = r.enumeration("library", collective_library_names()).value_or(n.library);
  n.reduction_GBps = r.number("reduction_GBps", Range::positive()).value_or(1);
  n.communicator_buffer_bytes =
      r.integer("communicator_buffer_bytes", Range::non_negative(), Presence::kOptional)
          .value_or(0);
  n.source = r.string("source", Presence::kOptional).value_or("");
  if (const Json* levels = r.array("levels")) {
    std::string base = pointer_join(r.pointer(), "levels");
    for (size_t i = 0; i < levels->size(); ++i) {
      ObjectReader lr = element_reader(*levels, base, i, r.diagnostics());
      n.levels.push_back(decode_level(lr));
    }
    if (r.diagnostics().ok()) {
      if (n.levels.empty() || n.levels.size() > 2) {
        r.problem("levels", fmt::format("{} levels", n.levels.size()),
                  "must list one level inside a node and at most one across nodes");
      } else if (n.levels[0].scope != LevelScope::kNode) {
        r.diagnostics().add(pointer_join(pointer_join(base, 0), "scope"), "\"cluster\"",
                            "the first level must have scope \"node\"");
      } else if (n.levels.size() == 2 && n.levels[1].scope != LevelScope::kCluster) {
        r.diagnostics().add(pointer_join(pointer_join(base, 1), "scope"), "\"node\"",
                            "the second level must have scope \"cluster\"");
      }
    }
  }
  r.finish();
  return n;
}

HostSpec decode_host(ObjectReader& r) {
  HostSpec h;
  h.memory_bytes = r.integer("memory_bytes", kPositiveInt).value_or(1);
  h.memory_bandwidth_GBps = r.number("memory_bandwidth_GBps", Range::positive()).value_or(1);
  h.memory_efficiency =
      r.number("memory_efficiency", Range::fraction(), Presence::kOptional).value_or(1);
  h.pcie_bandwidth_GBps = r.number("pcie_bandwidth_GBps", Range::positive()).value_or(1);
  h.nvme_bandwidth_GBps =
      r.number("nvme_bandwidth_GBps", Range::non_negative(), Presence::kOptional).value_or(0);
  h.source = r.string("source").value_or("");
  r.finish();
  return h;
}

}  // namespace

ClusterSpec cluster_from_json(const Json& json, const std::string& source) {
  Diagnostics diag(source);
  ObjectReader r(json, "", diag);
  if (!r.is_object()) diag.throw_if_any();
  ClusterSpec c;
  r.expect_schema(kClusterSchema);
  c.name = r.string("name").value_or("");
  c.description = r.string("description", Presence::kOptional).value_or("");
  c.nodes = r.integer("nodes", kPositiveInt).value_or(1);
  c.devices_per_node = r.integer("devices_per_node", kPositiveInt).value_or(1);
  if (auto d = r.object("device")) c.device = decode_device(*d);
  if (auto n = r.object("network")) c.network = decode_network(*n);
  if (auto h = r.object("host", Presence::kOptional)) c.host = decode_host(*h);
  if (auto o = r.object("overrides", Presence::kOptional)) {
    if (const Json* speed = o->array("speed", Presence::kOptional)) {
      std::string base = pointer_join(o->pointer(), "speed");
      for (size_t i = 0; i < speed->size(); ++i) {
        ObjectReader s = element_reader(*speed, base, i, diag);
        SpeedOverride so;
        so.node = s.integer("node", Range::non_negative(), Presence::kOptional);
        so.rank = s.integer("rank", Range::non_negative(), Presence::kOptional);
        so.factor = s.number("factor", Range::positive()).value_or(1);
        s.finish();
        if (so.node.has_value() == so.rank.has_value())
          s.problem("", "", "give exactly one of \"node\" or \"rank\"");
        if (so.node && *so.node >= c.nodes)
          s.problem("node", std::to_string(*so.node), fmt::format("must be < nodes ({})", c.nodes));
        if (so.rank && *so.rank >= c.total_devices())
          s.problem("rank", std::to_string(*so.rank),
                    fmt::format("must be < nodes*devices_per_node ({})", c.total_devices()));
        c.speed_overrides.push_back(so);
      }
    }
    if (const Json* links = o->array("links", Presence::kOptional)) {
      std::string base = pointer_join(o->pointer(), "links");
      for (size_t i = 0; i < links->size(); ++i) {
        ObjectReader s = element_reader(*links, base, i, diag);
        LinkOverride lo;
        lo.level = s.string("level").value_or("");
        lo.node = s.integer("node", Range::non_negative()).value_or(0);
        lo.nic = s.integer("nic", Range::non_negative(), Presence::kOptional);
        lo.factor = s.number("factor", Range::positive()).value_or(1);
        s.finish();
        bool found = false;
        for (const NetworkLevel& l : c.network.levels) found = found || l.name == lo.level;
        if (!found && diag.ok()) {
          std::vector<std::string_view> names;
          for (const NetworkLevel& l : c.network.levels) names.push_back(l.name);
          s.problem("level", short_dump(Json(lo.level)),
                    "must name a network level (" + join_names(names) + ")");
        }
        if (lo.node >= c.nodes)
          s.problem("node", std::to_string(lo.node), fmt::format("must be < nodes ({})", c.nodes));
        c.link_overrides.push_back(lo);
      }
    }
    o->finish();
  }
  if (const Json* fits = r.array("collective_fits", Presence::kOptional)) {
    for (size_t i = 0; i < fits->size(); ++i) {
      ObjectReader f = element_reader(*fits, "/collective_fits", i, diag);
      CollectiveFit cf;
      cf.collective = f.string("collective").value_or("");
      cf.level = f.string("level").value_or("");
      cf.max_bytes = f.integer("max_bytes", Range::non_negative(), Presence::kOptional).value_or(0);
      cf.alpha_us = f.number("alpha_us", Range::non_negative()).value_or(0);
      cf.beta_us_per_byte = f.number("beta_us_per_byte", Range::positive()).value_or(1);
      cf.r2 = f.number("r2", Range::any(), Presence::kOptional).value_or(0);
      cf.samples = f.integer("samples", Range::non_negative(), Presence::kOptional).value_or(0);
      f.finish();
      c.collective_fits.push_back(cf);
    }
  }
  if (const Json* cal = r.value("calibrated_from", Presence::kOptional)) c.calibrated_from = *cal;
  r.finish();
  if (diag.ok() && c.nodes > 1 && c.network.cluster_level() == nullptr) {
    diag.add("/network/levels", "",
             "a cluster with nodes > 1 needs a level with scope \"cluster\"");
  }
  diag.throw_if_any();
  return c;
}

Json to_json(const ClusterSpec& c) {
  Json peaks = Json::object();
  for (const auto& [dtype, v] : c.device.peak_tflops) peaks[enum_name(dtype_names(), dtype)] = v;
  Json curve = Json::array();
  for (const EfficiencyPoint& p : c.device.gemm_efficiency)
    curve.push_back({{"flops", p.flops}, {"efficiency", p.efficiency}});
  Json levels = Json::array();
  for (const NetworkLevel& l : c.network.levels) {
    Json lj = {{"name", l.name},
               {"scope", enum_name(level_scope_names(), l.scope)},
               {"bandwidth_GBps", l.bandwidth_GBps},
               {"latency_us", l.latency_us},
               {"topology", enum_name(topology_names(), l.topology)}};
    if (l.scope == LevelScope::kCluster) {
      lj["nics_per_node"] = l.nics_per_node;
      lj["oversubscription"] = l.oversubscription;
    }
    if (!l.message_efficiency.empty()) {
      Json points = Json::array();
      for (const MessageEfficiencyPoint& p : l.message_efficiency)
        points.push_back({{"bytes", p.bytes}, {"efficiency", p.efficiency}});
      lj["message_efficiency"] = points;
    }
    lj["source"] = l.source;
    levels.push_back(lj);
  }
  Json j = {{"schema", kClusterSchema}, {"name", c.name}};
  if (!c.description.empty()) j["description"] = c.description;
  j["nodes"] = c.nodes;
  j["devices_per_node"] = c.devices_per_node;
  j["device"] = {{"name", c.device.name},
                 {"kind", enum_name(device_kind_names(), c.device.kind)},
                 {"peak_tflops", peaks},
                 {"memory_bandwidth_GBps", c.device.memory_bandwidth_GBps},
                 {"memory_capacity_bytes", c.device.memory_capacity_bytes},
                 {"launch_overhead_us", c.device.launch_overhead_us},
                 {"gemm_efficiency", curve},
                 {"memory_efficiency", c.device.memory_efficiency},
                 {"source", c.device.source}};
  if (!c.device.memory_efficiency_by_class.empty()) {
    Json by = Json::object();
    for (const auto& [cls, v] : c.device.memory_efficiency_by_class)
      by[std::string(enum_name(op_class_names(), cls))] = v;
    j["device"]["memory_efficiency_by_class"] = by;
  }
  if (!c.device.memory_efficiency_by_kernel.empty()) {
    Json by = Json::object();
    for (const auto& [kernel, v] : c.device.memory_efficiency_by_kernel)
      by[std::string(enum_name(memory_kernel_names(), kernel))] = v;
    j["device"]["memory_efficiency_by_kernel"] = by;
  }
  if (c.device.block_bandwidth_GBps > 0)
    j["device"]["block_bandwidth_GBps"] = c.device.block_bandwidth_GBps;
  if (!c.device.efficiency_by_op.empty()) {
    Json by = Json::object();
    for (const auto& [key, points] : c.device.efficiency_by_op) {
      if (points.size() == 1) {
        by[key] = points[0].efficiency;
        continue;
      }
      Json op_curve = Json::array();
      for (const WorkEfficiency& p : points)
        op_curve.push_back({{"work", p.work}, {"efficiency", p.efficiency}});
      by[key] = op_curve;
    }
    j["device"]["efficiency_by_op"] = by;
  }
  if (c.device.gemm_model) j["device"]["gemm_model"] = to_json(*c.device.gemm_model);
  if (c.device.power) j["device"]["power"] = to_json(*c.device.power);
  if (!c.device.attention_kernels.empty())
    j["device"]["attention_kernels"] = to_json(c.device.attention_kernels);
  if (c.device.step_overhead_us > 0) j["device"]["step_overhead_us"] = c.device.step_overhead_us;
  if (c.device.runtime_reserved_bytes > 0)
    j["device"]["runtime_reserved_bytes"] = c.device.runtime_reserved_bytes;
  if (c.device.overlap_slowdown > 0) j["device"]["overlap_slowdown"] = c.device.overlap_slowdown;
  if (c.device.compute_jitter > 0) j["device"]["compute_jitter"] = c.device.compute_jitter;
  if (c.device.co_run)
    j["device"]["co_run"] = {{"devices", c.device.co_run->devices},
                             {"matrix", c.device.co_run->matrix},
                             {"memory", c.device.co_run->memory},
                             {"source", c.device.co_run->source}};
  if (!c.device.host_cpu.empty()) j["device"]["host_cpu"] = c.device.host_cpu;
  if (c.device.peak_measured) j["device"]["peak_measured"] = true;
  Json network = {{"library", enum_name(collective_library_names(), c.network.library)},
                  {"reduction_GBps", c.network.reduction_GBps},
                  {"levels", levels}};
  if (c.network.communicator_buffer_bytes > 0)
    network["communicator_buffer_bytes"] = c.network.communicator_buffer_bytes;
  if (!c.network.source.empty()) network["source"] = c.network.source;
  j["network"] = network;
  if (c.host) {
    j["host"] = {{"memory_bytes", c.host->memory_bytes},
                 {"memory_bandwidth_GBps", c.host->memory_bandwidth_GBps},
                 {"memory_efficiency", c.host->memory_efficiency},
                 {"pcie_bandwidth_GBps", c.host->pcie_bandwidth_GBps},
                 {"source", c.host->source}};
    if (c.host->nvme_bandwidth_GBps > 0)
      j["host"]["nvme_bandwidth_GBps"] = c.host->nvme_bandwidth_GBps;
  }
  if (!c.speed_overrides.empty() || !c.link_overrides.empty()) {
    Json speed = Json::array();
    for (const SpeedOverride& s : c.speed_overrides) {
      Json sj = {{"factor", s.factor}};
      if (s.node) sj["node"] = *s.node;
      if (s.rank) sj["rank"] = *s.rank;
      speed.push_back(sj);
    }
    Json links = Json::array();
    for (const LinkOverride& l : c.link_overrides) {
      Json lj = {{"level", l.level}, {"node", l.node}, {"factor", l.factor}};
      if (l.nic) lj["nic"] = *l.nic;
      links.push_back(lj);
    }
    j["overrides"] = {{"speed", speed}, {"links", links}};
  }
  if (!c.collective_fits.empty()) {
    Json fits = Json::array();
    for (const CollectiveFit& f : c.collective_fits) {
      Json fj = {{"collective", f.collective},
                 {"level", f.level},
                 {"alpha_us", f.alpha_us},
                 {"beta_us_per_byte", f.beta_us_per_byte},
                 {"r2", f.r2},
                 {"samples", f.samples}};
      if (f.max_bytes > 0) fj["max_bytes"] = f.max_bytes;
      fits.push_back(fj);
    }
    j["collective_fits"] = fits;
  }
  if (c.calibrated_from) j["calibrated_from"] = *c.calibrated_from;
  return j;
}

ClusterSpec read_cluster_file(const std::string& path) {
  return cluster_from_json(read_json_file(path), path);
}

}  // namespace sextant::spec
