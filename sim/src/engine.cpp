// The event loop.
#include "sextant/sim/engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>

#include "sextant/sim/sync_wait.hpp"

namespace sextant::sim {

namespace {

// kNetworkWake: a network that finishes work later (the flow model) has something to do.
enum class EventType : uint8_t { kTaskDone, kGroupDone, kChannelDone, kNetworkWake };

// A pending event. Times only grow in a discrete-event simulation, which lets a radix heap
// (Ahuja, Mehlhorn, Orlin & Tarjan 1990) replace a comparison heap: events sit in buckets by the
// highest bit in which their time differs from the last time popped, so a push is O(1) and each
// event moves down at most 64 buckets in its life, with none of the unpredictable branches of a
// binary heap (they were most of the engine's time). Equal times pop in a fixed order, so the
// simulation is deterministic.
struct Event {
  Picoseconds time;
  uint32_t packed;  // type (2 bits) | stream (3 bits) | rank, group or channel (27 bits)
  EventType type() const { return static_cast<EventType>(packed >> 30); }
  int b() const { return static_cast<int>((packed >> 27) & 7u); }
  int32_t a() const { return static_cast<int32_t>(packed & ((1u << 27) - 1)); }
};

class EventQueue {
 public:
  bool empty() const { return size_ == 0; }
  Picoseconds top_time() {
    settle();
    return buckets_[0][head_].time;
  }
  void push(const Event& e) {
    SEXTANT_CHECK(e.time >= last_, "event at {} ps before the current time {} ps", e.time, last_);
    buckets_[bucket_of(e.time)].push_back(e);
    ++size_;
  }
  Event pop() {
    settle();
    --size_;
    return buckets_[0][head_++];
  }

 private:
  size_t bucket_of(Picoseconds t) const {
    return static_cast<size_t>(
        std::bit_width(static_cast<uint64_t>(t) ^ static_cast<uint64_t>(last_)));
  }
  // Makes bucket 0 hold the events of the smallest pending time.
  void settle() {
    if (head_ < buckets_[0].size()) return;
    buckets_[0].clear();
    head_ = 0;
    size_t i = 1;
    while (buckets_[i].empty()) ++i;
    Picoseconds least = buckets_[i][0].time;
    for (const Event& e : buckets_[i]) least = std::min(least, e.time);
    last_ = least;
    std::vector<Event> moving;
    moving.swap(buckets_[i]);
    for (const Event& e : moving) buckets_[bucket_of(e.time)].push_back(e);
    moving.clear();
    buckets_[i].swap(moving);  // keep the capacity
  }

