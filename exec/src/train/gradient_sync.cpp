// Data-parallel gradient reduction and ZeRO.
#include "gradient_sync.hpp"

#include <algorithm>

#include "sextant/exec/gradient_codec.hpp"
#include "sextant/exec/sparse_all_reduce.hpp"
#include "sextant/models/gradient_compression.hpp"
#include "sextant/spec/executor_support.hpp"

namespace sextant::exec {

using models::OpId;

using spec::OpClass;
using spec::Phase;
using spec::Stream;

GradientSync::GradientSync(Context& ctx, StageModel& stage, int64_t micro_batches)
    : ctx_(ctx),
      stage_(stage),
      micro_batches_(micro_batches),
      stack_(spec::executor_stack(*ctx.plan)),
      // Parameter servers sum the replicas' gradients themselves
      // (exec/src/train/parameter_servers.hpp): here each replica is on its own, its tied and
      // partial sums still made.
      dp_(ctx.plan->parameter_server.enabled ? 1 : ctx.groups->replica_size),
      zero_(ctx.plan->zero),
      compression_(ctx.plan->compression) {
  // GEMS: a rank and its mirror are also pipeline neighbours, and MPI's collectives on CPU ranks
  // complete as they are called: a bucket reduced mid-backward would wait for a mirror waiting
  // on this rank's next transfer. The buckets are reduced after the backward, in the order the
  // simulator issues them (its NCCL-like streams overlap them: buckets_in_order there).
  if (ctx.plan->schedule == spec::Schedule::kGems) stack_.dp_overlap = false;
  gradients_ = models::layer_gradients(*ctx.plan, stack_.dp_overlap);
  SEXTANT_CHECK(dp_ == (ctx.plan->parameter_server.enabled ? 1 : ctx.plan->replicas()),
                "{} replicas sum this rank's gradients, the plan has {}", dp_,
                ctx.plan->replicas());
  ParamStore& store = stage_.params();
  replicas_ = dp_ == 1
                  ? Group{ctx.groups->replicas, 1, 0}
                  : Group{ctx.groups->replicas, ctx.groups->replica_size, ctx.groups->replica_rank};
  experts_ = ctx.groups->expert_replicas != nullptr
                 ? Group{ctx.groups->expert_replicas, ctx.groups->expert_replica_size,
                         ctx.groups->expert_replica_rank}
                 : replicas_;
  whole_begin_ = store.replica_whole_begin();
  expert_begin_ = whole_begin_;
  for (const Param& p : store.params())
    if (p.expert) expert_begin_ = std::min(expert_begin_, p.offset);
  auto span_of = [&](std::optional<int64_t> layer, int64_t b, int64_t e, const Group& g) {
    return Span{layer, b, e, models::zero_shard(e - b, g.size), &g};
  };
  int64_t largest = 0;
  for (int32_t layer : store.layers()) {
    auto [b, e] = store.layer_range(layer);
    layers_.push_back(span_of(layer, b, e, replicas_));
    largest = std::max(largest, layers_.back().shard * dp_);
  }
  // ZeRO-3 under expert parallelism: a layer's routed experts are a span of their own, sharded
  // over the ranks holding them (TorchTitan's FSDP2 of the experts over dp_shard / ep).
  for (int32_t layer : store.layers()) {
    auto [b, e] = store.layer_range(layer, true);
    if (b == e) continue;
    layers_.push_back(span_of(layer, b, e, experts_));
    largest = std::max(largest, layers_.back().shard * experts_.size);
  }
  // The buckets the simulator prices, mapped onto this stage's flat buffers (4-byte gradients).
  const std::vector<models::GradientBucket> buckets = models::gradient_buckets(
      *ctx.plan, *ctx.lowered, ctx.groups->pp_rank, stack_.dp_bucket_bytes, 4);
  for (const models::GradientBucket& gb : buckets) {
    Bucket b;
    b.after_tied_sum = gb.after_tied_sum;
    int64_t lo = INT64_MAX, hi = 0, n = 0;
    for (size_t l : gb.layers) {
      auto [lb, le] = store.layer_range(static_cast<int32_t>(l), gb.experts);
      if (gb.after_tied_sum) tied_layers_.push_back(static_cast<int32_t>(l));
      if (lb == le) continue;
      b.layers.push_back(static_cast<int32_t>(l));
      lo = std::min(lo, lb);
      hi = std::max(hi, le);
      n += le - lb;
    }
    if (b.layers.empty()) continue;
    b.model = gb;
    // Agreement by construction, checked: the stage holds the parameters the lowering counts, and
    // a bucket's layers are neighbours in the flat buffers.
    SEXTANT_CHECK(n == gb.params && hi - lo == n,
                  "gradient bucket of {} layers: {} parameters in [{}, {}), the lowering counts {}",
                  b.layers.size(), n, lo, hi, gb.params);
    const Group& group = gb.experts ? experts_ : replicas_;
    b.span = span_of(std::nullopt, lo, hi, group);
    b.index = static_cast<int32_t>(buckets_.size());
    largest = std::max(largest, b.span.shard * group.size);
    // (Also on one replica when the optimizer runs on the host: ZeRO-Offload copies each bucket
    // as it is ready, as the simulator prices it.)
    if (models::bucketed(gradients_)) buckets_.push_back(std::move(b));
  }
  padded_ = ctx_.backend->zeros({std::max<int64_t>(largest, 1)});
  int64_t largest_shard = 1;
  for (const Span& l : layers_) largest_shard = std::max(largest_shard, l.shard);
  for (const Bucket& b : buckets_) largest_shard = std::max(largest_shard, b.span.shard);
  shard_ = ctx_.backend->zeros({largest_shard + 1});
  if (store.compute().dtype() == DType::kBF16 && zero_ > 0 && dp_ > 1) {
    padded_low_ = ctx_.backend->empty({padded_.numel()}, DType::kBF16);
    shard_low_ = ctx_.backend->empty({shard_.numel()}, DType::kBF16);
  }
  if (zero_ == 0 || dp_ == 1) {
    owned_.push_back({0, store.total()});
  } else {
    for (const Span& s : zero_ == 3 ? layers_ : std::vector<Span>{}) {
      auto [b, e] = mine(s);
      if (b < e) owned_.push_back({b, e});
    }
    for (const Bucket& bucket : buckets_) {
      auto [b, e] = mine(bucket.span);
      if (b < e) owned_.push_back({b, e});
    }
    // Gradients no replica sums: each updates its own whole.
    if (whole_begin_ < store.total()) owned_.push_back({whole_begin_, store.total()});
  }
  // The optimizer's count, padding included (models::zero_updated_params): the padded shards of
  // the spans this rank updates a part of. Agreement by construction, checked: the simulator's
  // step prices the same count.
  if (zero_ == 0 || dp_ == 1) {
    updated_ = store.total();
  } else {
    for (const Span& s : zero_ == 3 ? layers_ : std::vector<Span>{}) updated_ += s.shard;
    for (const Bucket& bucket : buckets_) updated_ += bucket.span.shard;
    updated_ += store.total() - whole_begin_;
  }
  const int64_t counted =
      models::zero_updated_params(*ctx.plan, *ctx.lowered, ctx.groups->pp_rank, buckets);
  SEXTANT_CHECK(
      updated_ == counted,
      "stage {}: the ZeRO-{} shards of this rank hold {} parameters, the lowering counts {}",
      ctx.groups->pp_rank, zero_, updated_, counted);
  if (zero_ == 3 || gradients_ == models::LayerGradients::kBucketsEachPass)
    shard_grads_ = ctx_.backend->zeros({store.total()});
  if (compression_.any() && dp_ > 1) {
    // The codecs read and write host memory: the plan's executor check keeps them off devices.
    SEXTANT_CHECK(ctx_.backend->kind() == spec::ExecutorBackend::kCpu,
                  "gradient compression on the {} backend", ctx_.backend->name());
    if (compression_.kind == spec::CompressionKind::kPowersgd) {
      for (const Bucket& b : buckets_) powersgd_.push_back(powersgd_of(b));
    } else {
      int64_t words = 0;
      for (const Bucket& b : buckets_)
        words = std::max(words, models::encoded_words(compression_, b.span.end - b.span.begin));
      encoded_.resize(static_cast<size_t>(words));
      gathered_.resize(static_cast<size_t>(words * dp_));
    }
    if (compression_.error_feedback) residual_ = ctx_.backend->zeros({store.total()});
  }
}

std::unique_ptr<PowerSgdExchange> GradientSync::powersgd_of(const Bucket& b) const {
  // The bucket's weights of two or more dimensions as PyTorch's hook views them ([rows, ...] as
  // rows x rest), compressed where the lowering's rule says; everything else goes as it is.
  const int64_t rank = compression_.rank;
  std::vector<PowerSgdMatrix> matrices;
  std::vector<std::pair<int64_t, int64_t>> rest;
  models::GradientBucket held;  // the bucket as this stage holds it, for the lowering's split
  held.params = b.span.end - b.span.begin;
  for (const Param& p : stage_.params().params()) {
    const int64_t n = p.grad.numel();
    if (p.offset < b.span.begin || p.offset >= b.span.end) continue;
    const std::vector<int64_t>& shape = p.grad.shape();
    const models::WeightMatrix m{shape.front(), n / shape.front()};
    if (shape.size() >= 2) held.matrices.push_back(m);
    if (shape.size() >= 2 && models::powersgd_compresses(rank, m)) {
      matrices.push_back({p.name, p.offset, m.rows, m.cols});
    } else if (!rest.empty() && rest.back().second == p.offset) {
      rest.back().second += n;
    } else {
      rest.push_back({p.offset, p.offset + n});
    }
  }
  const models::PowerSgdSplit mine = models::powersgd_split(rank, held);
  // Agreement by construction, checked: the simulator prices the matrices this rank holds.
  const models::PowerSgdSplit lowered = models::powersgd_split(rank, b.model);
  SEXTANT_CHECK(mine == lowered,
                "PowerSGD bucket {}: this stage compresses {} matrices ({} elements, P {} Q {}), "
                "the lowering lists {} ({} elements, P {} Q {})",
                b.index, mine.matrices, mine.compressed, mine.p_elements, mine.q_elements,
                lowered.matrices, lowered.compressed, lowered.p_elements, lowered.q_elements);
  return std::make_unique<PowerSgdExchange>(rank, std::move(matrices), std::move(rest),
                                            kPowerSgdSeed);
}

size_t GradientSync::state_arrays() const {
  return (residual_.empty() ? 0 : 1) + (powersgd_.empty() ? 0 : 1);
}

std::vector<std::vector<float>> GradientSync::save_state() const {
  std::vector<std::vector<float>> out;
  if (!residual_.empty()) ctx_.backend->to_host(residual_, out.emplace_back());
  if (!powersgd_.empty()) {
    std::vector<float>& q = out.emplace_back(static_cast<size_t>(stage_.params().total()), 0.0f);
    for (const auto& bucket : powersgd_) bucket->save_q(q);
  }
  return out;
}

void GradientSync::load_state(const std::vector<std::vector<float>>& state) {
  SEXTANT_CHECK(state.size() == state_arrays(), "{} state arrays for {}", state.size(),
                state_arrays());
  size_t next = 0;
  if (!residual_.empty()) ctx_.backend->from_host(state[next++], residual_);
  if (!powersgd_.empty())
    for (const auto& bucket : powersgd_) bucket->load_q(state[next]);
}

std::pair<int64_t, int64_t> GradientSync::mine(const Span& s) const {
  const int64_t b = std::min(s.end, s.begin + s.group->rank * s.shard);
  return {b, std::min(s.end, b + s.shard)};
}

std::vector<int64_t> GradientSync::blocks(const Span& s) const {
  std::vector<int64_t> counts;
  for (int64_t r = 0; r < s.group->size; ++r) {
    const int64_t b = std::min(s.end, s.begin + r * s.shard);
    counts.push_back(std::min(s.end, b + s.shard) - b);
  }
  return counts;
}

std::vector<std::pair<int64_t, int64_t>> GradientSync::norm_ranges() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (zero_ >= 1) {
    for (auto [b, e] : owned_)
      if (b < whole_begin_) out.push_back({b, std::min(e, whole_begin_)});
  } else {
    if (replicas_.rank == 0 && expert_begin_ > 0) out.push_back({0, expert_begin_});
    if (experts_.rank == 0 && expert_begin_ < whole_begin_)
      out.push_back({expert_begin_, whole_begin_});
  }
  for (const Param& p : stage_.params().params())
    if (p.replica_whole && (!p.replica_copy || replicas_.rank == 0))
      out.push_back({p.offset, p.offset + p.grad.numel()});
  return out;
}

