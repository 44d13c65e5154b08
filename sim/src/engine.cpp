// The event loop.
#include "sextant/sim/engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <queue>

namespace sextant::sim {

namespace {

enum class EventType : uint8_t { kTaskDone, kGroupDone, kChannelDone };

struct Event {
  Picoseconds time;
  uint64_t seq;
  EventType type;
  int32_t a;  // rank, group or channel
  int32_t b;  // stream (kTaskDone)
  bool operator>(const Event& o) const {
    return time != o.time ? time > o.time : seq > o.seq;
  }
};

struct StreamState {
  int32_t next = 0;       // index into the program's stream list
  int32_t completed = 0;  // tasks completed on this stream
  bool busy = false;
  Picoseconds started = 0;
};

struct RankState {
  std::array<StreamState, spec::kStreamCount> streams;
  Picoseconds compute_free_since = 0;
  Picoseconds last_end = 0;
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

class Engine {
 public:
  Engine(const std::vector<Program>& programs, const std::vector<RankSetup>& ranks,
         const std::vector<GroupSetup>& groups, const std::vector<ChannelSetup>& channels,
         Network& network, bool record)
      : programs_(programs),
        setups_(ranks),
        group_setups_(groups),
        channel_setups_(channels),
        network_(network),
        record_(record),
        ranks_(ranks.size()),
        groups_(groups.size()),
        channels_(channels.size()) {
    if (record_) {
      starts_.resize(ranks.size());
      for (size_t r = 0; r < ranks.size(); ++r)
        starts_[r].resize(program(static_cast<int32_t>(r)).tasks.size());
    }
  }