  std::array<std::vector<Event>, 65> buckets_;
  size_t head_ = 0;
  size_t size_ = 0;
  Picoseconds last_ = 0;
};

struct StreamState {
  int32_t next = 0;       // index into the program's stream list
  int32_t completed = 0;  // tasks completed on this stream
  bool busy = false;
  int8_t blocked_on = -1;  // the stream the head task waits for
  Picoseconds started = 0;
};

struct HotProgram;

struct RankState {
  const HotProgram* hot = nullptr;
  std::array<StreamState, spec::kStreamCount> streams;
  Picoseconds compute_free_since = 0;
  // Overlap slowdown: transfers of this rank moving data now; the running compute task's work
  // left (in ps at full speed) as of `rate_since`, and when it will end at the current rate
  // (-1: none; a completion event at another time is stale).
  int32_t active_transfers = 0;
  double work_left = 0;
  Picoseconds rate_since = 0;
  Picoseconds compute_end = -1;
  // The running compute task's end by its GPU work alone, and the earliest its host issue lets it
  // end (host_issue.hpp); compute_end is the later.
  Picoseconds compute_work_end = -1;
  Picoseconds compute_floor = 0;
  Picoseconds last_end = 0;
  Picoseconds last_sync = 0;  // when the rank's last collective or receive ended
  CommClass last_class = CommClass::kNone;
  RankTimes times;
};

struct GroupState {
  int32_t arrived = 0;
  int64_t bytes = 0;
  spec::CollectiveKind kind = spec::CollectiveKind::kAllReduce;
  spec::Stream stream = spec::Stream::kTpComm;
  Picoseconds start = 0;
  std::string_view algorithm;
  Picoseconds segments = 0;  // sum over arrived members of their time since their last collective
  Picoseconds wait = 0;      // expected wait for the last member, added after the transfer
  bool waiting = false;      // the transfer is over; the members wait out `wait`
};

struct ChannelState {
  bool send_posted = false;
  bool recv_posted = false;
  int64_t bytes = 0;
  Picoseconds start = 0;
  std::string_view algorithm;
};

// What made a rank's compute stream able to go on, for the time breakdown.
struct Trigger {
  CommClass cls = CommClass::kNone;
  Picoseconds transfer = 0;  // pp: duration of the transfer that completed
};

// The engine's view of a task: 32 bytes, stored per stream in execution order, so that each rank
// walks its streams through contiguous memory (the engine is bound by memory latency: a thousand
// ranks at a thousand places of their programs).
// A dependency packs its stream above the count: 4 bits for spec::kStreamCount streams.
constexpr int kDepStreamShift = 28;
static_assert(spec::kStreamCount <= (1 << (32 - kDepStreamShift)));

struct HotTask {
  static constexpr uint32_t kNoDep = ~0u;
  int64_t value = 0;  // compute: duration; communication: bytes
  // stream << kDepStreamShift | count; at most one per other stream (the builder merges them)
  std::array<uint32_t, 4> deps{kNoDep, kNoDep, kNoDep, kNoDep};
  int32_t id = 0;  // index into Program::tasks
  TaskKind kind = TaskKind::kCompute;
  CommClass comm_class = CommClass::kNone;
  uint8_t slot = 0;
  uint8_t flags = 0;  // bit 0: optimizer; bits 1-3: collective kind
  bool optimizer() const { return (flags & 1u) != 0; }
  spec::CollectiveKind collective() const { return static_cast<spec::CollectiveKind>(flags >> 1); }
};
static_assert(sizeof(HotTask) == 32);

struct HotProgram {
  std::array<std::vector<HotTask>, spec::kStreamCount> streams;
  // By task id: the earliest a compute task can end for the host's issue of the step's kernels,
  // the host issuing every task in program order without waiting for the GPU (host_issue.hpp);
  // empty when no task has host time.
  std::vector<Picoseconds> host_floor;
};

HotProgram compact(const Program& p) {
  HotProgram h;
  for (int s = 0; s < spec::kStreamCount; ++s) {
    for (int32_t id : p.streams[static_cast<size_t>(s)]) {
      const Task& t = p.tasks[static_cast<size_t>(id)];
      HotTask ht;
      ht.value = t.kind == TaskKind::kCompute || t.kind == TaskKind::kLocal ? t.duration : t.bytes;
      SEXTANT_CHECK(t.dep_end - t.dep_begin <= 4, "task {} has {} dependencies (at most 4)", id,
                    t.dep_end - t.dep_begin);
      for (int32_t d = t.dep_begin; d < t.dep_end; ++d) {
        const Dep& dep = p.deps[static_cast<size_t>(d)];
        SEXTANT_CHECK(dep.count < (1 << kDepStreamShift), "too many tasks on one stream");
        ht.deps[static_cast<size_t>(d - t.dep_begin)] =
            static_cast<uint32_t>(dep.stream) << kDepStreamShift | static_cast<uint32_t>(dep.count);
      }
      ht.id = id;
      ht.kind = t.kind;
      ht.comm_class = t.comm_class;
      ht.slot = t.slot;
      ht.flags =
          static_cast<uint8_t>((t.optimizer ? 1u : 0u) | static_cast<uint32_t>(t.collective) << 1);
      h.streams[static_cast<size_t>(s)].push_back(ht);
    }
  }
  // The host starts issuing each task once it has issued every task before it in the program.
  Picoseconds issued = 0;
  for (const Task& t : p.tasks) {
    if (t.host > 0 && h.host_floor.empty()) h.host_floor.assign(p.tasks.size(), 0);
    if (!h.host_floor.empty() && t.kind == TaskKind::kCompute && t.host_critical >= 0)
      h.host_floor[static_cast<size_t>(&t - p.tasks.data())] = issued + t.host_critical;
    issued += t.host;
  }
  return h;
}

class Engine {
 public:
  Engine(const std::vector<Program>& programs, const std::vector<RankSetup>& ranks,
         const std::vector<GroupSetup>& groups, const std::vector<ChannelSetup>& channels,
         Network& network, bool record, double overlap_slowdown, double compute_jitter,
         const EngineProgress& progress)
      : progress_(progress),
        overlap_slowdown_(overlap_slowdown),
        compute_jitter_(compute_jitter),
        programs_(programs),
        setups_(ranks),
        group_setups_(groups),
        channel_setups_(channels),
        network_(network),
        record_(record),
        ranks_(ranks.size()),
        groups_(groups.size()),
        channels_(channels.size()) {
    for (const Program& p : programs) hot_.push_back(compact(p));
    for (size_t r = 0; r < ranks.size(); ++r)
      ranks_[r].hot = &hot_[static_cast<size_t>(ranks[r].program)];
    if (progress_) {
      for (size_t r = 0; r < ranks.size(); ++r)
        tasks_total_ += std::ssize(program(static_cast<int32_t>(r)).tasks);
    }
    if (record_) {
      starts_.resize(ranks.size());
      for (size_t r = 0; r < ranks.size(); ++r)
        starts_[r].resize(program(static_cast<int32_t>(r)).tasks.size());
    }
  }