std::vector<const GradientSync::Span*> GradientSync::layer_spans(int32_t layer) const {
  std::vector<const Span*> out;
  for (const Span& s : layers_)
    if (s.layer == layer) out.push_back(&s);
  return out;
}

// Tied embeddings across stages are summed between the first and last stage before any data-
// parallel reduction, so their buckets wait for the end of the backward.
bool GradientSync::deferred(int32_t layer) const {
  return std::find(tied_layers_.begin(), tied_layers_.end(), layer) != tied_layers_.end();
}

void GradientSync::begin_step(int64_t step) {
  step_ = static_cast<uint64_t>(step);
  ctx_.backend->fill(stage_.params().grads(), 0.0f);
  if (!shard_grads_.empty()) ctx_.backend->fill(shard_grads_, 0.0f);
  for (Bucket& b : buckets_) {
    b.pending = static_cast<int32_t>(b.layers.size());
    b.reduced = false;
  }
}

models::StepOp GradientSync::reduction_of(const Span& s, int64_t element_bytes) const {
  return models::gradient_reduction(*ctx_.plan, s.end - s.begin, s.group == &experts_,
                                    element_bytes);
}

models::StepOp GradientSync::gather_of(const Span& s, int64_t element_bytes) const {
  return models::parameter_gather(*ctx_.plan, s.end - s.begin, s.group == &experts_, element_bytes);
}

