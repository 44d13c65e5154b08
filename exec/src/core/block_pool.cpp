// Size-class caching of device blocks.
#include "sextant/exec/block_pool.hpp"

#include "sextant/spec/error.hpp"

namespace sextant::exec {

int64_t BlockPool::size_class(int64_t bytes) {
  constexpr int64_t kSmall = 512, kLarge = int64_t{2} << 20, kSmallLimit = int64_t{1} << 20;
  const int64_t b = std::max<int64_t>(bytes, 1);
  if (b <= kSmallLimit) return (b + kSmall - 1) / kSmall * kSmall;
  return (b + kLarge - 1) / kLarge * kLarge;
}

void* BlockPool::allocate(int64_t bytes) {
  const int64_t size = size_class(bytes);
  void* block = nullptr;
  auto it = free_.find(size);
  if (it != free_.end() && !it->second.empty()) {
    block = it->second.back();
    it->second.pop_back();
    cached_bytes_ -= size;
  } else {
    block = raw_alloc_(size);
    if (block == nullptr && cached_bytes_ > 0) {
      trim();
      block = raw_alloc_(size);
    }
    if (block == nullptr) return nullptr;
    ++raw_allocations_;
  }
  live_[block] = size;
  live_bytes_ += size;
  return block;
}

void BlockPool::release(void* block) {
  if (block == nullptr) return;
  auto it = live_.find(block);
  SEXTANT_CHECK(it != live_.end(), "release of a block this pool did not hand out");
  free_[it->second].push_back(block);
  cached_bytes_ += it->second;
  live_bytes_ -= it->second;
  live_.erase(it);
}

void BlockPool::trim() {
  for (auto& [size, blocks] : free_)
    for (void* b : blocks) raw_free_(b);
  free_.clear();
  cached_bytes_ = 0;
}

}  // namespace sextant::exec