  EngineResult run() {
    for (size_t r = 0; r < ranks_.size(); ++r) try_start(static_cast<int32_t>(r), 0, Trigger{});
    schedule_network_wake();
    while (!queue_.empty()) {
      Event e = queue_.pop();
      ++events_;
      switch (e.type()) {
        case EventType::kTaskDone:
          task_done(e.a(), static_cast<spec::Stream>(e.b()), e.time);
          break;
        case EventType::kGroupDone:
          group_done(e.a(), e.time);
          break;
        case EventType::kChannelDone:
          channel_done(e.a(), e.time);
          break;
        case EventType::kNetworkWake:
          network_wake(e.time);
          break;
      }
      schedule_network_wake();
    }
    check_finished();
    EngineResult result;
    result.events = events_;
    for (RankState& rs : ranks_) {
      RankTimes t = rs.times;
      t.finish = rs.last_end;
      // The compute stream's idle tail (waiting for the last collective) counts as that
      // collective's class.
      Picoseconds tail = std::max<Picoseconds>(0, t.finish - rs.compute_free_since);
      account(t, Trigger{rs.last_class, 0}, tail);
      result.ranks.push_back(t);
    }
    result.records = std::move(records_);
    return result;
  }

 private:
  const Program& program(int32_t rank) const {
    return programs_[static_cast<size_t>(setups_[static_cast<size_t>(rank)].program)];
  }

  // Keeps one wake-up in the queue at the network's next event (earlier wakes that turn out
  // early, because flows slowed down, find nothing to do and reschedule).
  void schedule_network_wake() {
    std::optional<Picoseconds> next = network_.next_event();
    if (next && (!wake_ || *next < *wake_)) {
      wake_ = next;
      push(*next, EventType::kNetworkWake, 0);
    }
  }

  void network_wake(Picoseconds now) {
    if (wake_ && *wake_ == now) wake_.reset();
    std::optional<Picoseconds> next = network_.next_event();
    if (!next || *next > now) return;
    finished_.clear();
    network_.advance(now, finished_);
    for (const Completion& c : finished_) {
      if (c.transfer) {
        channel_done(c.id, now);
      } else {
        group_done(c.id, now);
      }
    }
  }

  void push(Picoseconds time, EventType type, int32_t a, int32_t b = 0) {
    SEXTANT_CHECK(a < (1 << 27), "more than 2^27 ranks, groups or channels");
    uint32_t packed = static_cast<uint32_t>(type) << 30 | static_cast<uint32_t>(b) << 27 |
                      static_cast<uint32_t>(a);
    queue_.push(Event{time, packed});
  }