void GradientSync::all_reduce_range(const Span& span, Phase phase) {
  auto s = ctx_.recorder->scope(
      ctx_.comm(reduction_of(span, 4), span.group->size, phase, std::nullopt, std::nullopt));
  span.group->comm->all_reduce(stage_.params().grads().data() + span.begin, span.end - span.begin);
}

namespace {

Tensor slice_of(const Tensor& flat, int64_t begin, int64_t n) {
  return flat.view({flat.numel()}).rows(begin, n);
}

}  // namespace

void GradientSync::gather_span(const Span& s, Phase phase) {
  // Experts no other rank holds: this rank's values are all of them (nothing to gather, as the
  // simulator prices it).
  if (s.group->size == 1) {
    stage_.params().refresh_compute(s.begin, s.end);
    return;
  }
  // Each rank contributes its block (from the authoritative values) and receives all of them.
  Backend& be = *ctx_.backend;
  Tensor& values = stage_.params().values();
  const auto [mine_begin, mine_end] = mine(s);
  if (!padded_low_.empty()) {
    gather_span_low(s, phase, mine_begin, mine_end);
    return;
  }
  if (s.group->comm->uneven_collectives()) {
    // Every rank's block lands where it belongs, this rank's already there: nothing to copy.
    auto sc = ctx_.recorder->scope(
        ctx_.comm(gather_of(s, 4), s.group->size, phase, s.layer, std::nullopt));
    s.group->comm->all_gather_v_in_place(values.data() + s.begin, blocks(s));
    stage_.params().refresh_compute(s.begin, s.end);
    return;
  }
  Tensor block = slice_of(shard_, 0, s.shard);
  be.fill(block, 0.0f);
  if (mine_end > mine_begin) {
    Tensor dst = slice_of(shard_, 0, mine_end - mine_begin);
    be.copy(slice_of(values, mine_begin, mine_end - mine_begin), dst);
  }
  {
    // Bytes of the parameters gathered (the padding of the last block is not counted).
    auto sc = ctx_.recorder->scope(
        ctx_.comm(gather_of(s, 4), s.group->size, phase, s.layer, std::nullopt));
    s.group->comm->all_gather(block.data(), padded_.data(), s.shard);
  }
  Tensor dst = slice_of(values, s.begin, s.end - s.begin);
  be.copy(slice_of(padded_, 0, s.end - s.begin), dst);
  stage_.params().refresh_compute(s.begin, s.end);  // ZeRO-3 gathers on use, after the update
}

