// Report: the predicted (or measured) performance of one training step of a plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sextant/spec/json_reader.hpp"

namespace sextant::spec {

// Where the step time went, seconds, seen from the critical rank. The parts add up to the step
// time (compute + every exposed communication + bubble + optimizer).
struct TimeBreakdown {
  double compute = 0;
  double tp_comm_exposed = 0;
  double dp_comm_exposed = 0;
  double pp_comm_exposed = 0;
  double fsdp_comm_exposed = 0;
  // Halo exchanges and statistic all-reduces of a spatially split CNN (Plan::spatial).
  double spatial_comm_exposed = 0;
  double cp_comm_exposed = 0;  // context parallelism's attention transfers
  double ep_comm_exposed = 0;  // expert parallelism's token dispatch and combine all-to-alls
  double bubble = 0;
  double optimizer = 0;
  // Waiting for offloaded work: device-host copies and the optimizer step on the host CPU.
  double offload_exposed = 0;
  // The GPU waiting for the host to issue its kernels (a launch-bound step; Stack::host_launch_us).
  double host_bound = 0;
};

// Peak memory of the most loaded rank, bytes, with what it is made of.
// One line of a memory explanation (simulate --explain-memory): a part of the peak (weights,
// gradients, optimizer, activations, buffers, reserved), its bytes and how they arise.
struct MemoryItem {
  std::string part;
  int64_t bytes = 0;
  std::string detail;
  bool operator==(const MemoryItem&) const = default;
};

struct MemoryBreakdown {
  int64_t peak_bytes = 0;
  int64_t capacity_bytes = 0;
  bool fits = false;
  int64_t weights = 0;
  int64_t gradients = 0;
  int64_t optimizer = 0;
  int64_t activations = 0;
  int64_t buffers = 0;
  // What the process holds beyond tensors: CUDA context and library workspaces, communicator
  // buffers, and the caching allocator's reserve.
  int64_t reserved = 0;
  int64_t headroom_bytes = 0;  // capacity - peak (negative when it does not fit)
  // Host memory the rank's offloaded state takes, and the rank's share of its node's host
  // memory (0 when nothing is offloaded); `fits` also needs the first to fit in the second.
  int64_t host_bytes = 0;
  int64_t host_capacity_bytes = 0;
  // The parts itemized, summing to peak_bytes; empty unless asked for (sim::stage_memory).
  std::vector<MemoryItem> explained;
};

struct Report {
  std::string model;
  std::string cluster;
  std::string plan;  // compact plan name
  int64_t gpus = 0;
  std::string network;  // fidelity: analytic | flow
  std::string stack;    // the software stack's preset name ("custom" for one without a preset)
  double step_time_s = 0;
  double tokens_per_s = 0;
  double samples_per_s = 0;
  double mfu = 0;  // model FLOPs (no recompute) / (step time * peak * gpus)
  double hfu = 0;  // hardware FLOPs (with recompute) / (step time * peak * gpus)
  double model_tflops_per_gpu = 0;
  double hardware_tflops_per_gpu = 0;
  TimeBreakdown breakdown_s;
  MemoryBreakdown memory;
  int64_t events = 0;
  int64_t simulated_ranks = 0;  // ranks the engine ran (symmetric copies are not re-run)
  double sim_wall_s = 0;
};

inline constexpr std::string_view kReportSchema = "sextant.report/1";

Json to_json(const Report& report);
Report report_from_json(const Json& json, const std::string& source);

}  // namespace sextant::spec