  static void account(RankTimes& t, Trigger trigger, Picoseconds idle) {
    if (idle <= 0) return;
    switch (trigger.cls) {
      case CommClass::kTp:
        t.tp += idle;
        break;
      case CommClass::kDp:
        t.dp += idle;
        break;
      case CommClass::kFsdp:
        t.fsdp += idle;
        break;
      case CommClass::kPp: {
        // Waiting on a receive: the transfer itself is communication, the rest is the peer
        // not having produced it yet (the pipeline bubble).
        Picoseconds comm = std::min(idle, trigger.transfer);
        t.pp += comm;
        t.bubble += idle - comm;
        break;
      }
      case CommClass::kSpatial:
        t.spatial += idle;
        break;
      case CommClass::kCp:
        t.cp += idle;
        break;
      case CommClass::kEp:
        t.ep += idle;
        break;
      case CommClass::kOffload:
        t.offload += idle;
        break;
      case CommClass::kNone:
        t.bubble += idle;
        break;
    }
  }

  // Overlap model (Lee et al., arXiv:2507.03114: compute runs 18.9% slower on average while
  // collectives run beside it): while at least one transfer of a rank moves data, its compute
  // progresses at 1 / (1 + overlap_slowdown) of full speed. A change of rate reschedules the
  // running compute task's completion.
  double compute_stretch(const RankState& rs) const {
    return rs.active_transfers > 0 ? 1.0 + overlap_slowdown_ : 1.0;
  }

  void change_transfers(int32_t rank, int32_t delta, Picoseconds now) {
    if (overlap_slowdown_ <= 0) return;
    RankState& rs = ranks_[static_cast<size_t>(rank)];
    const double before = compute_stretch(rs);
    rs.active_transfers += delta;
    const double after = compute_stretch(rs);
    if (rs.compute_end < 0 || before == after) return;  // no compute running, or the same rate
    // Work done, the task waiting for the host's last kernels: no rate to change.
    if (now >= rs.compute_work_end) return;
    rs.work_left -= static_cast<double>(now - rs.rate_since) / before;
    rs.rate_since = now;
    const Picoseconds work_end =
        now + static_cast<Picoseconds>(std::llround(std::max(0.0, rs.work_left) * after));
    rs.times.compute += work_end - rs.compute_work_end;  // the stretch is compute time
    const Picoseconds end = std::max(work_end, rs.compute_floor);
    rs.times.host += (end - work_end) - (rs.compute_end - rs.compute_work_end);
    rs.compute_work_end = work_end;
    if (end == rs.compute_end) return;  // its completion event stands
    rs.compute_end = end;
    push(end, EventType::kTaskDone, rank, static_cast<int32_t>(spec::Stream::kCompute));
  }

  // The stream whose progress `task` still waits for, if any.
  static std::optional<int> unmet_dep(const RankState& rs, const HotTask& task) {
    for (uint32_t dep : task.deps) {
      if (dep == HotTask::kNoDep) break;
      int stream = static_cast<int>(dep >> kDepStreamShift);
      if (rs.streams[static_cast<size_t>(stream)].completed <
          static_cast<int32_t>(dep & ((1u << kDepStreamShift) - 1)))
        return stream;
    }
    return std::nullopt;
  }

  // Starts the head task of stream `s` if it can start.
  void try_stream(int32_t rank, RankState& rs, int s, Picoseconds now, Trigger trigger) {
    StreamState& ss = rs.streams[static_cast<size_t>(s)];
    const std::vector<HotTask>& list = rs.hot->streams[static_cast<size_t>(s)];
    if (ss.busy || ss.next >= static_cast<int32_t>(list.size())) return;
    const HotTask& task = list[static_cast<size_t>(ss.next)];
    if (std::optional<int> waits = unmet_dep(rs, task)) {
      ss.blocked_on = static_cast<int8_t>(*waits);
      return;
    }
    ss.blocked_on = -1;
    ss.busy = true;
    ss.started = now;
    if (record_) starts_[static_cast<size_t>(rank)][static_cast<size_t>(task.id)] = now;
    start(rank, task, static_cast<spec::Stream>(s), now, trigger);
  }

