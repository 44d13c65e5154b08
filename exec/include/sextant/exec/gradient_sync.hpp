// Gradient synchronisation across data-parallel replicas and the parameters that follow from it:
// DDP (gradient buckets all-reduced as soon as the last micro-batch's backward has produced them),
// ZeRO-1/2 (reduce-scatter of gradients, each rank updates its shard of the parameters and
// optimizer state, all-gather of the parameters), ZeRO-3/FSDP (parameters gathered before each
// layer's forward and backward, gradients reduce-scattered after each layer's backward). Also the
// sums that tensor and pipeline parallelism need first: sequence-parallel replicated gradients
// over the tensor-parallel group, and tied embeddings between the first and last stage.
//
// Sharding is per layer: each layer's slice of the flat parameter buffer is padded to a multiple
// of dp and split into dp equal blocks; block i belongs to data-parallel rank i.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "sextant/exec/context.hpp"
#include "sextant/exec/stage_model.hpp"
#include "sextant/spec/stack.hpp"

namespace sextant::exec {

class GradientSync : public LayerHooks {
 public:
  GradientSync(Context& ctx, StageModel& stage, int64_t micro_batches);

  void before_forward(int32_t layer, int64_t micro_batch) override;
  void before_backward(int32_t layer, int64_t micro_batch) override;
  void after_backward(int32_t layer, int64_t micro_batch) override;

  // Before the step: clears gradients.
  void begin_step();
  // After the backward of every micro-batch: completes the reductions. Afterwards each rank's
  // owned ranges hold the summed gradients.
  void finish_backward();
  // [begin, end) ranges of the flat buffers whose update this rank performs.
  const std::vector<std::pair<int64_t, int64_t>>& owned() const { return owned_; }
  // After the optimizer updated the owned ranges: ZeRO-1/2 gather the parameters.
  void after_update();

 private:
  struct LayerSlice {
    int32_t layer = 0;
    int64_t begin = 0, end = 0;  // flat range
    int64_t shard = 0;           // padded block size
  };
  struct Bucket {
    int64_t begin = 0, end = 0;
    std::vector<int32_t> layers;
    int32_t pending = 0;
    std::unique_ptr<CommRequest> request;
  };
  const LayerSlice* slice(int32_t layer) const;
  void reduce_sequence_parallel(Tensor& grads);
  void reduce_tied();
  void reduce_scatter_layer(const LayerSlice& s, Tensor& into);
  void gather_layer(const LayerSlice& s, spec::Phase phase);
  void all_reduce_range(int64_t begin, int64_t end, spec::Phase phase);
  bool deferred(int32_t layer) const;

  Context& ctx_;
  StageModel& stage_;
  int64_t micro_batches_;
  // The plan's stack knobs the executor honours (its kernels are always its own): DDP bucket size
  // and whether buckets are reduced during backward.
  spec::Stack stack_;
  int64_t dp_;
  int zero_;
  std::vector<LayerSlice> slices_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<int64_t, int64_t>> owned_;
  Tensor shard_grads_;  // ZeRO-3: gradients reduced per micro-batch, accumulated per shard
  Tensor padded_;       // scratch for padded layer slices (backend memory)
  Tensor shard_;        // scratch for this rank's block of a layer
};

}  // namespace sextant::exec
