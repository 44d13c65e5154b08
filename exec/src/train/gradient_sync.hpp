// Gradient synchronisation across data-parallel replicas and the parameters that follow from it:
// DDP (gradient buckets all-reduced as soon as the last micro-batch's backward has produced them),
// ZeRO-1/2 (the same buckets reduce-scattered, each rank updates its shard of the parameters and
// optimizer state, the buckets' parameters all-gathered after the update), ZeRO-3/FSDP
// (parameters gathered before each layer's forward and backward, gradients reduce-scattered after
// each layer's backward). Also the sums that tensor and pipeline parallelism need: tied embeddings
// between the first and last stage, and sequence-parallel partial gradients over the tp group.
// The buckets are models::gradient_buckets, the ones the simulator prices. With the plan's
// gradient compression (DDP only) a bucket is encoded, all-gathered and decoded instead of
// all-reduced (models/gradient_compression.hpp; the codecs are gradient_codec.hpp's).
//
// Sharding: a bucket's (ZeRO-1/2) or a layer's (ZeRO-3) slice of the flat parameter buffer is
// padded to a multiple of dp and split into dp equal blocks; block i belongs to data-parallel
// rank i. Under expert parallelism the routed experts' buckets are summed and sharded the same
// way over the ranks holding those experts (the expert replicas) instead.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "sextant/exec/context.hpp"
#include "sextant/exec/powersgd.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/step_program.hpp"
#include "sextant/spec/stack.hpp"
#include "stage_model.hpp"

namespace sextant::exec {

class GradientSync : public LayerHooks {
 public:
  GradientSync(Context& ctx, StageModel& stage, int64_t micro_batches);

  void before_forward(int32_t layer, int64_t micro_batch) override;
  void before_backward(int32_t layer, int64_t micro_batch) override;
  void after_backward(int32_t layer, int64_t micro_batch) override;

  // Before training step `step` (from 0; a resumed run continues the count): clears gradients.
  void begin_step(int64_t step);
  // After the backward of every micro-batch: completes the reductions. Afterwards each rank's
  // owned ranges hold the summed gradients.
  void finish_backward();
  // [begin, end) ranges of the flat buffers whose update this rank performs.
  const std::vector<std::pair<int64_t, int64_t>>& owned() const { return owned_; }
  // The parameters the optimizer step counts (models::zero_updated_params): the owned ranges
  // with each ZeRO shard padded to its full length, as the simulator prices the step (the last
  // rank of a span holds fewer; a padded partition updates its padding too).
  int64_t updated_params() const { return updated_; }
  // The ranges whose gradients this rank adds to the global gradient norm, so that the world's
  // sum counts every parameter once: its owned shards under ZeRO; under DDP the first replica's
  // parameters, and each expert's on the first of the ranks holding it. A replica-whole shard
  // counts on its replica, a replica-whole copy on the first.
  std::vector<std::pair<int64_t, int64_t>> norm_ranges() const;
  // After the optimizer updated the owned ranges: ZeRO-1/2 gather the parameters.
  void after_update();
  // The compressed exchange's training state a checkpoint keeps, each array one value per
  // parameter of the stage: the error-feedback residual, then PowerSGD's Q factors (each
  // matrix's at its offset); none without compression.
  size_t state_arrays() const;
  std::vector<std::vector<float>> save_state() const;
  void load_state(const std::vector<std::vector<float>>& state);
  // ZeRO-Offload: each bucket's reduced shard is copied into `host` (the trainer's host pool, at
  // the same offsets) as soon as it is reduced, where the host optimizer step reads it.
  // Under ZeRO-3 each layer's reduced shard goes there after every micro-batch's backward (its
  // sum so far: the host pool ends with the step's), and with one replica each layer's gradients
  // after the last micro-batch's, as DeepSpeed's stage 3 hands them to its CPU optimizer.
  void offload_gradients_to(Tensor& host) { host_grads_ = &host; }
  // ZeRO-Infinity's parameter offload (zero 3): the master values live off the device (the
  // trainer's host pool, or its NVMe file); before each use of a layer `fetch` brings this rank's
  // shard of it, the flat range [begin, end), into `to` (the device's values at those offsets),
  // which is then gathered.
  using ParameterFetch = std::function<void(int64_t begin, int64_t end, Tensor& to)>;
  void offload_parameters(ParameterFetch fetch) { fetch_ = std::move(fetch); }

