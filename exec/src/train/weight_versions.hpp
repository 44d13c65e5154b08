// The weight versions a stage keeps for asynchronous training: PipeDream's weight stashing
// (spec::pipedream_version) and its sequential definition (TrainOptions::layer_staleness), which
// compute with older versions of some parameters and update the newest.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <utility>

#include "sextant/exec/parameters.hpp"

namespace sextant::exec {

class WeightVersions {
 public:
  // The versions of `store`'s master values (fp32: what the kernels read).
  WeightVersions(DeviceMemory& memory, ParamStore& store);

  // Keeps a copy of the current values as version `version` (the updates applied), once.
  // Returns whether it copied.
  bool keep(int64_t version);
  // Puts version `version` into `ranges` ([begin, end) of the flat buffers) of the values, the
  // newest values set aside the first time; restore() puts them back.
  void load(int64_t version, std::span<const std::pair<int64_t, int64_t>> ranges);
  void load(int64_t version);  // every parameter
  void restore();
  // Drops the versions before `version`.
  void drop_before(int64_t version);
  size_t kept() const { return versions_.size(); }

 private:
  DeviceMemory& memory_;
  ParamStore& store_;
  std::map<int64_t, Tensor> versions_;
  Tensor newest_;
  bool loaded_ = false;
};

}  // namespace sextant::exec
