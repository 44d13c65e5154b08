// The fits, not only the readers: any measurements a reader accepts go through calibration (the
// screening, the op-level and collective fits, the cluster file written back), a profiler trace
// also through the per-class fit of a GPT-2 step, a Sextant trace through the whole checked fit of
// `sextant calibrate`. The first byte picks the reader: 'n' nccl-tests, 'k' Kineto, 't' Sextant.
// A fit must end in a cluster file that reads back (calibrate checks it) or a clear refusal.
#include "fuzz_support.hpp"
#include "sextant/loop/class_fit.hpp"
#include "sextant/loop/run_fit.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/traces/calibration.hpp"
#include "sextant/traces/kernel_classes.hpp"
#include "sextant/traces/readers.hpp"

namespace {

namespace spec = sextant::spec;
namespace traces = sextant::traces;
namespace loop = sextant::loop;

void fit_kineto(std::string_view text) {
  const spec::Json json = spec::parse_json_text(text, "fuzz.json");
  const traces::Samples s = traces::parse_kineto(json, "fuzz.json");
  const bool cpu = s.ran_on.at("fuzz.json") == spec::DeviceKind::kCpu;
  const spec::ClusterSpec base = spec::builtin_cluster(cpu ? "local-cpu" : "h100-1gpu");
  const traces::Calibration c = traces::calibrate(base, s, spec::Dtype::kBf16);
  if (cpu) return;
  // The class fit of the profiled step, as `calibrate --kineto --model --plan` runs it.
  static const spec::Plan plan = spec::plan_from_json(
      spec::Json::parse(R"({"schema": "sextant.plan/1", "micro_batch": 8, "global_batch": 8,
                            "stack": {"preset": "pytorch-fsdp", "autocast": true}})"),
      "the GPT-2 plan");
  (void)loop::fit_classes(traces::kernel_times(json, "fuzz.json"), "fuzz.json",
                          sextant::models::resolve_model("gpt2-124m"), plan, c.cluster);
}

void fit_trace(std::string_view text) {
  const spec::Trace trace =
      spec::trace_from_json(spec::parse_json_text(text, "fuzz.json"), "fuzz.json");
  loop::RunFitOptions options;
  (void)loop::fit_runs(spec::builtin_cluster("local-cpu"), {{"fuzz.json", trace}}, options);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const char reader = static_cast<char>(data[0]);
  return sextant::fuzz::expect_clear_error(data + 1, size - 1, [reader](std::string_view text) {
    if (reader == 'n') {
      const traces::Samples s =
          traces::parse_nccl_tests(std::string(text), "fuzz.txt", spec::CollectiveKind::kAllReduce);
      (void)traces::calibrate(spec::builtin_cluster("local-cpu"), s, spec::Dtype::kFp32);
    } else if (reader == 'k') {
      fit_kineto(text);
    } else if (reader == 't') {
      fit_trace(text);
    }
  });
}
