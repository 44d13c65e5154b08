// PyTorch profiler (Kineto) Chrome traces.
#include <fmt/format.h>

#include <cmath>
#include <map>

#include "kineto_fields.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/limits.hpp"
#include "sextant/traces/kernel_classes.hpp"
#include "sextant/traces/readers.hpp"

namespace sextant::traces {

namespace {

using spec::Json;

int64_t elem_size(const Json& args, size_t input) {
  auto it = args.find("Input type");
  if (it == args.end() || !it->is_array() || input >= it->size() || !(*it)[input].is_string())
    return 4;
  const std::string t = (*it)[input];
  if (t.find("Half") != std::string::npos || t.find("BFloat16") != std::string::npos) return 2;
  if (t == "double" || t == "long int") return 8;
  return 4;
}

std::vector<std::vector<int64_t>> dims(const Json& args) {
  std::vector<std::vector<int64_t>> out;
  auto it = args.find("Input Dims");
  if (it == args.end() || !it->is_array()) return out;
  for (const Json& d : *it) {
    std::vector<int64_t> v;
    if (d.is_array())
      for (const Json& x : d)
        if (x.is_number_integer()) v.push_back(x.get<int64_t>());
    out.push_back(v);
  }
  return out;
}

// Elements of a tensor of shape `d`; 0 for an empty, negative or absurd shape (past 2^48 elements,
// so that bytes = elements x inputs x element size stays far inside int64).
int64_t numel(const std::vector<int64_t>& d) {
  if (d.empty()) return 0;
  double n = 1;
  for (int64_t x : d) {
    if (x < 0) return 0;
    n *= static_cast<double>(x);
  }
  return n <= 0x1p48 ? static_cast<int64_t>(n) : 0;
}

// FLOPs of the GEMM ops, from their input shapes; nullopt when the shapes do not fit.
std::optional<double> gemm_flops(const std::string& name,
                                 const std::vector<std::vector<int64_t>>& d) {
  auto mnk = [](const std::vector<int64_t>& a,
                const std::vector<int64_t>& b) -> std::optional<double> {
    if (a.size() != 2 || b.size() != 2 || a[1] != b[0]) return std::nullopt;
    return 2.0 * static_cast<double>(a[0]) * static_cast<double>(b[1]) * static_cast<double>(a[1]);
  };
  auto bmnk = [](const std::vector<int64_t>& a,
                 const std::vector<int64_t>& b) -> std::optional<double> {
    if (a.size() != 3 || b.size() != 3 || a[0] != b[0] || a[2] != b[1]) return std::nullopt;
    return 2.0 * static_cast<double>(a[0]) * static_cast<double>(a[1]) * static_cast<double>(b[2]) *
           static_cast<double>(a[2]);
  };
  if (name == "aten::mm" && d.size() >= 2) return mnk(d[0], d[1]);
  if (name == "aten::addmm" && d.size() >= 3) return mnk(d[1], d[2]);
  if (name == "aten::bmm" && d.size() >= 2) return bmnk(d[0], d[1]);
  if (name == "aten::baddbmm" && d.size() >= 3) return bmnk(d[1], d[2]);
  return std::nullopt;
}

const std::map<std::string, spec::OpClass>& memory_ops() {
  static const std::map<std::string, spec::OpClass> ops = {
      {"aten::gelu", spec::OpClass::kElementwise},
      {"aten::relu", spec::OpClass::kElementwise},
      {"aten::add", spec::OpClass::kElementwise},
      {"aten::mul", spec::OpClass::kElementwise},
      {"aten::native_layer_norm", spec::OpClass::kNorm},
      {"aten::_softmax", spec::OpClass::kElementwise},
      {"aten::native_dropout", spec::OpClass::kElementwise}};
  return ops;
}

std::optional<spec::CollectiveKind> collective_named(const std::string& name) {
  static const std::map<std::string, spec::CollectiveKind> names = {
      {"all_reduce", spec::CollectiveKind::kAllReduce},
      {"allreduce", spec::CollectiveKind::kAllReduce},
      {"reduce_scatter", spec::CollectiveKind::kReduceScatter},
      {"_reduce_scatter_base", spec::CollectiveKind::kReduceScatter},
      {"all_gather", spec::CollectiveKind::kAllGather},
      {"_allgather_base", spec::CollectiveKind::kAllGather},
      {"allgather", spec::CollectiveKind::kAllGather},
      {"broadcast", spec::CollectiveKind::kBroadcast},
      {"reduce", spec::CollectiveKind::kReduce},
      {"all_to_all", spec::CollectiveKind::kAllToAll},
      {"alltoall_base", spec::CollectiveKind::kAllToAll}};
  auto it = names.find(name);
  if (it == names.end()) return std::nullopt;
  return it->second;
}

int64_t dtype_size(const std::string& t) {
  if (t == "Half" || t == "BFloat16" || t == "c10::Half" || t == "c10::BFloat16") return 2;
  if (t == "Double" || t == "Long") return 8;
  return 4;
}

// The collective an op runs: "nccl:all_reduce" (torch >= 2.0) or record_param_comms with a name;
// nullopt for other ops.
std::optional<spec::CollectiveKind> collective_op(const std::string& name, const Json& args) {
  std::string coll;
  if (name.rfind("nccl:", 0) == 0 || name.rfind("gloo:", 0) == 0) coll = name.substr(5);
  if (std::string named = kineto::text(args, "Collective name"); !named.empty()) coll = named;
  if (coll.empty()) return std::nullopt;
  return collective_named(coll);
}

// The op as a collective sample, when it is one with its sizes and group.
void add_collective(const std::string& name, const Json& args, double seconds, Samples& s) {
  std::optional<spec::CollectiveKind> kind = collective_op(name, args);
  if (!kind) return;
  const int64_t in_n = numel({kineto::integer(args, "In msg nelems").value_or(0)});
  const int64_t out_n = numel({kineto::integer(args, "Out msg nelems").value_or(0)});
  const int64_t ranks = kineto::integer(args, "Group size").value_or(0);
  std::string dtype = kineto::text(args, "dtype");
  const int64_t size = dtype_size(dtype.empty() ? "Float" : dtype);
  // nccl-tests sizes: all-gather counts the gathered output, the others their input.
  int64_t bytes = (*kind == spec::CollectiveKind::kAllGather ? out_n : in_n) * size;
  if (bytes <= 0 || ranks <= 0 || ranks > (int64_t{1} << 24)) return;
  s.comm.push_back({*kind, ranks, bytes, seconds});
}

// An event's time field ("ts" or "dur", microseconds): absent is nullopt; present, it must be a
// finite number in [0, kMaxSeconds] (a profiler never writes a negative or astronomic one: the
// file is damaged, and fitting it would poison the cluster file).
std::optional<double> event_time_us(const Json& e, const char* key, const std::string& source,
                                    size_t index) {
  auto it = e.find(key);
  if (it == e.end()) return std::nullopt;
  const std::string where = fmt::format("/traceEvents/{}/{}", index, key);
  if (!it->is_number())
    throw InputError(source, where, it->dump(), "expected a number of microseconds");
  const double us = it->get<double>();
  if (!std::isfinite(us) || us < 0 || us * 1e-6 > spec::kMaxSeconds)
    throw InputError(source, where, it->dump(),
                     fmt::format("expected microseconds in [0, {:g}]", spec::kMaxSeconds * 1e6));
  return us;
}

// Ops the reader leaves out, counted per reason, with the first one's event: said once each.
struct Skipped {
  std::map<std::string, std::pair<int64_t, size_t>> by_reason;  // reason -> (count, first event)
  void add(const std::string& reason, size_t index) {
    auto [it, fresh] = by_reason.try_emplace(reason, 0, index);
    ++it->second.first;
  }
  void report(const std::string& source, std::vector<std::string>& warnings) const {
    for (const auto& [reason, count_first] : by_reason)
      warnings.push_back(fmt::format("{}: {} op(s) left out: {} (first: /traceEvents/{})", source,
                                     count_first.first, reason, count_first.second));
  }
};

}  // namespace

Samples parse_kineto(const Json& json, const std::string& source) {
  if (!json.is_object() || !json.contains("traceEvents") || !json.at("traceEvents").is_array()) {
    throw InputError(source, "/traceEvents", "", "missing: not a Chrome/Kineto trace");
  }
  Samples s;
  s.sources.push_back(source);
  const Json& events = json.at("traceEvents");
  // Device time of the kernels each op launched, by External id.
  std::map<int64_t, double> kernel_us;
  int64_t kernels = 0;
  for (size_t index = 0; index < events.size(); ++index) {
    const Json& e = events[index];
    if (!e.is_object() || kineto::text(e, "cat") != "kernel") continue;
    ++kernels;
    (void)event_time_us(e, "ts", source, index);
    const std::optional<double> dur = event_time_us(e, "dur", source, index);
    if (!dur)
      throw InputError(source, fmt::format("/traceEvents/{}", index), "",
                       "a kernel without \"dur\"");
    const std::optional<int64_t> id = kineto::integer(kineto::args(e), "External id");
    if (id) kernel_us[*id] += *dur;
  }
  // A profile with GPU kernels times its ops by their kernels; one without timed them on the CPU.
  s.ran_on[source] = kernels > 0 ? spec::DeviceKind::kGpu : spec::DeviceKind::kCpu;
  Skipped skipped;
  for (size_t index = 0; index < events.size(); ++index) {
    const Json& e = events[index];
    if (!e.is_object() || kineto::text(e, "ph") != "X") continue;
    const std::string cat = kineto::text(e, "cat");
    if (cat != "cpu_op" && cat != "user_annotation") continue;
    const std::string name = kineto::text(e, "name");
    (void)event_time_us(e, "ts", source, index);
    const std::optional<double> dur = event_time_us(e, "dur", source, index);
    if (!dur) {
      throw InputError(source, fmt::format("/traceEvents/{}", index), "",
                       "an op without a numeric \"dur\"");
    }
    const Json& args = kineto::args(e);
    std::optional<double> us;
    if (auto id = kineto::integer(args, "External id")) {
      auto k = kernel_us.find(*id);
      if (k != kernel_us.end()) us = k->second;
    }
    if (kernels == 0) us = *dur;  // a CPU profile: the op's own time
    std::vector<std::vector<int64_t>> d = dims(args);
    const std::optional<double> flops = gemm_flops(name, d);
    const bool known =
        flops || memory_ops().count(name) > 0 || collective_op(name, args).has_value();
    if (!us) {
      // Its host time is not what the GPU spent: a launch, or an op nested around its kernels.
      if (known) skipped.add("launched no GPU kernel of its own", index);
      continue;
    }
    const double seconds = *us * 1e-6;
    if (!(seconds > 0)) {
      if (known) skipped.add("a duration of 0", index);
      continue;
    }
    if (flops) {
      if (!(*flops > 0)) {
        skipped.add("a GEMM with an empty shape", index);
        continue;
      }
      s.compute.push_back({name == "aten::bmm" || name == "aten::baddbmm"
                               ? spec::OpClass::kAttention
                               : spec::OpClass::kGemm,
                           name, *flops, 0, seconds});
      continue;
    }
    if (auto it = memory_ops().find(name); it != memory_ops().end()) {
      if (d.empty() || numel(d[0]) <= 0) {
        skipped.add("no input shape, or one past 2^48 elements", index);
        continue;
      }
      // Reads the input and writes an output of the same size (binary ops read two).
      int64_t inputs = name == "aten::add" || name == "aten::mul" ? 2 : 1;
      s.compute.push_back(
          {it->second, name, 0, (inputs + 1) * numel(d[0]) * elem_size(args, 0), seconds});
      continue;
    }
    add_collective(name, args, seconds, s);
  }
  skipped.report(source, s.warnings);
  if (s.compute.empty() && s.comm.empty()) {
    throw InputError(source, "", "",
                     "no GEMMs, memory-bound ops or collectives with shapes: record the profile "
                     "with torch.profiler.profile(record_shapes=True)");
  }
  return s;
}

Samples read_kineto(const std::string& path) {
  return parse_kineto(spec::read_json_file(path), path);
}

}  // namespace sextant::traces