// The same in the compute type (bf16): each rank rounds its block of the master values, the
// blocks are all-gathered in 2 bytes an element into the compute copy, and the other ranks'
// blocks are widened into the master values, where nothing reads them as masters (each rank
// updates only its own) but a checkpoint restores the compute copy from them, bit for bit. The
// compute copy ends as refresh_compute would leave it after an fp32 gather: to_bf16 of every
// master value.
void GradientSync::gather_span_low(const Span& s, Phase phase, int64_t mine_begin,
                                   int64_t mine_end) {
  Backend& be = *ctx_.backend;
  ParamStore& store = stage_.params();
  const int64_t n = s.end - s.begin;
  Tensor block = slice_of(shard_low_, 0, s.shard);
  be.fill(block, 0.0f);
  if (mine_end > mine_begin) {
    Tensor dst = slice_of(shard_low_, 0, mine_end - mine_begin);
    be.copy(slice_of(store.values(), mine_begin, mine_end - mine_begin), dst);
  }
  {
    auto sc = ctx_.recorder->scope(ctx_.comm(gather_of(s, element_size(DType::kBF16)),
                                             s.group->size, phase, s.layer, std::nullopt));
    s.group->comm->all_gather_bf16(static_cast<const uint16_t*>(block.raw()),
                                   static_cast<uint16_t*>(padded_low_.raw()), s.shard);
  }
  Tensor compute = slice_of(store.compute(), s.begin, n);
  be.copy(slice_of(padded_low_, 0, n), compute);
  // The others' blocks: [s.begin, mine_begin) and [mine_end, s.end).
  const int64_t own_begin = std::clamp(mine_begin, s.begin, s.end);
  const int64_t own_end = std::clamp(mine_end, own_begin, s.end);
  for (auto [b, e] : {std::pair{s.begin, own_begin}, std::pair{own_end, s.end}}) {
    if (e <= b) continue;
    Tensor to = slice_of(store.values(), b, e - b);
    be.copy(slice_of(padded_low_, b - s.begin, e - b), to);
  }
}

