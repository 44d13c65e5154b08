// Trace writing (fast, streaming with fmt) and reading (validated) in Chrome Trace Event JSON.
#include "sextant/spec/trace.hpp"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <set>

#include "sextant/spec/gzip.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/limits.hpp"

namespace sextant::spec {

namespace {
constexpr std::array<std::pair<std::string_view, Stream>, kStreamCount> kStreams{
    {{"compute", Stream::kCompute},
     {"tp-comm", Stream::kTpComm},
     {"dp-comm", Stream::kDpComm},
     {"pp-send", Stream::kPpSend},
     {"pp-recv", Stream::kPpRecv},
     {"offload", Stream::kOffload},
     {"offload-in", Stream::kOffloadIn},
     {"depth-comm", Stream::kDepthComm},
     {"pp-send-up", Stream::kPpSendUp},
     {"pp-recv-up", Stream::kPpRecvUp}}};
constexpr std::array<std::pair<std::string_view, OpClass>, 20> kOpClasses{
    {{"gemm", OpClass::kGemm},
     {"attention", OpClass::kAttention},
     {"elementwise", OpClass::kElementwise},
     {"norm", OpClass::kNorm},
     {"embedding", OpClass::kEmbedding},
     {"loss", OpClass::kLoss},
     {"optimizer", OpClass::kOptimizer},
     {"conv", OpClass::kConv},
     {"pool", OpClass::kPool},
     {"all_reduce", OpClass::kAllReduce},
     {"reduce_scatter", OpClass::kReduceScatter},
     {"all_gather", OpClass::kAllGather},
     {"broadcast", OpClass::kBroadcast},
     {"reduce", OpClass::kReduce},
     {"all_to_all", OpClass::kAllToAll},
     {"send", OpClass::kSend},
     {"recv", OpClass::kRecv},
     {"barrier", OpClass::kBarrier},
     {"host", OpClass::kHost},
     {"memcpy", OpClass::kMemcpy}}};
constexpr std::array<std::pair<std::string_view, MemoryKernel>, 6> kMemoryKernels{
    {{"generic", MemoryKernel::kGeneric},
     {"native_norm", MemoryKernel::kNativeNorm},
     {"mixed_dtype", MemoryKernel::kMixedDtype},
     {"strided", MemoryKernel::kStrided},
     {"embedding_backward", MemoryKernel::kEmbeddingBackward},
     {"cast_transpose", MemoryKernel::kCastTranspose}}};
constexpr std::array<std::pair<std::string_view, Phase>, 5> kPhases{
    {{"fwd", Phase::kFwd},
     {"bwd", Phase::kBwd},
     {"recompute", Phase::kRecompute},
     {"opt", Phase::kOpt},
     {"none", Phase::kNone}}};
}  // namespace

EnumNames<Stream> stream_names() {
  return kStreams;
}
EnumNames<OpClass> op_class_names() {
  return kOpClasses;
}
EnumNames<MemoryKernel> memory_kernel_names() {
  return kMemoryKernels;
}
EnumNames<Phase> phase_names() {
  return kPhases;
}

bool is_communication(OpClass c) {
  switch (c) {
    case OpClass::kAllReduce:
    case OpClass::kReduceScatter:
    case OpClass::kAllGather:
    case OpClass::kBroadcast:
    case OpClass::kReduce:
    case OpClass::kAllToAll:
    case OpClass::kSend:
    case OpClass::kRecv:
    case OpClass::kBarrier:
      return true;
    default:
      return false;
  }
}

std::optional<CollectiveKind> collective_of(OpClass op_class) {
  switch (op_class) {
    case OpClass::kAllReduce:
      return CollectiveKind::kAllReduce;
    case OpClass::kReduceScatter:
      return CollectiveKind::kReduceScatter;
    case OpClass::kAllGather:
      return CollectiveKind::kAllGather;
    case OpClass::kBroadcast:
      return CollectiveKind::kBroadcast;
    case OpClass::kReduce:
      return CollectiveKind::kReduce;
    case OpClass::kAllToAll:
      return CollectiveKind::kAllToAll;
    case OpClass::kSend:
      return CollectiveKind::kSendRecv;
    default:
      return std::nullopt;
  }
}

namespace {

// Picoseconds as microseconds with six decimals: exact, and deterministic text.
void append_us(std::string& out, Picoseconds ps) {
  int64_t whole = ps / 1000000;
  int64_t frac = ps % 1000000;
  if (ps < 0 && frac != 0) {
    fmt::format_to(std::back_inserter(out), "-{}.{:06d}", -(ps / 1000000), -frac);
    return;
  }
  fmt::format_to(std::back_inserter(out), "{}.{:06d}", whole, frac);
}

void append_escaped(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", c);
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

}  // namespace

std::string trace_to_chrome_json(const Trace& trace) {
  std::string out;
  out.reserve(256 + trace.events.size() * 260);
  Json meta = trace.metadata;
  meta["kind"] = trace.kind;
  out += "{\"schema\":";
  append_escaped(out, kTraceSchema);
  out += ",\"displayTimeUnit\":\"ms\",\"otherData\":";
  out += meta.dump();
  out += ",\"traceEvents\":[\n";
  // Name every rank (pid) and stream (tid) that appears, in a stable order.
  std::set<std::pair<int64_t, int>> threads;
  std::set<int64_t> ranks;
  for (const TraceEvent& e : trace.events) {
    threads.emplace(e.rank, static_cast<int>(e.stream));
    ranks.insert(e.rank);
  }
  bool first = true;
  auto sep = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  for (int64_t rank : ranks) {
    sep();
    fmt::format_to(
        std::back_inserter(out),
        "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":"
        "\"rank {}\"}}}},\n{{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":{},"
        "\"tid\":0,\"args\":{{\"sort_index\":{}}}}}",
        rank, rank, rank, rank);
  }
  for (const auto& [rank, stream] : threads) {
    sep();
    fmt::format_to(std::back_inserter(out),
                   "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{"
                   "\"name\":\"{}\"}}}}",
                   rank, stream, enum_name(stream_names(), static_cast<Stream>(stream)));
  }
  for (const TraceEvent& e : trace.events) {
    sep();
    out += "{\"name\":";
    append_escaped(out, e.name);
    out += ",\"cat\":\"";
    out += enum_name(op_class_names(), e.op_class);
    fmt::format_to(std::back_inserter(out), "\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":", e.rank,
                   static_cast<int>(e.stream));
    append_us(out, e.start_ps);
    out += ",\"dur\":";
    append_us(out, e.duration_ps);
    out += ",\"args\":{\"op_class\":\"";
    out += enum_name(op_class_names(), e.op_class);
    out += "\",\"phase\":\"";
    out += enum_name(phase_names(), e.phase);
    out += '"';
    fmt::format_to(std::back_inserter(out), ",\"step\":{}", e.step);
    if (e.layer) fmt::format_to(std::back_inserter(out), ",\"layer\":{}", *e.layer);
    if (e.micro_batch)
      fmt::format_to(std::back_inserter(out), ",\"micro_batch\":{}", *e.micro_batch);
    if (e.flops > 0) fmt::format_to(std::back_inserter(out), ",\"flops\":{}", e.flops);
    if (e.bytes > 0) fmt::format_to(std::back_inserter(out), ",\"bytes\":{}", e.bytes);
    if (!e.shape.empty())
      fmt::format_to(std::back_inserter(out), ",\"shape\":[{}]", fmt::join(e.shape, ","));
    if (e.dtype) {
      out += ",\"dtype\":\"";
      out += enum_name(dtype_names(), *e.dtype);
      out += '"';
    }
    if (e.group_size > 0)
      fmt::format_to(std::back_inserter(out), ",\"group_size\":{}", e.group_size);
    if (!e.algorithm.empty()) {
      out += ",\"algorithm\":";
      append_escaped(out, e.algorithm);
    }
    out += "}}";
  }
  out += "\n]}\n";
  return out;
}

void write_trace_file(const std::string& path, const Trace& trace) {
  if (is_gzip_name(path)) {
    write_file_atomically(path, gzip_compress(trace_to_chrome_json(trace)));
    return;
  }
  write_file_atomically(path, trace_to_chrome_json(trace));
}

namespace {

Picoseconds read_us(ObjectReader& r, std::string_view key) {
  // Checked here, with the field named, so that the conversion's own check never fires on input.
  std::optional<double> us = r.number(key, Range{0.0, kMaxSeconds * 1e6, true, false});
  return us ? us_to_ps(*us) : 0;
}

}  // namespace

Trace trace_from_json(const Json& json, const std::string& source) {
  Diagnostics diag(source);
  ObjectReader r(json, "", diag);
  if (!r.is_object()) diag.throw_if_any();
  // A PyTorch-profiler (Kineto) trace is Chrome JSON too, without our schema: say what it is
  // instead of one problem per event (190,013 lines once).
  if (!json.contains("schema") &&
      (json.contains("deviceProperties") || json.contains("distributedInfo") ||
       json.contains("traceName") || json.contains("baseTimeNanoseconds"))) {
    throw InputError(source, "", "",
                     "this is a PyTorch-profiler (Kineto) trace, not a Sextant trace: "
                     "`sextant calibrate --kineto` and `sextant validate --kineto` read it");
  }
  Trace t;
  r.expect_schema(kTraceSchema);
  r.string("displayTimeUnit", Presence::kOptional);
  if (const Json* other = r.value("otherData", Presence::kOptional)) {
    if (other->is_object()) {
      t.metadata = *other;
      if (auto it = other->find("kind"); it != other->end() && it->is_string()) t.kind = *it;
    }
  }
  const Json* events = r.array("traceEvents");
  r.finish();
  if (events == nullptr) diag.throw_if_any();
  t.events.reserve(events->size());
  for (size_t i = 0; i < events->size(); ++i) {
    const Json& ej = (*events)[i];
    ObjectReader er = element_reader(*events, "/traceEvents", i, diag);
    if (!er.is_object()) continue;
    std::optional<std::string> ph = er.string("ph");
    if (ph && *ph == "M") continue;  // metadata: names of processes and threads
    if (ph && *ph != "X") {
      er.problem("ph", short_dump(ej.at("ph")), "expected \"X\" (complete event) or \"M\"");
      continue;
    }
    TraceEvent e;
    e.name = er.string("name").value_or("");
    er.string("cat", Presence::kOptional);
    e.rank = er.integer("pid", Range::non_negative()).value_or(0);
    int64_t tid = er.integer("tid", Range::between(0, kStreamCount - 1)).value_or(0);
    e.stream = static_cast<Stream>(tid);
    e.start_ps = read_us(er, "ts");
    e.duration_ps = read_us(er, "dur");
    if (auto args = er.object("args")) {
      e.op_class = args->enumeration("op_class", op_class_names()).value_or(OpClass::kGemm);
      e.phase = args->enumeration("phase", phase_names()).value_or(Phase::kNone);
      e.step = args->integer("step", Range::non_negative(), Presence::kOptional).value_or(0);
      e.layer = args->integer("layer", Range::non_negative(), Presence::kOptional);
      e.micro_batch = args->integer("micro_batch", Range::non_negative(), Presence::kOptional);
      e.flops = args->number("flops", Range::non_negative(), Presence::kOptional).value_or(0);
      e.bytes = args->integer("bytes", Range::non_negative(), Presence::kOptional).value_or(0);
      e.shape = args->integer_array("shape", Range::non_negative(), Presence::kOptional)
                    .value_or(std::vector<int64_t>{});
      e.dtype = args->enumeration("dtype", dtype_names(), Presence::kOptional);
      e.group_size =
          args->integer("group_size", Range::at_least(1), Presence::kOptional).value_or(0);
      e.algorithm = args->string("algorithm", Presence::kOptional).value_or("");
      args->finish();
    }
    er.finish();
    t.events.push_back(std::move(e));
  }
  diag.throw_if_any();
  return t;
}

Trace read_trace_file(const std::string& path) {
  return trace_from_json(read_json_file(path), path);
}

}  // namespace sextant::spec
