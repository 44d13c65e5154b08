// Weight versions kept by the number of updates applied (weight_versions.hpp).
#include "weight_versions.hpp"

#include "sextant/spec/error.hpp"

namespace sextant::exec {

WeightVersions::WeightVersions(DeviceMemory& memory, ParamStore& store)
    : memory_(memory), store_(store) {
  SEXTANT_CHECK(store.masters_versioned(),
                "weight versions are kept of fp32 master values the kernels read");
}

bool WeightVersions::keep(int64_t version) {
  if (versions_.contains(version)) return false;
  Tensor copy = memory_.empty(store_.values().shape(), store_.values().dtype());
  memory_.copy(store_.values(), copy);
  versions_.emplace(version, std::move(copy));
  return true;
}

void WeightVersions::load(int64_t version, std::span<const std::pair<int64_t, int64_t>> ranges) {
  auto it = versions_.find(version);
  SEXTANT_CHECK(it != versions_.end(), "weight version {} is not kept", version);
  if (!loaded_) {
    if (newest_.numel() != store_.total())
      newest_ = memory_.empty(store_.values().shape(), store_.values().dtype());
    memory_.copy(store_.values(), newest_);
    loaded_ = true;
  }
  for (auto [begin, end] : ranges) {
    if (begin >= end) continue;
    Tensor to = store_.values().rows(begin, end - begin);
    memory_.copy(it->second.rows(begin, end - begin), to);
  }
}

void WeightVersions::load(int64_t version) {
  const std::pair<int64_t, int64_t> all{0, store_.total()};
  load(version, std::span(&all, 1));
}

void WeightVersions::restore() {
  if (!loaded_) return;
  memory_.copy(newest_, store_.values());
  loaded_ = false;
}

void WeightVersions::drop_before(int64_t version) {
  versions_.erase(versions_.begin(), versions_.lower_bound(version));
}

}  // namespace sextant::exec