void GradientSync::reduce_scatter_span(const Span& s, Tensor& into, bool accumulate) {
  Backend& be = *ctx_.backend;
  Tensor& grads = stage_.params().grads();
  if (s.group->size == 1) {  // the rank's own experts: the sum is its gradient
    Tensor target = slice_of(into, s.begin, s.end - s.begin);
    if (accumulate) {
      be.add(target, slice_of(grads, s.begin, s.end - s.begin), target);
    } else {
      be.copy(slice_of(grads, s.begin, s.end - s.begin), target);
    }
    return;
  }
  Tensor block = slice_of(shard_, 0, s.shard);
  if (s.group->comm->uneven_collectives()) {
    // The span's gradients as they lie, each rank's block of its own size: no padded copy.
    auto sc = ctx_.recorder->scope(
        ctx_.comm(reduction_of(s, 4), s.group->size, Phase::kBwd, s.layer, std::nullopt));
    s.group->comm->reduce_scatter_v(grads.data() + s.begin, block.data(), blocks(s));
  } else {
    Tensor padded = slice_of(padded_, 0, s.shard * s.group->size);
    be.fill(padded, 0.0f);
    Tensor head = slice_of(padded_, 0, s.end - s.begin);
    be.copy(slice_of(grads, s.begin, s.end - s.begin), head);
    auto sc = ctx_.recorder->scope(
        ctx_.comm(reduction_of(s, 4), s.group->size, Phase::kBwd, s.layer, std::nullopt));
    s.group->comm->reduce_scatter(padded_.data(), block.data(), s.shard);
  }
  const auto [mine_begin, mine_end] = mine(s);
  if (mine_end > mine_begin) {
    Tensor target = slice_of(into, mine_begin, mine_end - mine_begin);
    Tensor sum = slice_of(shard_, 0, mine_end - mine_begin);
    if (accumulate) {
      be.add(target, sum, target);
    } else {
      be.copy(sum, target);
    }
  }
}

void GradientSync::before_forward(int32_t layer, int64_t micro_batch) {
  parameters_for(layer, Phase::kFwd, micro_batch);
}

void GradientSync::before_backward(int32_t layer, int64_t micro_batch) {
  parameters_for(layer, Phase::kBwd, micro_batch);
}

void GradientSync::parameters_for(int32_t layer, Phase phase, int64_t micro_batch) {
  if (models::layer_parameters(*ctx_.plan) != models::LayerParameters::kGatheredEachPass) return;
  SEXTANT_CHECK(dp_ > 1 || fetch_, "layer {}: ZeRO-3 on one replica without a parameter fetch",
                layer);
  for (const Span* s : layer_spans(layer)) {
    if (fetch_) fetch_parameters(*s, phase, micro_batch);
    if (dp_ > 1) {
      gather_span(*s, phase);
    } else {
      stage_.params().refresh_compute(s->begin, s->end);
    }
  }
}

void GradientSync::fetch_parameters(const Span& s, Phase phase, int64_t micro_batch) {
  // The shard's size as the simulator counts it (the padded block, as the gather's).
  auto sc = ctx_.recorder->scope(
      ctx_.offload(models::parameters_to_device(s.shard, 4), phase, s.layer, micro_batch));
  const auto [begin, end] = mine(s);
  if (begin >= end) return;
  Tensor to = slice_of(stage_.params().values(), begin, end - begin);
  fetch_(begin, end, to);
}

void GradientSync::layer_gradients_to_host(const Span& s, const Tensor& from, int64_t micro_batch) {
  auto sc = ctx_.recorder->scope(
      ctx_.offload(models::gradients_to_host(s.shard, 4), Phase::kBwd, s.layer, micro_batch));
  const auto [begin, end] = mine(s);
  if (begin >= end) return;
  Tensor to = slice_of(*host_grads_, begin, end - begin);
  ctx_.backend->copy(slice_of(from, begin, end - begin), to);
}

void GradientSync::reduce_sequence_parallel(Tensor& grads) {
  // Under sequence parallelism each tp rank saw only its rows: the gradients of the tensors all
  // tp ranks share (norms, row-parallel biases, positions) are partial sums, summed over the tp
  // group in one coalesced all-reduce, as Megatron-LM's finalize_model_grads does (and as the
  // simulator prices it: models::Layer::sp_partial_params). On a 3D tensor grid each z slice saw
  // only its sequences: the gradients of what the slices hold alike (all but the weight blocks,
  // whose layers reduce-scatter theirs) are summed over z the same way (AxoNN's depth-parallel
  // gradient sync).
  const std::optional<models::StepOp> sum =
      models::partial_gradient_sum(*ctx_.plan, *ctx_.lowered, ctx_.groups->pp_rank, 4);
  if (!sum) return;
  const bool grid = sum->group == models::StepGroup::kDepth;
  Communicator& group = grid ? *ctx_.groups->grid[2].comm : *ctx_.groups->tp;
  std::vector<const Param*> partial;
  int64_t n = 0;
  for (const Param& p : stage_.params().params()) {
    if (grid ? p.grid_sharded : !p.tp_partial) continue;
    partial.push_back(&p);
    n += p.grad.numel();
  }
  // Agreement by construction, checked: the simulator prices the sum the program counts.
  SEXTANT_CHECK(n == sum->elements,
                "stage {}: {} partial gradients to sum over {}, the step program counts {}",
                ctx_.groups->pp_rank, n, grid ? "z" : "tp", sum->elements);
  Backend& be = *ctx_.backend;
  Tensor packed = be.empty({n});
  int64_t at = 0;
  for (const Param* p : partial) {
    Tensor dst = slice_of(packed, at, p->grad.numel());
    be.copy(slice_of(grads, p->offset, p->grad.numel()), dst);
    at += p->grad.numel();
  }
  {
    auto s = ctx_.recorder->scope(
        ctx_.comm(*sum, group.size(), Phase::kBwd, std::nullopt, std::nullopt));
    group.all_reduce(packed.data(), n);
  }
  at = 0;
  for (const Param* p : partial) {
    Tensor dst = slice_of(grads, p->offset, p->grad.numel());
    be.copy(slice_of(packed, at, p->grad.numel()), dst);
    at += p->grad.numel();
  }
}

