// Progress heartbeats per rank and the watchdog that ends a job one rank holds.
#include "sextant/exec/watchdog.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/mpi_communicator.hpp"

namespace sextant::exec {

namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

std::atomic<int64_t> g_step{-1};
std::atomic<int64_t> g_progress_ns{0};
std::atomic<int64_t> g_longest_step_ns{0};
std::atomic<int> g_rank{0};
std::atomic<int> g_heartbeat_fd{-1};  // this rank's heartbeat file while a watchdog runs

// A heartbeat file: one line "rank pid step progress_ns", padded to a fixed width so that every
// write replaces the whole line (the clock is CLOCK_MONOTONIC, shared by the node's processes).
constexpr size_t kLineBytes = 96;

char process_state(int64_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return '-';
  // "pid (comm) S ...": the state follows the last ')' (comm may hold spaces and parentheses).
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
}

std::string state_text(char state) {
  switch (state) {
    case 'T':
      return "stopped (SIGSTOP or SIGTSTP)";
    case 't':
      return "stopped by a debugger";
    case 'Z':
    case '-':
      return "gone (its process exited)";
    case 'D':
      return "in uninterruptible I/O";
    default:
      return "running";
  }
}

std::string job_tag(MPI_Comm world, int rank) {
  std::string tag;
  if (rank == 0) tag = fmt::format("{}-{}", getpid(), now_ns() % 1000000007);
  int length = static_cast<int>(tag.size());
  MPI_CHECK(MPI_Bcast(&length, 1, MPI_INT, 0, world));
  tag.resize(static_cast<size_t>(length));
  MPI_CHECK(MPI_Bcast(tag.data(), length, MPI_CHAR, 0, world));
  return tag;
}

void write_heartbeat_line() {
  const int fd = g_heartbeat_fd.load();
  if (fd < 0) return;
  std::string line =
      fmt::format("{} {} {} {}", g_rank.load(), getpid(), g_step.load(), g_progress_ns.load());
  line.resize(kLineBytes - 1, ' ');
  line += '\n';
  (void)!::pwrite(fd, line.data(), line.size(), 0);
}

std::vector<Heartbeat> read_heartbeats(const std::string& dir) {
  std::vector<Heartbeat> beats;
  std::error_code ec;
  const int64_t now = now_ns();
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().filename().string().rfind("rank-", 0) != 0) continue;
    std::ifstream in(entry.path());
    Heartbeat b;
    int64_t progress_ns = 0;
    if (!(in >> b.rank >> b.pid >> b.step >> progress_ns)) continue;
    b.age_s = static_cast<double>(now - progress_ns) * 1e-9;
    b.state = process_state(b.pid);
    beats.push_back(b);
  }
  return beats;
}

}  // namespace

void mark_progress(int64_t step) {
  const int64_t previous = g_step.exchange(step, std::memory_order_relaxed);
  g_progress_ns.store(now_ns(), std::memory_order_relaxed);
  // A new step is written at once (one pwrite a step), so that a rank stopped right after names
  // its step; the thread writes the rest at each poll.
  if (step != previous) write_heartbeat_line();
}

void mark_step_time(double seconds) {
  const auto ns = static_cast<int64_t>(seconds * 1e9);
  if (ns > g_longest_step_ns.load(std::memory_order_relaxed))
    g_longest_step_ns.store(ns, std::memory_order_relaxed);
}

