// Work shared by threads that take indices from one counter, with exceptions carried home.
#pragma once

#include <atomic>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sextant::planner {

// Runs `worker` on `threads` threads (this one included); each takes indices from `next` until it
// reaches `count`. An exception thrown by a worker stops the others (next jumps to `count`) and is
// rethrown here once every thread has ended: one escaping a thread, or thrown here while threads
// are still joinable, would end the process with std::terminate (`plan --seq-len 2000000000` did).
inline void run_workers(int threads, std::atomic<size_t>& next, size_t count,
                        const std::function<void()>& worker) {
  std::exception_ptr first;
  std::mutex mutex;
  auto guarded = [&] {
    try {
      worker();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!first) first = std::current_exception();
      next.store(count);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(guarded);
  guarded();
  for (std::thread& t : pool) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace sextant::planner