void GradientSync::after_backward(int32_t layer, int64_t micro_batch) {
  const models::GradientHandoff handoff =
      models::gradient_handoff(*ctx_.plan, gradients_, micro_batch, micro_batches_);
  SEXTANT_CHECK(!handoff.to_host || host_grads_ != nullptr,
                "layer {}: the optimizer's host gradients are unset", layer);
  if (handoff.scatter) {
    if (deferred(layer)) return;  // tied: summed across stages first, at the end of backward
    // Hand this micro-batch's gradient of the layer to the owners of its shards, then start
    // the next micro-batch from zero. (Sequence-parallel partial sums are linear: summed over
    // tp on the shards at the end.)
    for (const Span* s : layer_spans(layer)) {
      reduce_scatter_span(*s, shard_grads_, true);
      Tensor zero = slice_of(stage_.params().grads(), s->begin, s->end - s->begin);
      ctx_.backend->fill(zero, 0.0f);
      if (handoff.to_host) layer_gradients_to_host(*s, shard_grads_, micro_batch);
    }
  } else if (handoff.to_host) {
    // One replica: its gradients are whole; they leave once the step's last backward made them.
    for (const Span* s : layer_spans(layer))
      layer_gradients_to_host(*s, stage_.params().grads(), micro_batch);
  } else if (handoff.count_buckets) {
    for (Bucket& b : buckets_) {
      if (b.after_tied_sum || std::find(b.layers.begin(), b.layers.end(), layer) == b.layers.end())
        continue;
      if (--b.pending != 0) continue;
      reduce_bucket(b, true, handoff.accumulate_shard ? micro_batch : micro_batches_ - 1);
      if (handoff.accumulate_shard) b.pending = static_cast<int32_t>(b.layers.size());
    }
  }
}

void GradientSync::gradients_to_host(const Span& s, const Tensor& from, int64_t micro_batch) {
  // The shard's size as the simulator counts it (the padded block; the last rank's may be short).
  auto sc = ctx_.recorder->scope(
      ctx_.offload(models::gradients_to_host(s.shard, 4), Phase::kBwd, std::nullopt, micro_batch));
  const auto [begin, end] = mine(s);
  if (begin >= end) return;
  Tensor to = slice_of(*host_grads_, begin, end - begin);
  ctx_.backend->copy(slice_of(from, begin, end - begin), to);
}

void GradientSync::reduce_bucket(Bucket& b, bool during_backward, int64_t micro_batch) {
  b.reduced = true;
  Tensor& grads = stage_.params().grads();
  // Experts no other rank holds, or one replica: nothing to sum (the simulator prices none
  // either); ZeRO-Offload still hands the bucket to the host.
  if (b.span.group->size == 1) {
    if (host_grads_ != nullptr) gradients_to_host(b.span, grads, micro_batch);
    return;
  }
  if (gradients_ == models::LayerGradients::kBucketsEachPass) {
    // ZeRO-2 over micro-batches: this micro-batch's sum joins the rank's shard, and the bucket
    // starts the next micro-batch from zero; after the last, the shard is the rank's block of
    // the step's gradients (the host pool takes the running sum each time, the last one whole).
    reduce_scatter_span(b.span, shard_grads_, true);
    Tensor filled = slice_of(grads, b.span.begin, b.span.end - b.span.begin);
    ctx_.backend->fill(filled, 0.0f);
    if (models::completes_gradients(*ctx_.plan, micro_batch, micro_batches_)) {
      const auto [begin, end] = mine(b.span);
      if (begin < end) {
        Tensor block = slice_of(grads, begin, end - begin);
        ctx_.backend->copy(slice_of(shard_grads_, begin, end - begin), block);
      }
    }
    if (host_grads_ != nullptr) gradients_to_host(b.span, shard_grads_, micro_batch);
  } else if (compression_.any()) {
    compressed_reduce(b);
  } else if (zero_ >= 1) {
    // ZeRO-1/2: this rank's block of the sum replaces its gradients; the rest is not read again.
    reduce_scatter_span(b.span, grads, false);
    if (host_grads_ != nullptr) gradients_to_host(b.span, grads, micro_batch);
  } else if (during_backward) {
    // Drained: on NCCL the bucket runs on a stream of its own, timed to its end.
    auto s = ctx_.recorder->scope(ctx_.comm(reduction_of(b.span, 4), b.span.group->size,
                                            Phase::kBwd, std::nullopt, std::nullopt),
                                  true);
    b.request = b.span.group->comm->all_reduce_async(stage_.params().grads().data() + b.span.begin,
                                                     b.span.end - b.span.begin);
  } else {
    all_reduce_range(b.span, Phase::kBwd);
  }
}