std::string hung_rank_report(std::vector<Heartbeat> beats, int reporter, int world_size,
                             double waited_s, double timeout_s) {
  std::sort(beats.begin(), beats.end(),
            [](const Heartbeat& a, const Heartbeat& b) { return a.rank < b.rank; });
  // The rank that holds the job: a stopped or vanished process; else the oldest progress, when it
  // stands out from the rest by a second or more (every rank waiting alike is a deadlock).
  const Heartbeat* culprit = nullptr;
  for (const Heartbeat& b : beats)
    if (b.state == 'T' || b.state == 't' || b.state == 'Z' || b.state == '-') culprit = &b;
  if (culprit == nullptr && beats.size() > 1) {
    auto oldest = std::max_element(beats.begin(), beats.end(),
                                   [](const auto& a, const auto& b) { return a.age_s < b.age_s; });
    double next = 0;
    for (const Heartbeat& b : beats)
      if (&b != &*oldest) next = std::max(next, b.age_s);
    if (oldest->age_s > next + 1) culprit = &*oldest;
  }
  std::string out;
  if (culprit != nullptr) {
    out = fmt::format(
        "error: rank {} holds the job: it is {} and made no progress for {:.1f} s (in {}); the "
        "other ranks waited for it",
        culprit->rank, state_text(culprit->state), culprit->age_s,
        culprit->step < 0 ? std::string("setup") : fmt::format("step {}", culprit->step));
  } else {
    out = fmt::format(
        "error: no rank made progress for {:.1f} s and none stands out: a deadlock, or every rank "
        "stalled",
        waited_s);
  }
  out += fmt::format(
      "\n  the watchdog of rank {} ended the job after {:.1f} s without progress (timeout {:.1f} "
      "s: --watchdog, or 10x the longest step; --watchdog 0 turns it off)",
      reporter, waited_s, timeout_s);
  for (const Heartbeat& b : beats)
    out += fmt::format("\n  rank {:>4} pid {:>8}: {}, last progress {:.1f} s ago in {}", b.rank,
                       b.pid, state_text(b.state), b.age_s,
                       b.step < 0 ? std::string("setup") : fmt::format("step {}", b.step));
  if (static_cast<int>(beats.size()) < world_size)
    out +=
        fmt::format("\n  {} other rank(s) run on other nodes: their nodes' watchdogs report them",
                    world_size - static_cast<int>(beats.size()));
  return out;
}

Watchdog::Watchdog(MPI_Comm world, const WatchdogOptions& options) : options_(options) {
  MPI_CHECK(MPI_Comm_rank(world, &rank_));
  MPI_CHECK(MPI_Comm_size(world, &size_));
  if (options_.timeout_s <= 0) return;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string tag = job_tag(world, rank_);
  dir_ = (std::filesystem::temp_directory_path() / fmt::format("sextant-watchdog-{}-{}", tag, host))
             .string();
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  // Without a heartbeat file (an unwritable temporary directory) the watchdog still ends a hung
  // job; its report then names no other rank.
  fd_ = ::open(fmt::format("{}/rank-{}", dir_, rank_).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  g_rank.store(rank_);
  g_heartbeat_fd.store(fd_);
  mark_progress(g_step.load(std::memory_order_relaxed));
  write_heartbeat_line();  // before the first poll: a rank stopped right away is still named
  thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stop_.store(true);
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) {
    g_heartbeat_fd.store(-1);
    ::close(fd_);
    std::error_code ec;
    std::filesystem::remove(fmt::format("{}/rank-{}", dir_, rank_), ec);
    std::filesystem::remove(dir_, ec);  // the last rank of the node removes it
  }
}

void Watchdog::watch() {
  // Poll often enough to end a hung job within ~10% of the timeout, at most once a second.
  const auto poll = std::chrono::duration<double>(std::min(1.0, options_.timeout_s / 10));
  while (true) {
    {
      // Woken at once by the destructor: a run's end does not wait for the next poll.
      std::unique_lock lock(mutex_);
      if (wake_.wait_for(lock, poll, [this] { return stop_.load(); })) return;
    }
    write_heartbeat_line();
    const double waited_s =
        static_cast<double>(now_ns() - g_progress_ns.load(std::memory_order_relaxed)) * 1e-9;
    const double timeout_s =
        std::max(options_.timeout_s,
                 options_.step_multiple * static_cast<double>(g_longest_step_ns.load()) * 1e-9);
    if (waited_s > timeout_s && !stop_.load()) end_job(waited_s, timeout_s);
  }
}

void Watchdog::end_job(double waited_s, double timeout_s) const {
  // One report per node: the first rank to create the report file writes it.
  const int report =
      ::open(fmt::format("{}/report", dir_).c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (report >= 0 || fd_ < 0) {  // first on the node, or no directory to agree in
    if (report >= 0) ::close(report);
    const std::string text =
        hung_rank_report(read_heartbeats(dir_), rank_, size_, waited_s, timeout_s);
    std::fprintf(stderr, "%s\n", text.c_str());
    std::fflush(stderr);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    _exit(1);
  }
  // Another rank of this node reports: give it time to print, then end this rank too.
  std::this_thread::sleep_for(std::chrono::seconds(5));
  _exit(1);
}

}  // namespace sextant::exec
