// The parameters a rank holds: views into one flat value buffer and one flat gradient buffer, so
// that gradient buckets, ZeRO shards and checkpoints are slices of contiguous memory. Values are
// initialised from the seed and each element's index in the *global* (unsharded) tensor, so every
// layout starts from the same model.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sextant/exec/kernels/memory.hpp"

namespace sextant::exec {

// A standard normal value for (seed, tensor name, element index), independent of any sharding.
float init_normal(uint64_t seed, const std::string& tensor, int64_t global_index);

struct Param {
  std::string name;    // e.g. "block3.mlp.fc1.weight": identical in every layout
  int32_t layer = 0;   // lowered layer index
  Tensor value;        // fp32 master value
  Tensor compute;      // what the kernels read: value itself, or its bf16 copy in mixed precision
  Tensor grad;         // fp32
  int64_t offset = 0;  // in the flat buffers
  bool decay = true;   // AdamW weight decay (weights yes, biases and norms no)
  bool tp_replicated = false;  // every tp rank holds the same values
  // Its gradient is a partial sum over the tp ranks (they saw different rows), summed after the
  // backward (models::partial_gradient_sum): under sequence parallelism every tp_replicated
  // parameter; under per-op splits those models::PerOpBlock says.
  bool tp_partial = false;
  bool tied_copy = false;  // the last stage's copy of a tied embedding
  // A weight block of a 3D tensor grid, of which the rank holds a 1/z shard: its layer
  // reduce-scatters each micro-batch's gradient over z (exec/src/gpt/grid_linear.hpp). The grid's
  // other parameters, held alike by the z slices, have gradients that are partial sums over z.
  bool grid_sharded = false;
  // A routed expert's, under expert parallelism: summed over the expert replicas, not the
  // replicas (models::GradientBucket::experts). Kept after every other parameter in the flat
  // buffers, so that the buckets of each kind are contiguous.
  bool expert = false;
  // Under a CNN's per-op fc splits (models/cnn_fc_graph.hpp), a weight or bias of a layer whose
  // rows are whole on every replica: each replica computes its whole gradient, which no replica
  // sums (models::Layer::replica_whole_params). `replica_copy`: every replica holds the same
  // values (else its own shard). Kept after every other parameter in the flat buffers.
  bool replica_whole = false;
  bool replica_copy = false;
};

struct ParamSpec {
  std::string name;
  int32_t layer = 0;
  std::vector<int64_t> shape;  // local
  // Value of local element i (flat, row-major).
  std::function<float(int64_t)> init;
  bool decay = true;
  bool tp_replicated = false;
  bool tied_copy = false;
  bool expert = false;                            // Param::expert
  std::optional<bool> tp_partial = std::nullopt;  // Param::tp_partial; by default, tp_replicated
  bool grid_sharded = false;                      // Param::grid_sharded
  bool replica_whole = false;                     // Param::replica_whole
  bool replica_copy = false;                      // Param::replica_copy
};

class ParamStore {
 public:
  // Allocates the flat buffers, in the order given (callers list layers in forward order), the
  // experts' parameters after the others and the replica-whole ones (Param::replica_whole) last.
  // The compute copy has the backend's activation type.
  ParamStore(DeviceMemory& backend, const std::vector<ParamSpec>& specs);
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // Rounds the master values of [begin, end) into the compute copy (nothing to do in fp32): after
  // each update, gather or load.
  void refresh_compute(int64_t begin, int64_t end);
  void refresh_compute() { refresh_compute(0, total()); }

  // PipeDream-2BW's second weight version (spec/pipeline_schedule.hpp, exec/src/train/trainer_async.cpp):
  // a second buffer of what the kernels read, holding the current values at first, which
  // swap_versions() exchanges with the one the parameters view. In fp32 the master values are
  // that copy, so they are the ones doubled and swapped (masters_versioned()); in mixed
  // precision the one fp32 master stays, always the newest version.
  void add_version();
  void swap_versions();
  bool masters_versioned() const { return compute_.dtype() == values_.dtype(); }
  // The buffer not viewed now (its master values when masters_versioned()).
  Tensor& other_version() { return other_; }

  std::vector<Param>& params() { return params_; }
  Param& get(const std::string& name);
  Tensor& values() { return values_; }
  // What the kernels read: values() itself in fp32, its bf16 copy in mixed precision.
  Tensor& compute() { return compute_; }
  Tensor& grads() { return grads_; }
  int64_t total() const { return values_.numel(); }
  // Range [begin, end) of the flat buffers holding `layer`'s parameters, or its routed experts'
  // (Param::expert), (empty if none); replica-whole ones left out.
  std::pair<int64_t, int64_t> layer_range(int32_t layer, bool experts = false) const;
  // The layers holding parameters other than routed experts' and replica-whole ones, in store
  // order.
  std::vector<int32_t> layers() const;
  // Where the replica-whole parameters begin (total() when there are none).
  int64_t replica_whole_begin() const;

 private:
  DeviceMemory& backend_;
  std::vector<Param> params_;
  Tensor values_;
  Tensor compute_;  // values_ itself in fp32
  Tensor grads_;
  Tensor other_;  // add_version()'s second buffer
};

}  // namespace sextant::exec