  // After a task of `completed` finished (or at the start, every stream): starts what can start.
  // Only the stream that progressed and the streams blocked on it can have become ready.
  void try_start(int32_t rank, Picoseconds now, Trigger trigger, int completed = -1) {
    RankState& rs = ranks_[static_cast<size_t>(rank)];
    for (int s = 0; s < spec::kStreamCount; ++s) {
      if (completed < 0 || s == completed ||
          rs.streams[static_cast<size_t>(s)].blocked_on == completed)
        try_stream(rank, rs, s, now, trigger);
    }
  }

  void start(int32_t rank, const HotTask& task, spec::Stream stream, Picoseconds now,
             Trigger trigger) {
    const RankSetup& setup = setups_[static_cast<size_t>(rank)];
    RankState& rs = ranks_[static_cast<size_t>(rank)];
    switch (task.kind) {
      case TaskKind::kCompute: {
        account(rs.times, trigger, now - rs.compute_free_since);
        Picoseconds d = task.value;
        if (setup.speed != 1.0) {
          d = static_cast<Picoseconds>(std::llround(static_cast<double>(d) / setup.speed));
        }
        if (task.optimizer()) {
          rs.times.optimizer += d;
        } else {
          rs.times.compute += d;
        }
        rs.work_left = static_cast<double>(d);
        rs.rate_since = now;
        // Stretched while communication of this rank runs beside it (the stretch is compute time).
        const Picoseconds work_end =
            now +
            static_cast<Picoseconds>(std::llround(static_cast<double>(d) * compute_stretch(rs)));
        rs.times.compute += work_end - now - d;
        // Not before the host has issued its kernels: the GPU waits for the host meanwhile.
        rs.compute_floor =
            rs.hot->host_floor.empty() ? 0 : rs.hot->host_floor[static_cast<size_t>(task.id)];
        const Picoseconds end = std::max(work_end, rs.compute_floor);
        rs.times.host += end - work_end;
        rs.compute_work_end = work_end;
        rs.compute_end = end;
        push(end, EventType::kTaskDone, rank, static_cast<int32_t>(stream));
        break;
      }
      case TaskKind::kCollective: {
        int32_t g = setup.groups[task.slot];
        GroupState& gs = groups_[static_cast<size_t>(g)];
        if (gs.arrived == 0) {
          gs.bytes = task.value;
          gs.kind = task.collective();
          gs.stream = stream;
        } else {
          SEXTANT_CHECK(gs.bytes == task.value && gs.kind == task.collective(),
                        "rank {} joined a collective of group {} with {} bytes, others with {}",
                        rank, g, task.value, gs.bytes);
        }
        const GroupSetup& group = group_setups_[static_cast<size_t>(g)];
        gs.segments += (now - rs.last_sync) * setup.group_weight[task.slot];
        if (++gs.arrived == static_cast<int32_t>(group.members.size())) {
          gs.start = now;
          const int64_t ranks = group.size();  // a folded member stands for several ranks
          if (compute_jitter_ > 0 && ranks > 1) {
            const double segment = static_cast<double>(gs.segments) / static_cast<double>(ranks);
            gs.wait = static_cast<Picoseconds>(
                std::llround(compute_jitter_ * expected_max_of_normals(ranks) * segment));
          }
          // Data moves from now on (a member waiting for its peers takes nothing from compute).
          for (int64_t member : group.members)
            change_transfers(static_cast<int32_t>(member), +1, now);
          NetworkStart ns = network_.start_collective(g, gs.kind, gs.bytes, now);
          gs.algorithm = ns.algorithm;
          if (ns.end) push(*ns.end, EventType::kGroupDone, g);
        }
        break;
      }
      case TaskKind::kLocal:
        // A fixed duration on its own stream; the device's compute is not slowed by it.
        push(now + task.value, EventType::kTaskDone, rank, static_cast<int32_t>(stream));
        break;
      case TaskKind::kSend:
      case TaskKind::kRecv: {
        bool send = task.kind == TaskKind::kSend;
        int32_t c = send ? setup.send_channel[task.slot] : setup.recv_channel[task.slot];
        SEXTANT_CHECK(c >= 0, "rank {} has no {} channel in slot {}", rank, send ? "send" : "recv",
                      task.slot);
        ChannelState& cs = channels_[static_cast<size_t>(c)];
        if (send) {
          cs.send_posted = true;
          cs.bytes = task.value;
        } else {
          cs.recv_posted = true;
        }
        if (cs.send_posted && cs.recv_posted) {
          cs.start = now;
          const ChannelSetup& ch = channel_setups_[static_cast<size_t>(c)];
          change_transfers(static_cast<int32_t>(ch.src), +1, now);
          change_transfers(static_cast<int32_t>(ch.dst), +1, now);
          NetworkStart ns = network_.start_transfer(c, cs.bytes, now);
          cs.algorithm = ns.algorithm;
          if (ns.end) push(*ns.end, EventType::kChannelDone, c);
        }
        break;
      }
    }
  }