  EngineResult run() {
    for (size_t r = 0; r < ranks_.size(); ++r) try_start(static_cast<int32_t>(r), 0, Trigger{});
    std::vector<Completion> finished;
    for (;;) {
      std::optional<Picoseconds> net = network_.next_event();
      if (queue_.empty() && !net) break;
      if (net && (queue_.empty() || *net < queue_.top().time)) {
        finished.clear();
        network_.advance(*net, finished);
        ++events_;
        for (const Completion& c : finished) {
          if (c.transfer) {
            channel_done(c.id, *net);
          } else {
            group_done(c.id, *net);
          }
        }
        continue;
      }
      Event e = queue_.top();
      queue_.pop();
      ++events_;
      switch (e.type) {
        case EventType::kTaskDone:
          task_done(e.a, static_cast<spec::Stream>(e.b), e.time);
          break;
        case EventType::kGroupDone:
          group_done(e.a, e.time);
          break;
        case EventType::kChannelDone:
          channel_done(e.a, e.time);
          break;
      }
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

  void push(Picoseconds time, EventType type, int32_t a, int32_t b = 0) {
    queue_.push(Event{time, seq_++, type, a, b});
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
      case CommClass::kNone:
        t.bubble += idle;
        break;
    }
  }

  bool deps_met(int32_t rank, const Task& task) const {
    const Program& p = program(rank);
    const RankState& rs = ranks_[static_cast<size_t>(rank)];
    for (int32_t d = task.dep_begin; d < task.dep_end; ++d) {
      const Dep& dep = p.deps[static_cast<size_t>(d)];
      if (rs.streams[dep.stream].completed < dep.count) return false;
    }
    return true;
  }

  void try_start(int32_t rank, Picoseconds now, Trigger trigger) {
    const Program& p = program(rank);
    RankState& rs = ranks_[static_cast<size_t>(rank)];
    for (int s = 0; s < spec::kStreamCount; ++s) {
      StreamState& ss = rs.streams[static_cast<size_t>(s)];
      const std::vector<int32_t>& list = p.streams[static_cast<size_t>(s)];
      if (ss.busy || ss.next >= static_cast<int32_t>(list.size())) continue;
      int32_t id = list[static_cast<size_t>(ss.next)];
      const Task& task = p.tasks[static_cast<size_t>(id)];
      if (!deps_met(rank, task)) continue;
      ss.busy = true;
      ss.started = now;
      if (record_) starts_[static_cast<size_t>(rank)][static_cast<size_t>(id)] = now;
      start(rank, task, now, trigger);
    }
  }

  void start(int32_t rank, const Task& task, Picoseconds now, Trigger trigger) {
    const RankSetup& setup = setups_[static_cast<size_t>(rank)];
    RankState& rs = ranks_[static_cast<size_t>(rank)];
    switch (task.kind) {
      case TaskKind::kCompute: {
        account(rs.times, trigger, now - rs.compute_free_since);
        Picoseconds d = task.duration;
        if (setup.speed != 1.0) {
          d = static_cast<Picoseconds>(std::llround(static_cast<double>(d) / setup.speed));
        }
        if (task.optimizer) {
          rs.times.optimizer += d;
        } else {
          rs.times.compute += d;
        }
        push(now + d, EventType::kTaskDone, rank, static_cast<int32_t>(task.stream));
        break;
      }
      case TaskKind::kCollective: {
        int32_t g = setup.groups[task.slot];
        GroupState& gs = groups_[static_cast<size_t>(g)];
        if (gs.arrived == 0) {
          gs.bytes = task.bytes;
          gs.kind = task.collective;
          gs.stream = task.stream;
        } else {
          SEXTANT_CHECK(gs.bytes == task.bytes && gs.kind == task.collective,
                        "rank {} joined a collective of group {} with {} bytes, others with {}",
                        rank, g, task.bytes, gs.bytes);
        }
        if (++gs.arrived == static_cast<int32_t>(group_setups_[static_cast<size_t>(g)].members.size())) {
          gs.start = now;
          NetworkStart ns = network_.start_collective(g, gs.kind, gs.bytes, now);
          gs.algorithm = ns.algorithm;
          if (ns.end) push(*ns.end, EventType::kGroupDone, g);
        }
        break;
      }
      case TaskKind::kSend:
      case TaskKind::kRecv: {
        bool send = task.kind == TaskKind::kSend;
        int32_t c = send ? setup.send_channel[task.slot] : setup.recv_channel[task.slot];
        SEXTANT_CHECK(c >= 0, "rank {} has no {} channel in slot {}", rank, send ? "send" : "recv",
                      task.slot);
        ChannelState& cs = channels_[static_cast<size_t>(c)];
        if (send) {
          cs.send_posted = true;
          cs.bytes = task.bytes;
        } else {
          cs.recv_posted = true;
        }
        if (cs.send_posted && cs.recv_posted) {
          cs.start = now;
          NetworkStart ns = network_.start_transfer(c, cs.bytes, now);
          cs.algorithm = ns.algorithm;
          if (ns.end) push(*ns.end, EventType::kChannelDone, c);
        }
        break;
      }
    }
  }

  // Completes the head task of `stream` on `rank`.
  const Task& complete_head(int32_t rank, spec::Stream stream, Picoseconds now,
                            std::string_view algorithm) {
    const Program& p = program(rank);
    RankState& rs = ranks_[static_cast<size_t>(rank)];
    StreamState& ss = rs.streams[static_cast<size_t>(stream)];
    int32_t id = p.streams[static_cast<size_t>(stream)][static_cast<size_t>(ss.next)];
    const Task& task = p.tasks[static_cast<size_t>(id)];
    ss.busy = false;
    ss.next += 1;
    ss.completed += 1;
    if (now >= rs.last_end) {
      rs.last_end = now;
      rs.last_class = task.comm_class;
    }
    if (stream == spec::Stream::kCompute) rs.compute_free_since = now;
    if (record_) {
      records_.push_back(TaskRecord{rank, id, starts_[static_cast<size_t>(rank)][static_cast<size_t>(id)],
                                    now, algorithm});
    }
    return task;
  }

  void task_done(int32_t rank, spec::Stream stream, Picoseconds now) {
    complete_head(rank, stream, now, {});
    try_start(rank, now, Trigger{});
  }

  void group_done(int32_t g, Picoseconds now) {
    GroupState& gs = groups_[static_cast<size_t>(g)];
    gs.arrived = 0;
    for (int64_t member : group_setups_[static_cast<size_t>(g)].members) {
      int32_t r = static_cast<int32_t>(member);
      const Task& task = complete_head(r, gs.stream, now, gs.algorithm);
      try_start(r, now, Trigger{task.comm_class, now - gs.start});
    }
  }

  void channel_done(int32_t c, Picoseconds now) {
    ChannelState& cs = channels_[static_cast<size_t>(c)];
    cs.send_posted = cs.recv_posted = false;
    const ChannelSetup& setup = channel_setups_[static_cast<size_t>(c)];
    int32_t src = static_cast<int32_t>(setup.src);
    int32_t dst = static_cast<int32_t>(setup.dst);
    complete_head(src, spec::Stream::kPpSend, now, cs.algorithm);
    complete_head(dst, spec::Stream::kPpRecv, now, cs.algorithm);
    try_start(src, now, Trigger{});
    try_start(dst, now, Trigger{CommClass::kPp, now - cs.start});
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

  const std::vector<Program>& programs_;
  const std::vector<RankSetup>& setups_;
  const std::vector<GroupSetup>& group_setups_;
  const std::vector<ChannelSetup>& channel_setups_;
  Network& network_;
  bool record_;
  std::vector<RankState> ranks_;
  std::vector<GroupState> groups_;
  std::vector<ChannelState> channels_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue_;
  uint64_t seq_ = 0;
  int64_t events_ = 0;
  std::vector<std::vector<Picoseconds>> starts_;
  std::vector<TaskRecord> records_;
};

}  // namespace

EngineResult run_engine(const std::vector<Program>& programs, const std::vector<RankSetup>& ranks,
                        const std::vector<GroupSetup>& groups,
                        const std::vector<ChannelSetup>& channels, Network& network,
                        bool record_tasks) {
  return Engine(programs, ranks, groups, channels, network, record_tasks).run();
}

}  // namespace sextant::sim