namespace {

// SparCML's sum of a bucket's top-k pairs, by either algorithm, after the encode.
class SparseExchange {
 public:
  void start(spec::SparseAlgorithm algorithm, Communicator& replicas, int64_t n,
             const uint32_t* encoded, int64_t k) {
    if (algorithm == spec::SparseAlgorithm::kSplitAllGather) {
      ranges_.emplace(replicas, n, encoded, k);
    } else {
      doubling_.emplace(replicas, n, encoded, k);
    }
  }
  bool active() const { return doubling_ || ranges_; }

  // Runs op `id` (models::compressed_exchange_ops) and returns the bytes it moved: what the unions
  // and ranges weigh, not the model's expectation. The decode writes the sum to `grads`.
  int64_t run(OpId id, const std::string& name, float* grads, int64_t n) {
    if (ranges_) {
      if (id == OpId::kDpSparseSplit) return ranges_->split();
      if (id == OpId::kDpSparseMerge) return ranges_->merge();
      if (id == OpId::kDpSparseGather) return ranges_->gather();
      SEXTANT_CHECK(id == OpId::kDpDecompress, "SparCML's split all-gather has no op {}", name);
      ranges_->write(grads);
      return ranges_->decode_bytes(4);
    }
    if (id == OpId::kDpSparseExchange) return doubling_->exchange(round_++);
    if (id == OpId::kDpSparseMerge) return doubling_->merge();
    SEXTANT_CHECK(id == OpId::kDpDecompress, "SparCML has no op {}", name);
    doubling_->write(grads);
    return models::sparse_decode_bytes(n, doubling_->pairs(), doubling_->dense(), 4);
  }

 private:
  std::optional<SparseAllReduce> doubling_;
  std::optional<SparseSplitAllGather> ranges_;
  int round_ = 0;
};

}  // namespace

void GradientSync::compressed_reduce(const Bucket& b) {
  const int64_t n = b.span.end - b.span.begin;
  const int64_t words = models::encoded_words(compression_, n);
  float* all_grads = stage_.params().grads().data();
  float* residual = compression_.error_feedback ? residual_.data() : nullptr;
  float* grads = all_grads + b.span.begin;
  PowerSgdExchange* power =
      powersgd_.empty() ? nullptr : powersgd_[static_cast<size_t>(b.index)].get();
  const AllReduceFn all_reduce = [&](float* data, int64_t count) {
    ctx_.groups->replicas->all_reduce(data, count);
  };
  SparseExchange sparse;  // SparCML's, from its encode on
  // The ops the simulator prices, run in its order under its names.
  for (const models::Op& op : models::compressed_exchange_ops(compression_, b.model, dp_, 4)) {
    auto s = ctx_.recorder->scope(ctx_.comm(op.id, op.op_class, Stream::kDpComm, op.bytes, dp_,
                                            Phase::kBwd, std::nullopt, std::nullopt));
    const OpId id = op.id;
    if (sparse.active()) {
      s.set_bytes(sparse.run(id, op.name, grads, n));
    } else if (power != nullptr) {
      if (id == OpId::kDpAllReduce) {
        power->all_reduce_uncompressed(all_grads, all_reduce);
      } else if (id == OpId::kDpCompress) {
        power->compress(all_grads, residual);
      } else if (id == OpId::kDpPowerSgdPAllReduce) {
        power->all_reduce_p(all_reduce);
      } else if (id == OpId::kDpPowerSgdProject) {
        power->project(all_grads, residual);
      } else if (id == OpId::kDpPowerSgdQAllReduce) {
        power->all_reduce_q(all_reduce);
      } else {
        SEXTANT_CHECK(id == OpId::kDpDecompress, "PowerSGD has no op {}", op.name);
        power->decompress(all_grads, residual);
      }
    } else if (id == OpId::kDpCompress) {
      const float* values = grads;
      if (residual != nullptr) {
        for (int64_t i = 0; i < n; ++i) residual[b.span.begin + i] += grads[i];
        values = residual + b.span.begin;
      }
      // Each rank rounds with its own draws (the ranks' rounding errors are independent).
      const uint64_t seed = (step_ << 40) ^ (static_cast<uint64_t>(b.index) << 20) ^
                            static_cast<uint64_t>(ctx_.groups->world->rank());
      encode_gradients(compression_, values, n, encoded_.data(), seed);
      // What was sent leaves the residual; what the encoding dropped stays for the next step.
      if (residual != nullptr)
        add_decoded(compression_, encoded_.data(), n, residual + b.span.begin, -1.0f);
      if (compression_.kind == spec::CompressionKind::kSparcml)
        sparse.start(compression_.sparse_algorithm, *ctx_.groups->replicas, n, encoded_.data(),
                     words / 2);
    } else if (id == OpId::kDpCompressedAllGather) {
      // The words travel as floats: MPI and NCCL gathers copy them bit for bit.
      ctx_.groups->replicas->all_gather(reinterpret_cast<const float*>(encoded_.data()),
                                        reinterpret_cast<float*>(gathered_.data()), words);
    } else {
      SEXTANT_CHECK(id == OpId::kDpDecompress, "compressed exchange has no op {}", op.name);
      std::fill(grads, grads + n, 0.0f);
      for (int64_t r = 0; r < dp_; ++r)
        add_decoded(compression_, gathered_.data() + r * words, n, grads);
    }
  }
}