  // Completes the head task of `stream` on `rank`.
  const HotTask& complete_head(int32_t rank, spec::Stream stream, Picoseconds now,
                               std::string_view algorithm, Picoseconds host_wait = 0) {
    RankState& rs = ranks_[static_cast<size_t>(rank)];
    StreamState& ss = rs.streams[static_cast<size_t>(stream)];
    const HotTask& task =
        rs.hot->streams[static_cast<size_t>(stream)][static_cast<size_t>(ss.next)];
    const int32_t id = task.id;
    ss.busy = false;
    ss.next += 1;
    ss.completed += 1;
    // Every 4096 tasks (a task is one pass of a stage over a micro-batch, a collective or a
    // transfer): a report costs nothing next to the events between two.
    if (progress_ && (++tasks_done_ & 0xFFF) == 0) progress_(tasks_done_, tasks_total_);
    if (stream != spec::Stream::kCompute && task.kind != TaskKind::kLocal)
      change_transfers(rank, -1, now);
    if (now >= rs.last_end) {
      rs.last_end = now;
      rs.last_class = task.comm_class;
    }
    if (stream == spec::Stream::kCompute) rs.compute_free_since = now;
    if (record_) {
      records_.push_back(TaskRecord{rank, id,
                                    starts_[static_cast<size_t>(rank)][static_cast<size_t>(id)],
                                    now, algorithm, host_wait});
    }
    return task;
  }

  void task_done(int32_t rank, spec::Stream stream, Picoseconds now) {
    Picoseconds host_wait = 0;
    if (stream == spec::Stream::kCompute) {
      RankState& rs = ranks_[static_cast<size_t>(rank)];
      if (now != rs.compute_end) return;  // rescheduled: another event completes it
      rs.compute_end = -1;
      host_wait = std::max<Picoseconds>(0, now - rs.compute_work_end);
    }
    const HotTask& task = complete_head(rank, stream, now, {}, host_wait);
    // What waited for a local task (an offload copy, the host optimizer) waited for offload.
    try_start(rank, now,
              Trigger{task.kind == TaskKind::kLocal ? task.comm_class : CommClass::kNone},
              static_cast<int>(stream));
  }

