// A hung rank found. A rank that is stopped (SIGSTOP, a debugger), deadlocked or stuck in a driver
// leaves every other rank waiting at its next collective forever, busy-polling at 60-97% of a
// core. Every rank runs a watchdog thread: training marks its progress (mark_progress: two relaxed
// atomic stores); the thread copies the marks into a heartbeat file in a directory the ranks of
// its node share and, once its own rank has made no progress for the timeout, reads its node's
// heartbeats and /proc, names the rank that holds the job (a stopped or vanished process, else the
// one whose progress is oldest), prints one report per node and ends its process, which ends the
// job (mpirun and srun end every rank when one exits without finalising MPI).
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace sextant::exec {

struct WatchdogOptions {
  // No progress for this long ends the job; 0: no watchdog. The timeout grows to
  // step_multiple x the longest step measured so far where that is longer.
  double timeout_s = 0;
  double step_multiple = 10;
};

// This rank's training is in `step` now (called at each step and between a step's units of work).
void mark_progress(int64_t step);
// A step took `seconds`: the timeout grows to step_multiple times the longest.
void mark_step_time(double seconds);

// One rank's heartbeat as the watchdog reads it.
struct Heartbeat {
  int rank = 0;
  int64_t pid = 0;
  int64_t step = -1;  // -1: before the first step
  double age_s = 0;   // since its last progress
  char state = '?';   // /proc/PID/stat: R, S, D, T (stopped), t (traced), Z; '-' gone
};

// The report on a node whose rank `reporter` saw no progress for `waited_s` (timeout
// `timeout_s`): which rank holds the job and why, then every heartbeat, one line each; ranks of
// the world missing from `beats` run on other nodes. The first line starts "error: ".
std::string hung_rank_report(std::vector<Heartbeat> beats, int reporter, int world_size,
                             double waited_s, double timeout_s);

class Watchdog {
 public:
  // Collective over `world` (rank 0 names the job's heartbeat directory for every node). Starts
  // the thread when options.timeout_s > 0.
  Watchdog(MPI_Comm world, const WatchdogOptions& options);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  void watch();
  [[noreturn]] void end_job(double waited_s, double timeout_s) const;

  int rank_ = 0, size_ = 1;
  WatchdogOptions options_;
  std::string dir_;  // this node's heartbeat directory
  int fd_ = -1;      // this rank's heartbeat file
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::thread thread_;
};

}  // namespace sextant::exec