void GradientSync::reduce_tied() {
  if (ctx_.groups->embedding == nullptr) return;
  const std::optional<models::StepOp> sum =
      models::tied_table_sum(*ctx_.plan, *ctx_.lowered, ctx_.groups->pp_rank, 4);
  for (Param& p : stage_.params().params()) {
    if (!p.tied_copy && p.name != "embed.table") continue;
    SEXTANT_CHECK(sum && sum->elements == p.grad.numel(),
                  "stage {}: a tied table of {} parameters, the step program sums {}",
                  ctx_.groups->pp_rank, p.grad.numel(), sum ? sum->elements : 0);
    auto s = ctx_.recorder->scope(ctx_.comm(*sum, 2, Phase::kBwd, p.layer, std::nullopt));
    ctx_.groups->embedding->all_reduce(p.grad.data(), p.grad.numel());
  }
}

void GradientSync::finish_backward() {
  const bool sharded_layers = gradients_ == models::LayerGradients::kScatteredEachPass;
  Tensor& reduced = sharded_layers ? shard_grads_ : stage_.params().grads();
  // The simulator's order (models::backward_tail).
  for (models::TailStep step : models::backward_tail()) {
    switch (step) {
      case models::TailStep::kUntiedBuckets:
        finish_buckets(false);
        break;
      case models::TailStep::kTiedTableSum:
        reduce_tied();
        break;
      case models::TailStep::kTiedBuckets:
        // ZeRO-3 kept the tied layers whole: their reduce-scatter now.
        if (sharded_layers) {
          for (const Span& s : layers_)
            if (deferred(static_cast<int32_t>(*s.layer)))
              reduce_scatter_span(s, shard_grads_, true);
        }
        finish_buckets(true);
        break;
      case models::TailStep::kPartialGradientSum:
        // After every data-parallel reduction: none may still be writing the gradients.
        reduce_sequence_parallel(reduced);
        break;
    }
  }
  // ZeRO-3 hands the reduced shards over to the optimizer.
  if (sharded_layers) ctx_.backend->copy(shard_grads_, stage_.params().grads());
  resend_sequence_parallel_sums();
}

void GradientSync::finish_buckets(bool tied) {
  // Buckets not reduced during the backward (no overlap, or a tied table's), in order; those
  // launched during it (and for MPI completed when ready) are waited for.
  for (Bucket& b : buckets_) {
    if (b.after_tied_sum != tied) continue;
    if (b.request) {
      b.request->wait();
      b.request.reset();
    } else if (!b.reduced) {
      reduce_bucket(b, false, micro_batches_ - 1);
    }
  }
}

void GradientSync::resend_sequence_parallel_sums() {
  if (host_grads_ == nullptr || !ctx_.sequence_parallel || ctx_.groups->tp_size == 1) return;
  // The sequence-parallel sums came after their buckets (or layers) left for the host: the host
  // pool takes the summed values of those parameters again (the simulator counts them in the
  // buckets' and layers' copies).
  for (const Param& p : stage_.params().params()) {
    if (!p.tp_replicated) continue;
    for (auto [b, e] : owned_) {
      const int64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.grad.numel());
      if (lo >= hi) continue;
      Tensor to = slice_of(*host_grads_, lo, hi - lo);
      ctx_.backend->copy(slice_of(stage_.params().grads(), lo, hi - lo), to);
    }
  }
}

void GradientSync::after_update() {
  // ZeRO-3 gathers on use (parameters_for).
  if (models::layer_parameters(*ctx_.plan) != models::LayerParameters::kGatheredAfterUpdate) return;
  for (const Bucket& b : buckets_)
    if (b.span.group->size > 1) gather_span(b.span, Phase::kOpt);
}

}  // namespace sextant::exec
