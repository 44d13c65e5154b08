// The discrete-event engine: integer picosecond time, a priority queue of events ordered by
// (time, sequence number) so that equal times resolve deterministically, each rank's streams as
// in-order resources, tasks that start once their dependencies have completed, collectives that
// start when every member has reached them, and point-to-point transfers that start when both the
// send and the matching receive are posted.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "sextant/sim/network.hpp"
#include "sextant/sim/program.hpp"

namespace sextant::sim {

constexpr std::array<int32_t, kGroupSlots> filled_slots(int32_t value) {
  std::array<int32_t, kGroupSlots> slots{};
  slots.fill(value);
  return slots;
}

struct RankSetup {
  int32_t program = 0;  // index into the engine's programs
  // By GroupSlot (group ids; -1: the rank has no such group).
  std::array<int32_t, kGroupSlots> groups = filled_slots(-1);
  std::array<int32_t, kPeerSlots> send_channel{{-1, -1, -1, -1}};  // by PeerSlot: to prev, next
  std::array<int32_t, kPeerSlots> recv_channel{{-1, -1, -1, -1}};  // by PeerSlot: from them
  double speed = 1.0;  // compute time is divided by this
  // Ranks this one stands for in each of its groups (a folded topology, rank_symmetry.hpp).
  std::array<int32_t, kGroupSlots> group_weight = filled_slots(1);
};

// Where one rank's time went (compute-stream view); the parts add up to `finish`.
struct RankTimes {
  Picoseconds finish = 0;
  Picoseconds compute = 0;
  Picoseconds optimizer = 0;
  Picoseconds tp = 0;
  Picoseconds dp = 0;
  Picoseconds fsdp = 0;
  Picoseconds pp = 0;
  Picoseconds bubble = 0;
  Picoseconds offload = 0;  // waiting for offload copies and the host optimizer step
  Picoseconds spatial = 0;  // halo exchanges and statistic all-reduces (CommClass::kSpatial)
  Picoseconds cp = 0;       // context parallelism's attention transfers (CommClass::kCp)
  Picoseconds ep = 0;       // expert parallelism's dispatch and combine (CommClass::kEp)
  Picoseconds host = 0;     // the GPU waiting for the host to issue kernels (Task::host)
};

struct TaskRecord {
  int32_t rank = 0;
  int32_t task = 0;
  Picoseconds start = 0;
  Picoseconds end = 0;
  std::string_view algorithm;
  Picoseconds host_wait = 0;  // compute: of start..end, the GPU waiting for the host's issue
};

struct EngineResult {
  std::vector<RankTimes> ranks;
  int64_t events = 0;
  std::vector<TaskRecord> records;  // when recording was asked for
};

// Told (tasks completed, tasks in all programs) every 4096 completed tasks.
using EngineProgress = std::function<void(int64_t done, int64_t total)>;

// Runs one training step of every rank. While a communication task of a rank moves data, the
// rank's compute progresses at 1 / (1 + overlap_slowdown) of full speed (the running task is
// rescheduled when that starts and stops). With `compute_jitter` j > 0 (DeviceSpec), a collective
// over p ranks ends later by the expected wait for its last member: j * e(p) * S, S the members'
// mean time since their previous collective or receive (sync_wait.hpp). A compute task ends no
// earlier than the host's issue of its kernels allows (Task::host_critical after the host time of
// the tasks before it; host_issue.hpp). Throws InternalError on a deadlock (a program bug), naming
// the stuck ranks and tasks.
EngineResult run_engine(const std::vector<Program>& programs, const std::vector<RankSetup>& ranks,
                        const std::vector<GroupSetup>& groups,
                        const std::vector<ChannelSetup>& channels, Network& network,
                        bool record_tasks, double overlap_slowdown = 0, double compute_jitter = 0,
                        const EngineProgress& progress = {});

}  // namespace sextant::sim