  void group_done(int32_t g, Picoseconds now) {
    GroupState& gs = groups_[static_cast<size_t>(g)];
    if (gs.wait > 0 && !gs.waiting) {
      // The members also waited for the last of them to arrive (compute_jitter): the collective
      // holds them that much longer. Its transfer is over, so no compute is slowed meanwhile.
      for (int64_t member : group_setups_[static_cast<size_t>(g)].members)
        change_transfers(static_cast<int32_t>(member), -1, now);
      gs.waiting = true;
      push(now + gs.wait, EventType::kGroupDone, g);
      return;
    }
    const bool waited = gs.waiting;
    gs.arrived = 0;
    gs.segments = 0;
    gs.wait = 0;
    gs.waiting = false;
    for (int64_t member : group_setups_[static_cast<size_t>(g)].members) {
      int32_t r = static_cast<int32_t>(member);
      ranks_[static_cast<size_t>(r)].last_sync = now;
      if (waited) change_transfers(r, +1, now);  // complete_head takes it off again
      const HotTask& task = complete_head(r, gs.stream, now, gs.algorithm);
      try_start(r, now, Trigger{task.comm_class, now - gs.start}, static_cast<int>(gs.stream));
    }
  }

  void channel_done(int32_t c, Picoseconds now) {
    ChannelState& cs = channels_[static_cast<size_t>(c)];
    cs.send_posted = cs.recv_posted = false;
    const ChannelSetup& setup = channel_setups_[static_cast<size_t>(c)];
    int32_t src = static_cast<int32_t>(setup.src);
    int32_t dst = static_cast<int32_t>(setup.dst);
    const spec::Stream send = setup.up ? spec::Stream::kPpSendUp : spec::Stream::kPpSend;
    const spec::Stream recv = setup.up ? spec::Stream::kPpRecvUp : spec::Stream::kPpRecv;
    complete_head(src, send, now, cs.algorithm);
    complete_head(dst, recv, now, cs.algorithm);
    // The receiver now runs on its sender's timeline, as after a collective: the wait for the
    // last member of its next collective builds from here (the fit measures segments so too:
    // traces/samples.cpp, sync_samples).
    ranks_[static_cast<size_t>(dst)].last_sync = now;
    try_start(src, now, Trigger{}, static_cast<int>(send));
    try_start(dst, now, Trigger{CommClass::kPp, now - cs.start}, static_cast<int>(recv));
  }

  void check_finished() const {
    std::string stuck;
    int shown = 0;
    for (size_t r = 0; r < ranks_.size() && shown < 5; ++r) {
      const Program& p = program(static_cast<int32_t>(r));
      for (int s = 0; s < spec::kStreamCount; ++s) {
        const StreamState& ss = ranks_[r].streams[static_cast<size_t>(s)];
        if (ss.next < static_cast<int32_t>(p.streams[static_cast<size_t>(s)].size())) {
          stuck += fmt::format(" rank {} stream {} at task {} of {};", r,
                               spec::enum_name(spec::stream_names(), static_cast<spec::Stream>(s)),
                               ss.next, p.streams[static_cast<size_t>(s)].size());
          ++shown;
          break;
        }
      }
    }
    SEXTANT_CHECK(stuck.empty(), "simulation deadlocked:{}", stuck);
  }

  const EngineProgress& progress_;
  int64_t tasks_done_ = 0;
  int64_t tasks_total_ = 0;
  double overlap_slowdown_;
  double compute_jitter_;
  const std::vector<Program>& programs_;
  const std::vector<RankSetup>& setups_;
  const std::vector<GroupSetup>& group_setups_;
  const std::vector<ChannelSetup>& channel_setups_;
  Network& network_;
  bool record_;
  std::vector<HotProgram> hot_;
  std::vector<RankState> ranks_;
  std::vector<GroupState> groups_;
  std::vector<ChannelState> channels_;
  EventQueue queue_;
  std::optional<Picoseconds> wake_;
  std::vector<Completion> finished_;
  int64_t events_ = 0;
  std::vector<std::vector<Picoseconds>> starts_;
  std::vector<TaskRecord> records_;
};

}  // namespace

EngineResult run_engine(const std::vector<Program>& programs, const std::vector<RankSetup>& ranks,
                        const std::vector<GroupSetup>& groups,
                        const std::vector<ChannelSetup>& channels, Network& network,
                        bool record_tasks, double overlap_slowdown, double compute_jitter,
                        const EngineProgress& progress) {
  return Engine(programs, ranks, groups, channels, network, record_tasks, overlap_slowdown,
                compute_jitter, progress)
      .run();
}

}  // namespace sextant::sim
