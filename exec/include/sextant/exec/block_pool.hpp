// A caching allocator for device memory: freed blocks are kept by (rounded) size and handed out
// again. cudaFree synchronises the whole device, and the executor allocates its activations per
// op: without the pool every op would stall the GPU. Training repeats the same shapes every
// micro-batch, so exact size classes hit almost always. Single-stream use: a block freed by the
// host may be reused by the next kernel on the same stream (stream order keeps it safe).
// Generic over the raw allocator, so the logic is tested on the host.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <unordered_map>
#include <vector>

namespace sextant::exec {

class BlockPool {
 public:
  // raw_alloc returns nullptr when out of memory; raw_free releases one block.
  BlockPool(std::function<void*(int64_t)> raw_alloc, std::function<void(void*)> raw_free)
      : raw_alloc_(std::move(raw_alloc)), raw_free_(std::move(raw_free)) {}
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  ~BlockPool() { trim(); }

  // A block of at least `bytes`; when the raw allocator fails, the cached blocks are released and
  // it is asked again. Returns nullptr only when that fails too.
  void* allocate(int64_t bytes);
  void release(void* block);
  // Releases every cached (free) block to the raw allocator.
  void trim();

  // Size classes: multiples of 512 bytes up to 1 MiB, of 2 MiB above.
  static int64_t size_class(int64_t bytes);
  int64_t cached_bytes() const { return cached_bytes_; }
  int64_t live_bytes() const { return live_bytes_; }
  int64_t raw_allocations() const { return raw_allocations_; }

 private:
  std::function<void*(int64_t)> raw_alloc_;
  std::function<void(void*)> raw_free_;
  std::map<int64_t, std::vector<void*>> free_;  // size class -> cached blocks
  std::unordered_map<void*, int64_t> live_;     // block -> size class
  int64_t cached_bytes_ = 0, live_bytes_ = 0, raw_allocations_ = 0;
};

}  // namespace sextant::exec