 private:
  // The ranks a slice's gradients are summed (and sharded) over.
  struct Group {
    Communicator* comm = nullptr;
    int64_t size = 1, rank = 0;
  };
  // A slice of the flat buffers sharded over the data-parallel group (or the expert replicas):
  // one layer (ZeRO-3) or one bucket (ZeRO-1/2).
  struct Span {
    std::optional<int64_t> layer;  // the layer, for the trace (buckets have none)
    int64_t begin = 0, end = 0;    // flat range
    int64_t shard = 0;             // padded block size
    const Group* group = nullptr;
  };
  struct Bucket {
    models::GradientBucket model;  // as the simulator prices it
    Span span;
    std::vector<int32_t> layers;
    int32_t index = 0;            // in the stage's bucket order (seeds QSGD's rounding)
    bool after_tied_sum = false;  // reduced once the end stages have summed the tied table
    int32_t pending = 0;
    bool reduced = false;
    std::unique_ptr<CommRequest> request;
  };
  // The spans of `layer`: its parameters, and under expert parallelism its routed experts'.
  std::vector<const Span*> layer_spans(int32_t layer) const;
  // `micro_batch`: the backward that completed the bucket (the step's last one when reduced
  // after the backward); under ZeRO-2's kBucketsEachPass every micro-batch's reduction is added
  // to the rank's accumulated shard (shard_grads_).
  void reduce_bucket(Bucket& b, bool during_backward, int64_t micro_batch);
  void reduce_sequence_parallel(Tensor& grads);
  void reduce_tied();
  // The buckets holding a tied table (`tied`) or the others that are still to reduce or wait for.
  void finish_buckets(bool tied);
  // Reduce-scatters the gradients of `s`; this rank's block of the sum is added to `into`
  // (accumulate) or written there.
  void reduce_scatter_span(const Span& s, Tensor& into, bool accumulate);
  void gather_span(const Span& s, spec::Phase phase);
  void gather_span_low(const Span& s, spec::Phase phase, int64_t mine_begin, int64_t mine_end);
  void all_reduce_range(const Span& span, spec::Phase phase);
  // The span's gradient reduction and parameter gather as the step program describes them
  // (models/step_ops.hpp), in elements of `element_bytes`.
  models::StepOp reduction_of(const Span& s, int64_t element_bytes) const;
  models::StepOp gather_of(const Span& s, int64_t element_bytes) const;
  // The compressed exchange of a bucket: encode (with error feedback, of the gradients plus the
  // residual, which keeps what the encoding dropped), all-gather, and the sum of every rank's
  // decoded bucket in rank order.
  void compressed_reduce(const Bucket& b);
  // PowerSGD's exchange of `b`: its weight matrices as this stage holds them.
  std::unique_ptr<PowerSgdExchange> powersgd_of(const Bucket& b) const;
  // Seeds every replica's first Q alike (PyTorch's PowerSGDState random_seed).
  static constexpr uint64_t kPowerSgdSeed = 0;
  bool deferred(int32_t layer) const;
  // The rank's shard of a reduced bucket, held in `from`, to the host pool (ZeRO-Offload) after
  // micro-batch `micro_batch`'s backward, traced as the simulator's offload.grad_to_host.
  void gradients_to_host(const Span& s, const Tensor& from, int64_t micro_batch);
  // ZeRO-3 with the optimizer on the host: this rank's part of `s`'s gradients, held in `from`
  // (the reduced shards, or with one replica the gradients themselves), copied to the host pool
  // after micro-batch `micro_batch`'s backward, traced as the simulator's offload.grad_to_host.
  void layer_gradients_to_host(const Span& s, const Tensor& from, int64_t micro_batch);
  // ZeRO-Infinity: this rank's shard of `s` from the host pool to the parameters, before the
  // layer's gather (offload.params_to_device).
  void fetch_parameters(const Span& s, spec::Phase phase, int64_t micro_batch);
  // With the optimizer on the host under sequence parallelism: the tp-summed gradients of the
  // parameters every tp rank holds, copied to the host pool again after the sum.
  void resend_sequence_parallel_sums();
  // ZeRO-3's gather (and fetch, with the parameters on the host) of `layer` before a pass.
  void parameters_for(int32_t layer, spec::Phase phase, int64_t micro_batch);
  std::pair<int64_t, int64_t> mine(const Span& s) const;
  std::vector<int64_t> blocks(const Span& s) const;  // each rank's block of `s`, unpadded

  Context& ctx_;
  StageModel& stage_;
  int64_t micro_batches_;
  // The plan's stack knobs the executor honours (its kernels are always its own): DDP bucket size
  // and whether buckets are reduced during backward.
  spec::Stack stack_;
  int64_t dp_;
  int zero_;
  models::LayerGradients gradients_;  // where a layer's gradients go after its backward
  Group replicas_, experts_;          // the replicas; the expert replicas (the replicas without ep)
  int64_t expert_begin_ = 0;          // where the routed experts' parameters start (Param::expert)
  int64_t whole_begin_ = 0;           // where the replica-whole ones start (Param::replica_whole)
  std::vector<Span> layers_;          // per layer with parameters, in store order
  std::vector<int32_t> tied_layers_;  // layers holding a tied table (summed across stages first)
  std::vector<Bucket> buckets_;
  std::vector<std::pair<int64_t, int64_t>> owned_;
  int64_t updated_ = 0;  // updated_params()
  Tensor shard_grads_;   // ZeRO-3, ZeRO-2 over micro-batches: reduced per micro-batch, summed
  Tensor padded_;        // scratch for padded layer slices (backend memory)
  Tensor shard_;         // scratch for this rank's block of a layer
  // In mixed precision the parameters travel in their compute type, bf16 (Megatron's distributed
  // optimizer and FSDP's param_dtype gather them so): padded_ and shard_ in bf16.
  Tensor padded_low_, shard_low_;
  spec::GradientCompression compression_;
  Tensor residual_;                 // error feedback: fp32, one per gradient
  Tensor* host_grads_ = nullptr;    // ZeRO-Offload's host pool of gradients, or null
  ParameterFetch fetch_;            // ZeRO-Infinity's parameter fetch, or empty
  std::vector<uint32_t> encoded_;   // this rank's encoded bucket
  std::vector<uint32_t> gathered_;  // every rank's, in rank order
  std::vector<std::unique_ptr<PowerSgdExchange>> powersgd_;  // per bucket, with PowerSGD
  uint64_t step_ = 0;  // the training step, for QSGD's rounding
};

}  // namespace sextant::exec
