// The layout suite: every layout Sextant's executor runs, on small models, as the multi-rank
// equivalence test runs them (tests/exec/layout_equivalence_test.cpp) and docs/SUPPORT.md lists
// them.
#include "layout_suite.hpp"

#include <map>
#include <string>

#include "sextant/models/lowering.hpp"
#include "sextant/spec/channel_split.hpp"
#include "sextant/spec/stack.hpp"

namespace sextant::layout_suite {

spec::ModelSpec tiny_gpt() {
  spec::ModelSpec m;
  m.name = "gpt-test";
  spec::TransformerSpec t;
  t.layers = 4;
  t.hidden = 32;
  t.heads = 4;
  t.kv_heads = 4;
  t.ffn_hidden = 64;
  t.vocab = 64;
  t.seq_len = 16;
  t.max_positions = 16;
  t.tied_embeddings = true;
  t.position_embedding = spec::PositionEmbedding::kLearned;
  m.body = t;
  return m;
}

// Llama-style: RMSNorm, rotary embeddings, SwiGLU, no biases, untied output layer, and
// grouped-query attention (4 q heads share 2 kv heads; tp2 gives each rank one kv head).
spec::ModelSpec tiny_llama() {
  spec::ModelSpec m = tiny_gpt();
  m.name = "llama-test";
  spec::TransformerSpec& t = std::get<spec::TransformerSpec>(m.body);
  t.kv_heads = 2;
  t.norm = spec::Norm::kRmsNorm;
  t.position_embedding = spec::PositionEmbedding::kRope;
  t.max_positions = 0;
  t.activation = spec::Activation::kSwiglu;
  t.bias = false;
  t.tied_embeddings = false;
  return m;
}

// llama-test with a vocabulary of 256, the padded vocabulary of every tp up to 2 (stacks/
// sextant.json: 128 x tp rows): split over up to 8 ranks by the logits' per-op splits, each rank
// holds real tokens.
spec::ModelSpec tiny_llama_wide_vocab() {
  spec::ModelSpec m = tiny_llama();
  m.name = "llama-vocab-test";
  std::get<spec::TransformerSpec>(m.body).vocab = 256;
  return m;
}

// A mixture of experts (exec/src/moe/moe_layer.hpp): llama-test with 8 experts of 16 (top-2, one
// shared expert) in its last three blocks, split over up to 8 expert-parallel ranks.
spec::ModelSpec tiny_moe() {
  spec::ModelSpec m = tiny_llama();
  m.name = "moe-test";
  spec::MoeSpec moe;
  moe.experts = 8;
  moe.top_k = 2;
  moe.expert_ffn_hidden = 16;
  moe.shared_experts = 1;
  moe.dense_layers = 1;
  std::get<spec::TransformerSpec>(m.body).moe = moe;
  return m;
}

// moe-test with a capacity factor of 1 (exec/src/moe/moe_layer.hpp): each expert takes at most its
// even share of a micro-batch's copies on a rank, the rest dropped by weight.
spec::ModelSpec tiny_moe_capacity() {
  spec::ModelSpec m = tiny_moe();
  m.name = "moe-capacity-test";
  std::get<spec::TransformerSpec>(m.body).moe->capacity_factor = 1.0;
  return m;
}

// A vocabulary tp does not divide (GPT-2's 50257 is odd): the executor pads it to a multiple of tp,
// the padded rows compute nothing, and every layout still trains the single-rank model.
spec::ModelSpec tiny_gpt_odd_vocab() {
  spec::ModelSpec m = tiny_gpt();
  m.name = "gpt-odd-vocab-test";
  std::get<spec::TransformerSpec>(m.body).vocab = 63;
  return m;
}

spec::ModelSpec tiny_mlp() {
  spec::ModelSpec m;
  m.name = "mlp-test";
  spec::MlpSpec s;
  s.widths = {16, 32, 32, 32, 8};
  m.body = s;
  return m;
}

// A small ResNet: a 3x3 stem with batch norm and ReLU, a 3/2/1 max pool, two bottleneck stages
// (the second strided, with its projection shortcut), adaptive average pool, fc classifier, on
// 16x16 images; every window of a 2x2 grid has a halo and every map splits.
spec::ModelSpec tiny_cnn() {
  spec::ModelSpec m;
  m.name = "resnet-test";
  spec::CnnSpec c;
  c.in_channels = 3;
  c.height = c.width = 16;
  using K = spec::CnnLayerKind;
  spec::CnnLayer stem{K::kConv, 8};
  stem.kernel = 3;
  stem.padding = 1;
  stem.batch_norm = stem.relu = true;
  spec::CnnLayer pool{K::kMaxPool};
  pool.kernel = 3;
  pool.stride = 2;
  pool.padding = 1;
  spec::CnnLayer stage1{K::kBottleneck, 16, 4, 2};
  spec::CnnLayer stage2{K::kBottleneck, 32, 8, 1};
  stage2.stride = 2;
  spec::CnnLayer gap{K::kAdaptiveAvgPool};
  spec::CnnLayer fc{K::kFc};
  fc.out_features = 10;
  fc.bias = true;
  c.layers = {stem, pool, stage1, stage2, gap, fc};
  m.body = c;
  return m;
}

// A VGG-style net: convolutions with biases and no batch norm, a 2x2 max pool, an adaptive pool to
// 2x2 and two fc layers (ReLU between). Under tp 2 its 8->8 convolution runs stationary-x (the
// bias added after the reduce-scatter), under tp 4 and 8 stationary-w (the bias after the reduce
// group's reduce-scatter), its 8->16 one stationary-y, the first fc reads split rows and the
// second is whole.
spec::ModelSpec tiny_vgg() {
  spec::ModelSpec m;
  m.name = "vgg-test";
  spec::CnnSpec c;
  c.in_channels = 3;
  c.height = c.width = 12;
  using K = spec::CnnLayerKind;
  auto conv = [](int64_t out) {
    spec::CnnLayer l{K::kConv, out};
    l.kernel = 3;
    l.padding = 1;
    l.bias = l.relu = true;
    return l;
  };
  spec::CnnLayer pool{K::kMaxPool};
  pool.kernel = pool.stride = 2;
  spec::CnnLayer gap{K::kAdaptiveAvgPool};
  gap.output = 2;
  spec::CnnLayer fc1{K::kFc}, fc2{K::kFc};
  fc1.out_features = 32;
  fc1.bias = fc1.relu = fc2.bias = true;
  fc2.out_features = 10;
  c.layers = {conv(8), conv(8), pool, conv(16), gap, fc1, fc2};
  m.body = c;
  return m;
}

// A 2D U-Net (tests/pytorch/unet-tiny.json, which PyTorch checks): a kept 3x3 convolution with
// batch norm, a max pool, a 3x3 convolution, an up-convolution, the cropped concat, a 3x3
// convolution and a 1x1 per-pixel head of 3 classes, on 2x16x16 images (8x8 labels).
spec::ModelSpec tiny_unet() {
  return spec::read_model_file(std::string(SEXTANT_SOURCE_DIR) + "/tests/pytorch/unet-tiny.json");
}
// Its 3D form (tests/pytorch/unet3d-tiny.json, which PyTorch checks): 3x3x3 convolutions, the
// first padded by 1 (the depth's padding), a 2x2x2 pool and up-convolution, the kept volume's
// centre crop along depth, rows and columns, on 2x8x10x10 volumes (2x4x4 labels).
spec::ModelSpec tiny_unet3d() {
  return spec::read_model_file(std::string(SEXTANT_SOURCE_DIR) + "/tests/pytorch/unet3d-tiny.json");
}

spec::Plan plan_of(int64_t dp, int64_t tp, int64_t pp, int zero, bool sp, spec::Schedule schedule) {
  spec::Plan p;
  if (schedule == spec::Schedule::kInterleaved) p.virtual_stages = 2;
  p.dp = dp;
  p.tp = tp;
  p.pp = pp;
  p.zero = zero;
  p.sequence_parallel = sp;
  p.schedule = schedule;
  p.micro_batch = 1;
  p.global_batch = 8;
  p.stack = spec::builtin_stack("sextant");
  p.stack->dp_bucket_bytes = 2048;  // several buckets even for the tiny model
  return p;
}

// Asynchronous PipeDream: each step one micro-batch per replica, updated after each backward.
spec::Plan pipedream(int64_t dp, int64_t tp, int64_t pp) {
  spec::Plan p = plan_of(dp, tp, pp, 0, false, spec::Schedule::kPipeDream);
  p.micro_batch = p.global_batch / dp;
  return p;
}

// GEMS' two replicas of the stages, each taking half the micro-batches.
spec::Plan gems(spec::Plan p) {
  p.schedule = spec::Schedule::kGems;
  return p;
}

// Through parameter servers, workers `staleness` steps ahead.
spec::Plan servers(spec::Plan p, int64_t staleness) {
  p.parameter_server = {true, staleness};
  return p;
}

spec::ModelSpec model_of(Net n) {
  switch (n) {
    case Net::kMlp:
      return tiny_mlp();
    case Net::kLlama:
      return tiny_llama();
    case Net::kLlamaWideVocab:
      return tiny_llama_wide_vocab();
    case Net::kGptOddVocab:
      return tiny_gpt_odd_vocab();
    case Net::kCnn:
      return tiny_cnn();
    case Net::kVgg:
      return tiny_vgg();
    case Net::kUnet:
      return tiny_unet();
    case Net::kUnet3d:
      return tiny_unet3d();
    case Net::kUnetTall:
      return spec::read_model_file(std::string(SEXTANT_SOURCE_DIR) +
                                   "/tests/pytorch/unet-tall-tiny.json");
    case Net::kVolumeClassifier:
      return spec::read_model_file(std::string(SEXTANT_SOURCE_DIR) +
                                   "/tests/pytorch/volume-classifier-tiny.json");
    case Net::kAmoeba:
      // AmoebaNet-D's cells (tests/pytorch/amoebanet-tiny.json, which PyTorch checks): a stem,
      // reduction and normal cells of 8 then 16 filters, global pool and classifier.
      return spec::read_model_file(std::string(SEXTANT_SOURCE_DIR) +
                                   "/tests/pytorch/amoebanet-tiny.json");
    case Net::kInception:
      // Inception-v3's five modules narrowed 16-fold (tests/pytorch/inception-tiny.json, which
      // PyTorch checks): a stem conv, modules a to e, global pool and classifier.
      return spec::read_model_file(std::string(SEXTANT_SOURCE_DIR) +
                                   "/tests/pytorch/inception-tiny.json");
    case Net::kMoe:
      return tiny_moe();
    case Net::kMoeCapacity:
      return tiny_moe_capacity();
    case Net::kGpt:
      break;
  }
  return tiny_gpt();
}

// Each sequence over `cp` ranks, keys and values all-gathered (Llama 3), or heads traded for rows
// by all-to-alls (DeepSpeed-Ulysses): the algorithms the executor runs.
spec::Plan with_cp(spec::Plan p, int64_t cp,
                   spec::ContextAlgorithm algorithm = spec::ContextAlgorithm::kAllGather) {
  p.cp = cp;
  p.cp_algorithm = algorithm;
  return p;
}

// Ring attention: the key/value blocks passed around the cp ranks, each step's flash output
// merged by its log-sum-exp (exec/blockwise_attention.hpp), which the plan's stack has to name.
spec::Plan with_ring(spec::Plan p, int64_t cp) {
  p = with_cp(std::move(p), cp, spec::ContextAlgorithm::kRing);
  p.stack->attention = spec::AttentionKernel::kFlash2;
  return p;
}

// The attention core as one fused kernel (the stack's flash2; FlashAttention-2's algorithm:
// exec/blockwise_attention.hpp on CPU ranks, exec/src/cuda/flash_attention.cu on GPUs).
spec::Plan with_flash(spec::Plan p) {
  p.stack->attention = spec::AttentionKernel::kFlash2;
  return p;
}

// AxoNN's 3D tensor grid over the plan's tp = x * y * z ranks (exec/src/gpt/grid_linear.hpp), with
// micro-batches of z sequences, one per z slice.
spec::Plan with_grid(spec::Plan p, int64_t x, int64_t y, int64_t z) {
  p.tp_grid = {x, y, z};
  p.micro_batch = z;
  return p;
}

spec::Plan split(spec::Plan p, int64_t h, int64_t w, int64_t d = 1) {
  p.spatial = {h, w, d};
  return p;
}

// The plan's own algorithm for each convolution of `net` under its channel split
// (Plan::channel_algorithms): each one the byte rule does not take, x -> y -> w -> x on a tp
// with a grid, x <-> y otherwise.
spec::Plan other_algorithms(spec::Plan p, Net net) {
  using A = spec::ChannelAlgorithm;
  models::LoweringOptions o;
  o.micro_batch = p.micro_batch;
  o.dtype = spec::Dtype::kFp32;
  o.tp = p.tp;
  const bool grid = spec::channel_filter_grid(p.tp).any();
  for (A a : models::lower(model_of(net), o).channel_algorithms) {
    if (a == A::kStationaryX) p.channel_algorithms.push_back(A::kStationaryY);
    if (a == A::kStationaryY)
      p.channel_algorithms.push_back(grid ? A::kStationaryW : A::kStationaryX);
    if (a == A::kStationaryW) p.channel_algorithms.push_back(A::kStationaryX);
  }
  return p;
}

// ZeRO-Offload: the optimizer's shard on the host pool (exec/src/train/trainer_host.cpp).
spec::Plan offloaded(spec::Plan p) {
  p.offload.optimizer = spec::OffloadTarget::kHost;
  return p;
}

// ZeRO-Infinity's optimizer states on NVMe: the rank's shard of the master weights and moments
// in a file between steps, read before the host step and written after it (nvme_file.hpp).
spec::Plan nvme_offloaded(spec::Plan p) {
  p.offload.optimizer = spec::OffloadTarget::kNvme;
  return p;
}

// ZeRO-Infinity: the parameters on the host pool too, each shard fetched before its layer's
// gather (zero 3).
spec::Plan parameters_offloaded(spec::Plan p) {
  p = offloaded(std::move(p));
  p.offload.params = spec::OffloadTarget::kHost;
  return p;
}

// ZeRO-Infinity's parameters on NVMe: each shard read from the rank's parameters file before its
// layer's gather (zero 3), beside the optimizer `p` offloads.
spec::Plan parameters_on_nvme(spec::Plan p) {
  p.offload.params = spec::OffloadTarget::kNvme;
  return p;
}

// Activation offload: what the first `layers` blocks of each chunk (0: every block) keep for
// backward on the host pool between their forward and backward
// (exec/src/gpt/transformer_block.cpp).
spec::Plan activations_offloaded(spec::Plan p, int64_t layers = 0) {
  p.offload.activations = spec::OffloadTarget::kHost;
  p.offload.activation_layers = layers;
  return p;
}

// Offloaded activations reloaded `layers` blocks ahead (KARMA's swap schedule).
spec::Plan prefetched(spec::Plan p, int64_t layers) {
  p.offload.prefetch_layers = layers;
  return p;
}

// The routed experts split over `ep` of the data-parallel ranks.
spec::Plan with_ep(spec::Plan p, int64_t ep) {
  p.ep = ep;
  return p;
}

// SUPER's branch split: the tp ranks share Inception modules' branches (spec/branch_parallel.hpp).
spec::Plan branch_split(spec::Plan p) {
  p.branch_parallel = true;
  return p;
}

// Two samples a micro-batch (and so in each batch norm's statistics). On one sample each, training
// Inception's modules is ill-conditioned: a ReLU or max pool that flips with a rounding (summation
// order) moves the gradient norm by up to 1e-3 in ten steps, in PyTorch's fp32 against its fp64
// as well (tests/pytorch/cnn_reference.py, seed 4: 2e-4 at step 3). The single-rank reference
// takes the same micro-batches.
spec::Plan two_samples(spec::Plan p) {
  p.micro_batch = 2;
  return p;
}

// Collectives by named algorithms from point-to-point messages (exec/src/comm/p2p_collectives.hpp)
// rather than MPI's own choice.
spec::Plan with_algorithms(spec::Plan p, spec::CollectiveAlgorithms algorithms) {
  p.collective_algorithms = std::move(algorithms);
  return p;
}

// The gradient buckets reduced after the whole backward rather than as each is ready.
spec::Plan without_dp_overlap(spec::Plan p) {
  p.stack->dp_overlap = false;
  return p;
}

spec::Plan with_recompute(spec::Plan p, spec::Recompute r, int64_t layers = 0) {
  p.recompute = r;
  p.recompute_layers = layers;
  return p;
}

// Per-op splits (Plan::per_op, exec/src/per_op/split_block.hpp) over `micro_batch` sequences: `ops`
// each take `split` (dimension -> mesh axes).
spec::Plan per_op(spec::Plan p, int64_t micro_batch, std::vector<const char*> ops,
                  std::map<std::string, std::vector<std::string>> split) {
  p.micro_batch = micro_batch;
  for (const char* op : ops) p.per_op[op] = split;
  return p;
}

std::vector<Layout> layouts() {
  using S = spec::Schedule;
  using R = spec::Recompute;
  using A = spec::ContextAlgorithm;
  using K = spec::CollectiveKind;
  using C = spec::CollectiveAlgorithm;
  return {
      {"dp2", plan_of(2, 1, 1)},
      {"tp2", plan_of(1, 2, 1)},
      {"pp2_1f1b", plan_of(1, 1, 2)},
      {"pp2_gpipe", plan_of(1, 1, 2, 0, false, S::kGpipe)},
      {"dp2_zero1", plan_of(2, 1, 1, 1)},
      {"dp2_zero2", plan_of(2, 1, 1, 2)},
      {"dp2_zero3", plan_of(2, 1, 1, 3)},
      {"tp2_sp", plan_of(1, 2, 1, 0, true)},
      {"mlp_dp2", plan_of(2, 1, 1), Net::kMlp},
      {"mlp_pp2", plan_of(1, 1, 2), Net::kMlp},
      {"llama_tp2", plan_of(1, 2, 1), Net::kLlama},
      {"llama_pp2", plan_of(1, 1, 2), Net::kLlama},
      {"llama_dp2_zero3", plan_of(2, 1, 1, 3), Net::kLlama},
      {"llama_tp2_sp", plan_of(1, 2, 1, 0, true), Net::kLlama},
      {"pp2_interleaved", plan_of(1, 1, 2, 0, false, S::kInterleaved)},
      {"vocab63_tp2", plan_of(1, 2, 1), Net::kGptOddVocab},
      {"tp2_sp_full_recompute", with_recompute(plan_of(1, 2, 1, 0, true), R::kFull)},
      {"llama_pp2_selective_recompute", with_recompute(plan_of(1, 1, 2), R::kSelective),
       Net::kLlama},
      {"llama_pp2_interleaved", plan_of(1, 1, 2, 0, false, S::kInterleaved), Net::kLlama},
      // Full recompute of the first block of each stage's two (Megatron's block method).
      {"pp2_full_recompute_1_layer", with_recompute(plan_of(1, 1, 2), R::kFull, 1)},
      {"dp4", plan_of(4, 1, 1)},
      {"tp4", plan_of(1, 4, 1)},
      {"vocab63_tp4", plan_of(1, 4, 1), Net::kGptOddVocab},
      {"vocab63_tp2_pp2", plan_of(1, 2, 2), Net::kGptOddVocab},
      {"pp4", plan_of(1, 1, 4)},
      {"dp2_tp2", plan_of(2, 2, 1)},
      {"dp2_pp2", plan_of(2, 1, 2)},
      // Every bucket after the backward, the tied table's around its sum (models::backward_tail).
      {"dp2_pp2_no_dp_overlap", without_dp_overlap(plan_of(2, 1, 2))},
      {"dp2_pp2_zero1_no_dp_overlap", without_dp_overlap(plan_of(2, 1, 2, 1))},
      {"tp2_pp2", plan_of(1, 2, 2)},
      {"tp2_pp2_sp_zero1", plan_of(1, 2, 2, 1, true)},
      {"mlp_dp2_pp2", plan_of(2, 1, 2), Net::kMlp},
      {"llama_dp2_tp2", plan_of(2, 2, 1), Net::kLlama},
      {"dp2_pp2_interleaved_zero1", plan_of(2, 1, 2, 1, false, S::kInterleaved)},
      {"tp2_pp2_interleaved_sp", plan_of(1, 2, 2, 0, true, S::kInterleaved)},
      {"llama_tp2_pp2_sp_zero1", plan_of(1, 2, 2, 1, true), Net::kLlama},
      {"dp4_full_recompute_3_layers", with_recompute(plan_of(4, 1, 1), R::kFull, 3)},
      {"dp2_tp2_pp2", plan_of(2, 2, 2)},
      {"vocab63_dp2_tp2_pp2_zero1", plan_of(2, 2, 2, 1), Net::kGptOddVocab},
      {"dp2_tp2_pp2_sp_zero1_gpipe", plan_of(2, 2, 2, 1, true, S::kGpipe)},
      // The collectives by named algorithms: every one the CPU executor has.
      {"dp2_zero2_ring", with_algorithms(plan_of(2, 1, 1, 2), {{K::kAllReduce, C::kRing},
                                                               {K::kReduceScatter, C::kRing},
                                                               {K::kAllGather, C::kRing}})},
      {"dp4_zero3_rabenseifner_halving_doubling",
       with_algorithms(plan_of(4, 1, 1, 3), {{K::kAllReduce, C::kRabenseifner},
                                             {K::kReduceScatter, C::kRecursiveDoubling},
                                             {K::kAllGather, C::kRecursiveDoubling}})},
      {"dp2_tp2_sp_zero1_tree_pairwise",
       with_algorithms(plan_of(2, 2, 1, 1, true), {{K::kAllReduce, C::kBinomialTree},
                                                   {K::kReduceScatter, C::kPairwise},
                                                   {K::kAllGather, C::kRing}})},
      {"dp2_pp2_recursive_doubling",
       with_algorithms(plan_of(2, 1, 2),
                       {{K::kAllReduce, C::kRecursiveDoubling}, {K::kSendRecv, C::kPairwise}})},
      // CNNs: data, pipeline and spatial parallelism (rows, columns, both) and their mixes.
      {"cnn_dp2", plan_of(2, 1, 1), Net::kCnn},
      {"cnn_pp2", plan_of(1, 1, 2), Net::kCnn},
      {"cnn_hw2x1", split(plan_of(1, 1, 1), 2, 1), Net::kCnn},
      {"cnn_hw1x2", split(plan_of(1, 1, 1), 1, 2), Net::kCnn},
      {"cnn_hw2x2", split(plan_of(1, 1, 1), 2, 2), Net::kCnn},
      {"cnn_hw4x1", split(plan_of(1, 1, 1), 4, 1), Net::kCnn},
      {"cnn_dp2_hw2x1", split(plan_of(2, 1, 1), 2, 1), Net::kCnn},
      {"cnn_pp2_hw1x2_gpipe", split(plan_of(1, 1, 2, 0, false, S::kGpipe), 1, 2), Net::kCnn},
      {"cnn_dp2_hw2x2", split(plan_of(2, 1, 1), 2, 2), Net::kCnn},
      {"cnn_pp2_hw2x2", split(plan_of(1, 1, 2), 2, 2), Net::kCnn},
      {"cnn_dp2_pp2_hw2x1", split(plan_of(2, 1, 2), 2, 1), Net::kCnn},
      // ZeRO over the replicas, the grid's ranks among them (dp x h x w shards). Over 4 replicas
      // this model's spans do not divide evenly: every rank's optimizer counts its padded shard
      // of each span (models::zero_updated_params), the last one's padding included.
      {"cnn_hw2x1_zero1", split(plan_of(1, 1, 1, 1), 2, 1), Net::kCnn},
      {"cnn_hw1x2_zero2", split(plan_of(1, 1, 1, 2), 1, 2), Net::kCnn},
      {"cnn_hw2x1_zero3", split(plan_of(1, 1, 1, 3), 2, 1), Net::kCnn},
      {"cnn_hw2x2_zero1", split(plan_of(1, 1, 1, 1), 2, 2), Net::kCnn},
      {"cnn_dp2_hw2x1_zero2", split(plan_of(2, 1, 1, 2), 2, 1), Net::kCnn},
      {"cnn_hw4x1_zero3", split(plan_of(1, 1, 1, 3), 4, 1), Net::kCnn},
      // Channel and filter parallelism (tp for CNNs: stationary-x, -y and -w chosen per layer;
      // tp 4 runs -w on a 2 x 2 grid for the equal-width 3x3 convolutions, tp 8 on a 4 x 2 one).
      {"cnn_tp2", plan_of(1, 2, 1), Net::kCnn},
      {"vgg_tp2", plan_of(1, 2, 1), Net::kVgg},
      {"vgg_hw2x1", split(plan_of(1, 1, 1), 2, 1), Net::kVgg},
      {"cnn_tp4", plan_of(1, 4, 1), Net::kCnn},
      {"vgg_tp2_pp2", plan_of(1, 2, 2), Net::kVgg},
      {"cnn_dp2_tp2", plan_of(2, 2, 1), Net::kCnn},
      {"cnn_dp2_tp2_pp2", plan_of(2, 2, 2), Net::kCnn},
      {"cnn_tp2_hw1x2", split(plan_of(1, 2, 1), 1, 2), Net::kCnn},
      {"cnn_tp2_hw2x2", split(plan_of(1, 2, 1), 2, 2), Net::kCnn},
      {"cnn_dp2_tp2_hw2x1", split(plan_of(2, 2, 1), 2, 1), Net::kCnn},
      {"vgg_tp4_pp2", plan_of(1, 4, 2), Net::kVgg},
      {"vgg_tp4", plan_of(1, 4, 1), Net::kVgg},
      {"cnn_tp4_hw2x1", split(plan_of(1, 4, 1), 2, 1), Net::kCnn},
      // Each convolution on another algorithm than the byte rule's, as a plan may choose them.
      {"cnn_tp2_chosen", other_algorithms(plan_of(1, 2, 1), Net::kCnn), Net::kCnn},
      {"vgg_tp4_chosen", other_algorithms(plan_of(1, 4, 1), Net::kVgg), Net::kVgg},
      {"vgg_tp8", plan_of(1, 8, 1), Net::kVgg},
      // A 2D U-Net (kept maps, up-convolution, cropped concat, per-pixel loss) over replicas,
      // and its 3D form (volumes: 3D windows, the depth's padding and crop, per-voxel loss).
      {"unet_dp2", plan_of(2, 1, 1), Net::kUnet},
      {"unet_dp2_zero3", plan_of(2, 1, 1, 3), Net::kUnet},
      {"unet_dp4", plan_of(4, 1, 1), Net::kUnet},
      // U-Net split by rows and columns to its per-pixel loss: the up-convolution and the crop
      // fetch their inputs' blocks from the ranks holding them.
      {"unet_hw2x1", split(plan_of(1, 1, 1), 2, 1), Net::kUnet},
      {"unet_hw1x2", split(plan_of(1, 1, 1), 1, 2), Net::kUnet},
      {"unet_hw2x2", split(plan_of(1, 1, 1), 2, 2), Net::kUnet},
      {"unet_dp2_hw2x1", split(plan_of(2, 1, 1), 2, 1), Net::kUnet},
      {"unet_dp2_hw2x2", split(plan_of(2, 1, 1), 2, 2), Net::kUnet},
      {"unet_tall_hw4x1", split(plan_of(1, 1, 1), 4, 1), Net::kUnetTall},
      {"unet_tall_dp2_hw4x1", split(plan_of(2, 1, 1), 4, 1), Net::kUnetTall},
      {"unet_hw2x1_zero3", split(plan_of(1, 1, 1, 3), 2, 1), Net::kUnet},
      {"unet3d_dp2", plan_of(2, 1, 1), Net::kUnet3d},
      {"unet3d_dp2_zero3", plan_of(2, 1, 1, 3), Net::kUnet3d},
      {"unet3d_dp8", plan_of(8, 1, 1), Net::kUnet3d},
      // Its volumes split by planes, rows and columns (a d x h x w grid) to the per-voxel loss.
      {"unet3d_dhw2x1x1", split(plan_of(1, 1, 1), 1, 1, 2), Net::kUnet3d},
      {"unet3d_dhw2x2x1", split(plan_of(1, 1, 1), 2, 1, 2), Net::kUnet3d},
      {"unet3d_dhw1x1x2", split(plan_of(1, 1, 1), 1, 2, 1), Net::kUnet3d},
      {"unet3d_dhw2x2x2", split(plan_of(1, 1, 1), 2, 2, 2), Net::kUnet3d},
      {"unet3d_dp2_dhw2x2x1", split(plan_of(2, 1, 1), 2, 1, 2), Net::kUnet3d},
      {"unet3d_dhw2x1x1_zero2", split(plan_of(1, 1, 1, 2), 1, 1, 2), Net::kUnet3d},
      // A volume classifier: split to its 3D adaptive pool (bins straddling the blocks), whose
      // partial sums the split ranks all-reduce; over pipeline stages.
      {"volume_classifier_dhw2x1x1", split(plan_of(1, 1, 1), 1, 1, 2), Net::kVolumeClassifier},
      {"volume_classifier_dhw2x2x2", split(plan_of(1, 1, 1), 2, 2, 2), Net::kVolumeClassifier},
      {"volume_classifier_dp2_pp2", plan_of(2, 1, 2), Net::kVolumeClassifier},
      // AmoebaNet-D over replicas and pipeline stages (GPipe's use of it, Huang et al. 2019): a
      // boundary between two cells carries the output and the cell's input, which the next cell
      // reads too; with ZeRO over the replicas.
      {"amoeba_dp2", plan_of(2, 1, 1), Net::kAmoeba},
      {"amoeba_pp2_gpipe", plan_of(1, 1, 2, 0, false, S::kGpipe), Net::kAmoeba},
      {"amoeba_dp2_zero3", plan_of(2, 1, 1, 3), Net::kAmoeba},
      {"amoeba_pp4_gpipe", plan_of(1, 1, 4, 0, false, S::kGpipe), Net::kAmoeba},
      {"amoeba_dp2_pp2_zero1", plan_of(2, 1, 2, 1), Net::kAmoeba},
      {"amoeba_dp4_zero2", plan_of(4, 1, 1, 2), Net::kAmoeba},
      {"amoeba_dp2_pp4", plan_of(2, 1, 4), Net::kAmoeba},
      // SUPER's split of the cells: a normal cell's three groups of nodes and its joined reduced
      // input over 2 and 4 tp ranks (a reduction cell's one group on one rank).
      {"amoeba_tp2_super", branch_split(plan_of(1, 2, 1)), Net::kAmoeba},
      {"amoeba_tp4_super", branch_split(plan_of(1, 4, 1)), Net::kAmoeba},
      {"amoeba_dp2_tp2_super_zero1", branch_split(plan_of(2, 2, 1, 1)), Net::kAmoeba},
      {"amoeba_tp2_pp2_super", branch_split(plan_of(1, 2, 2)), Net::kAmoeba},
      // Inception-v3's modules (FlexFlow's CNN) over replicas and pipeline stages, with ZeRO.
      {"inception_dp2", two_samples(plan_of(2, 1, 1)), Net::kInception},
      {"inception_pp2_gpipe", two_samples(plan_of(1, 1, 2, 0, false, S::kGpipe)), Net::kInception},
      {"inception_dp2_zero3", two_samples(plan_of(2, 1, 1, 3)), Net::kInception},
      {"inception_dp2_pp2_zero1", two_samples(plan_of(2, 1, 2, 1)), Net::kInception},
      {"inception_pp4", two_samples(plan_of(1, 1, 4)), Net::kInception},
      {"inception_dp2_pp4", two_samples(plan_of(2, 1, 4)), Net::kInception},
      // SUPER's branch split of the modules over 2 and 4 tp ranks (module b's and d's three
      // branches leave a fourth rank idle), with replicas, ZeRO and pipeline stages.
      {"inception_tp2_super", two_samples(branch_split(plan_of(1, 2, 1))), Net::kInception},
      {"inception_tp4_super", two_samples(branch_split(plan_of(1, 4, 1))), Net::kInception},
      {"inception_dp2_tp2_super_zero2", two_samples(branch_split(plan_of(2, 2, 1, 2))),
       Net::kInception},
      {"inception_tp2_pp2_super", two_samples(branch_split(plan_of(1, 2, 2))), Net::kInception},
      {"inception_dp2_tp4_super", two_samples(branch_split(plan_of(2, 4, 1))), Net::kInception},
      // Context parallelism (all-gather of keys and values): learned positions and tied
      // embeddings (GPT), rotary embeddings and grouped-query attention (Llama), with recompute,
      // data, tensor and pipeline parallelism, ZeRO.
      {"cp2", with_cp(plan_of(1, 1, 1), 2)},
      {"llama_cp2", with_cp(plan_of(1, 1, 1), 2), Net::kLlama},
      {"llama_cp2_selective_recompute", with_cp(with_recompute(plan_of(1, 1, 1), R::kSelective), 2),
       Net::kLlama},
      {"cp4", with_cp(plan_of(1, 1, 1), 4)},
      {"cp2_full_recompute_pp2", with_cp(with_recompute(plan_of(1, 1, 2), R::kFull), 2)},
      {"llama_cp2_tp2", with_cp(plan_of(1, 2, 1), 2), Net::kLlama},
      {"llama_dp2_cp2_zero3", with_cp(plan_of(2, 1, 1, 3), 2), Net::kLlama},
      {"cp8", with_cp(plan_of(1, 1, 1), 8)},
      {"llama_cp2_tp2_pp2_interleaved", with_cp(plan_of(1, 2, 2, 0, false, S::kInterleaved), 2),
       Net::kLlama},
      {"dp2_cp2_tp2_zero1", with_cp(plan_of(2, 2, 1, 1), 2)},
      // Ulysses: cp divides each tp rank's heads and key/value heads.
      {"cp2_a2a", with_cp(plan_of(1, 1, 1), 2, A::kAllToAll)},
      {"llama_cp2_a2a", with_cp(plan_of(1, 1, 1), 2, A::kAllToAll), Net::kLlama},
      {"cp4_a2a", with_cp(plan_of(1, 1, 1), 4, A::kAllToAll)},
      {"tp2_cp2_a2a", with_cp(plan_of(1, 2, 1), 2, A::kAllToAll)},
      {"llama_cp2_a2a_pp2_selective_recompute",
       with_cp(with_recompute(plan_of(1, 1, 2), R::kSelective), 2, A::kAllToAll), Net::kLlama},
      {"dp2_cp2_a2a_pp2_zero1", with_cp(plan_of(2, 1, 2, 1), 2, A::kAllToAll)},
      // Ring attention: GQA and rotary embeddings, tp (with sequence parallelism), pp, selective
      // and full recompute, dp with ZeRO, and 8 steps around the ring (chunks of one token).
      // 3D tensor grids: each axis alone (x: the inputs of QKV and FC1 split, y: the heads and
      // the ffn, z: the sequences and the weight blocks' shards), every pair, all three; GPT's
      // biases, learned positions and tied embeddings (across stages too), Llama's GQA, rotary
      // embeddings and SwiGLU, a padded vocabulary, recompute, data parallelism with ZeRO.
      {"grid_2x1x1", with_grid(plan_of(1, 2, 1), 2, 1, 1)},
      {"llama_grid_1x2x1", with_grid(plan_of(1, 2, 1), 1, 2, 1), Net::kLlama},
      {"grid_1x1x2", with_grid(plan_of(1, 2, 1), 1, 1, 2)},
      {"grid_2x2x1", with_grid(plan_of(1, 4, 1), 2, 2, 1)},
      {"llama_grid_2x1x2_full_recompute",
       with_grid(with_recompute(plan_of(1, 4, 1), R::kFull), 2, 1, 2), Net::kLlama},
      {"grid_1x2x2_pp2", with_grid(plan_of(1, 4, 2), 1, 2, 2)},
      {"vocab63_dp2_grid_1x2x1_zero1", with_grid(plan_of(2, 2, 1, 1), 1, 2, 1), Net::kGptOddVocab},
      {"grid_2x2x2", with_grid(plan_of(1, 8, 1), 2, 2, 2)},
      {"llama_grid_2x2x2", with_grid(plan_of(1, 8, 1), 2, 2, 2), Net::kLlama},
      {"dp2_grid_1x1x2_pp2_zero1", with_grid(plan_of(2, 2, 2, 1), 1, 1, 2)},
      // Fused attention: the output and each row's log-sum-exp kept, the probabilities
      // recomputed in backward; Llama's grouped-query heads over tp, sequence parallelism,
      // pipeline stages, selective and full recompute, ZeRO, the cache offloaded to the host.
      {"flash_dp2", with_flash(plan_of(2, 1, 1))},
      {"llama_flash_tp2", with_flash(plan_of(1, 2, 1)), Net::kLlama},
      {"flash_tp2_sp_pp2_selective_recompute",
       with_flash(with_recompute(plan_of(1, 2, 2, 0, true), R::kSelective))},
      {"llama_flash_dp2_pp2_full_recompute_zero1",
       with_flash(with_recompute(plan_of(2, 1, 2, 1), R::kFull)), Net::kLlama},
      {"flash_dp2_act_offload", with_flash(activations_offloaded(plan_of(2, 1, 1)))},
      {"cp2_ring", with_ring(plan_of(1, 1, 1), 2)},
      {"llama_cp2_ring", with_ring(plan_of(1, 1, 1), 2), Net::kLlama},
      {"llama_cp2_ring_selective_recompute",
       with_ring(with_recompute(plan_of(1, 1, 1), R::kSelective), 2), Net::kLlama},
      {"cp4_ring", with_ring(plan_of(1, 1, 1), 4)},
      {"llama_cp2_ring_tp2", with_ring(plan_of(1, 2, 1), 2), Net::kLlama},
      {"cp2_ring_tp2_sp", with_ring(plan_of(1, 2, 1, 0, true), 2)},
      {"cp2_ring_full_recompute_pp2", with_ring(with_recompute(plan_of(1, 1, 2), R::kFull), 2)},
      {"llama_dp2_cp2_ring_pp2_zero1", with_ring(plan_of(2, 1, 2, 1), 2), Net::kLlama},
      {"cp8_ring", with_ring(plan_of(1, 1, 1), 8)},
      // With sequence parallelism: each tp rank's slice of the cp rank's rows (learned positions
      // added run by run within it).
      {"cp2_tp2_sp", with_cp(plan_of(1, 2, 1, 0, true), 2)},
      {"cp2_tp2_sp_a2a", with_cp(plan_of(1, 2, 1, 0, true), 2, A::kAllToAll)},
      {"llama_dp2_cp2_tp2_sp_zero1", with_cp(plan_of(2, 2, 1, 1, true), 2), Net::kLlama},
      // Mixtures of experts: every expert on every rank, and split over ep of the dp ranks (their
      // gradients summed, and under ZeRO sharded, over the ranks holding the same experts).
      {"moe_dp2", plan_of(2, 1, 1), Net::kMoe},
      {"moe_pp2", plan_of(1, 1, 2), Net::kMoe},
      {"moe_dp2_ep2", with_ep(plan_of(2, 1, 1), 2), Net::kMoe},
      {"moe_dp2_ep2_pairwise",
       with_algorithms(with_ep(plan_of(2, 1, 1), 2), {{K::kAllToAll, C::kPairwise}}), Net::kMoe},
      {"moe_dp2_ep2_zero1", with_ep(plan_of(2, 1, 1, 1), 2), Net::kMoe},
      {"moe_dp4_ep4", with_ep(plan_of(4, 1, 1), 4), Net::kMoe},
      {"moe_dp4_ep2_zero1", with_ep(plan_of(4, 1, 1, 1), 2), Net::kMoe},
      {"moe_dp2_ep2_pp2_full_recompute", with_ep(with_recompute(plan_of(2, 1, 2), R::kFull), 2),
       Net::kMoe},
      {"moe_dp2_ep2_cp2_zero2", with_ep(with_cp(plan_of(2, 1, 1, 2), 2), 2), Net::kMoe},
      {"moe_dp8_ep8", with_ep(plan_of(8, 1, 1), 8), Net::kMoe},
      {"moe_dp4_ep4_pp2_zero1", with_ep(plan_of(4, 1, 2, 1), 4), Net::kMoe},
      {"moe_dp4_ep2_cp2_zero1", with_ep(with_cp(plan_of(4, 1, 1, 1), 2), 2), Net::kMoe},
      // ZeRO-3: the experts' shards gathered from the ranks holding them (TorchTitan's FSDP2).
      {"moe_dp2_ep2_zero3", with_ep(plan_of(2, 1, 1, 3), 2), Net::kMoe},
      {"moe_dp4_ep2_zero3", with_ep(plan_of(4, 1, 1, 3), 2), Net::kMoe},
      {"moe_dp8_ep4_zero3", with_ep(plan_of(8, 1, 1, 3), 4), Net::kMoe},
      // Experts split over tp too (sequence parallel, as a MoE with tp needs): without ep the tp
      // ranks share the routing (the all-gather dispatcher), with it they gather the rows each
      // received over ep (the all-to-all dispatcher).
      {"moe_tp2_sp", plan_of(1, 2, 1, 0, true), Net::kMoe},
      {"moe_dp2_tp2_sp_zero1", plan_of(2, 2, 1, 1, true), Net::kMoe},
      {"moe_dp2_tp2_sp_ep2", with_ep(plan_of(2, 2, 1, 0, true), 2), Net::kMoe},
      {"moe_tp2_pp2_sp_full_recompute", with_recompute(plan_of(1, 2, 2, 0, true), R::kFull),
       Net::kMoe},
      {"moe_dp4_tp2_sp_ep4_zero1", with_ep(plan_of(4, 2, 1, 1, true), 4), Net::kMoe},
      {"moe_dp2_tp2_pp2_sp_ep2_full_recompute",
       with_ep(with_recompute(plan_of(2, 2, 2, 0, true), R::kFull), 2), Net::kMoe},
      // With a capacity: the copies a rank drops are the single rank's wherever the rank routes
      // the micro-batch's tokens (or, tp sharing the routing, all of them).
      {"moe_capacity_dp2_ep2", with_ep(plan_of(2, 1, 1), 2), Net::kMoeCapacity},
      {"moe_capacity_tp2_sp", plan_of(1, 2, 1, 0, true), Net::kMoeCapacity},
      {"moe_capacity_dp4_ep4", with_ep(plan_of(4, 1, 1), 4), Net::kMoeCapacity},
      {"moe_capacity_dp2_ep2_pp2_zero1", with_ep(plan_of(2, 1, 2, 1), 2), Net::kMoeCapacity},
      // The optimizer on the host pool (ZeRO-Offload), its shard by gradient bucket; on one
      // replica every bucket whole.
      {"dp2_zero1_offload", offloaded(plan_of(2, 1, 1, 1))},
      {"llama_tp2_zero1_offload", offloaded(plan_of(1, 2, 1, 1)), Net::kLlama},
      {"llama_dp2_zero2_offload", offloaded(plan_of(2, 1, 1, 2)), Net::kLlama},
      {"dp2_pp2_zero1_offload", offloaded(plan_of(2, 1, 2, 1))},
      {"dp4_zero2_offload", offloaded(plan_of(4, 1, 1, 2))},
      {"dp8_zero1_offload", offloaded(plan_of(8, 1, 1, 1))},
      {"llama_dp2_tp2_pp2_sp_zero1_offload", offloaded(plan_of(2, 2, 2, 1, true)), Net::kLlama},
      // Under ZeRO-3 every micro-batch's reduced shards go to the host pool (one replica: its
      // whole gradients after the last), and with ZeRO-Infinity's parameter offload each shard
      // is fetched from it before its layer's gather.
      {"dp2_zero3_offload", offloaded(plan_of(2, 1, 1, 3))},
      {"dp8_zero3_offload", offloaded(plan_of(8, 1, 1, 3))},
      {"dp2_zero3_offload_params", parameters_offloaded(plan_of(2, 1, 1, 3))},
      // The optimizer's states on NVMe (the parameters on the host beside them for zero 3).
      {"dp2_zero1_offload_nvme", nvme_offloaded(plan_of(2, 1, 1, 1))},
      {"dp4_zero2_offload_nvme", nvme_offloaded(plan_of(4, 1, 1, 2))},
      {"dp8_zero3_offload_params_nvme", nvme_offloaded(parameters_offloaded(plan_of(8, 1, 1, 3)))},
      // The parameters on NVMe too (ZeRO-Infinity's offload_param device "nvme"): every shard
      // fetched from the rank's parameters file, the copies in memory poisoned; beside the
      // optimizer on the host, the masters the host step updates written to the file after it.
      {"dp2_zero3_params_on_nvme", parameters_on_nvme(nvme_offloaded(plan_of(2, 1, 1, 3)))},
      {"dp4_zero3_params_on_nvme_opt_host", parameters_on_nvme(offloaded(plan_of(4, 1, 1, 3)))},
      {"tp2_dp4_zero3_params_on_nvme", parameters_on_nvme(nvme_offloaded(plan_of(4, 2, 1, 3)))},
      {"tp2_zero3_offload_params", parameters_offloaded(plan_of(1, 2, 1, 3))},
      {"dp4_zero3_offload_params", parameters_offloaded(plan_of(4, 1, 1, 3))},
      {"llama_dp2_tp2_sp_zero3_offload_params", parameters_offloaded(plan_of(2, 2, 1, 3, true)),
       Net::kLlama},
      {"dp8_zero3_offload_params_act_offload",
       activations_offloaded(parameters_offloaded(plan_of(8, 1, 1, 3)))},
      // Activations on the host pool between each block's forward and backward (Megatron-LM's
      // --cpu-offloading), alone and beside recompute (DeepSpeed's cpu_checkpointing), optimizer
      // offload, sequence, context and expert parallelism.
      {"dp2_act_offload", activations_offloaded(plan_of(2, 1, 1))},
      {"llama_tp2_sp_act_offload", activations_offloaded(plan_of(1, 2, 1, 0, true)), Net::kLlama},
      {"pp2_full_recompute_act_offload1",
       activations_offloaded(with_recompute(plan_of(1, 1, 2), R::kFull), 1)},
      {"dp2_pp2_zero1_offload_act_offload", activations_offloaded(offloaded(plan_of(2, 1, 2, 1)))},
      {"moe_dp2_ep2_act_offload", with_ep(activations_offloaded(plan_of(2, 1, 1)), 2), Net::kMoe},
      {"llama_dp2_cp2_act_offload", activations_offloaded(with_cp(plan_of(2, 1, 1), 2)),
       Net::kLlama},
      {"dp2_tp2_pp2_act_offload1", activations_offloaded(plan_of(2, 2, 2), 1)},
      // KARMA's split (spec::unit_recompute): the first blocks swapped, the next recomputed;
      // with its swap schedule, the swapped block reloaded two blocks ahead (as the planner
      // proposes: the same ops, issued earlier).
      {"llama_dp2_swap2_recompute2",
       activations_offloaded(with_recompute(plan_of(2, 1, 1), R::kFull, 2), 2), Net::kLlama},
      {"dp2_swap1_recompute2_prefetch2",
       prefetched(activations_offloaded(with_recompute(plan_of(2, 1, 1), R::kFull, 2), 1), 2)},
      // PipeDream-2BW: against its own single-rank run (reference()). GPT's tied table makes
      // the end stages sum its gradient at each batch's end; Llama's is untied.
      {"pp2_2bw", plan_of(1, 1, 2, 0, false, S::kPipeDream2BW)},
      {"llama_pp2_2bw", plan_of(1, 1, 2, 0, false, S::kPipeDream2BW), Net::kLlama},
      {"mlp_pp2_2bw", plan_of(1, 1, 2, 0, false, S::kPipeDream2BW), Net::kMlp},
      {"pp4_2bw", plan_of(1, 1, 4, 0, false, S::kPipeDream2BW)},
      {"llama_dp2_pp2_2bw", plan_of(2, 1, 2, 0, false, S::kPipeDream2BW), Net::kLlama},
      {"tp2_pp2_sp_2bw", plan_of(1, 2, 2, 0, true, S::kPipeDream2BW)},
      {"llama_tp2_pp4_2bw", plan_of(1, 2, 4, 0, false, S::kPipeDream2BW), Net::kLlama},
      {"dp2_tp2_pp2_2bw", plan_of(2, 2, 2, 0, false, S::kPipeDream2BW)},
      // PipeDream: against its sequential definition, each layer as stale as its stage
      // (TrainOptions::layer_staleness); models without a tied table.
      {"llama_pp2_pipedream", pipedream(1, 1, 2), Net::kLlama},
      {"mlp_pp4_pipedream", pipedream(1, 1, 4), Net::kMlp},
      {"llama_dp2_tp2_pp2_pipedream", pipedream(2, 2, 2), Net::kLlama},
      // GEMS' MAST: two replicas of the stages in opposite directions, each rank holding a stage
      // of each; synchronous, so equal to the single-rank run (Llama: no tied table).
      {"llama_pp2_gems", gems(plan_of(1, 1, 2)), Net::kLlama},
      {"llama_pp4_gems", gems(plan_of(1, 1, 4)), Net::kLlama},
      {"llama_dp2_pp2_gems", gems(plan_of(2, 1, 2)), Net::kLlama},
      {"llama_tp2_pp2_sp_gems", gems(plan_of(1, 2, 2, 0, true)), Net::kLlama},
      {"llama_dp2_pp4_gems", gems(plan_of(2, 1, 4)), Net::kLlama},
      // Parameter servers: against their sequential definition, every layer `staleness` steps
      // stale (TrainOptions::layer_staleness); synchronous at 0. GPT's tied table is summed
      // over the end stages before the push.
      {"dp2_ps0", servers(plan_of(2, 1, 1), 0)},
      {"dp2_ps1", servers(plan_of(2, 1, 1), 1)},
      {"llama_dp4_ps2", servers(plan_of(4, 1, 1), 2), Net::kLlama},
      {"dp2_tp2_sp_ps1", servers(plan_of(2, 2, 1, 0, true), 1)},
      {"dp2_pp2_ps1", servers(plan_of(2, 1, 2), 1)},
      {"mlp_dp8_ps3", servers(plan_of(8, 1, 1), 3), Net::kMlp},
      // With ZeRO-1: each replica updates its shard of the buffer the finished batch read and
      // gathers the others' into it, while the next batch reads the other buffer.
      {"dp2_pp2_2bw_zero1", plan_of(2, 1, 2, 1, false, S::kPipeDream2BW)},
      {"llama_dp2_pp2_2bw_zero1", plan_of(2, 1, 2, 1, false, S::kPipeDream2BW), Net::kLlama},
      {"dp4_pp2_2bw_zero1", plan_of(4, 1, 2, 1, false, S::kPipeDream2BW)},
      {"dp2_tp2_pp2_sp_2bw_zero1", plan_of(2, 2, 2, 1, true, S::kPipeDream2BW)},
      // Per-op splits: the MLP or attention batch-split over the tp ranks (their weights whole
      // and summed over tp), a norm sequence-split over the replicas (all-to-alls over d), the
      // MLP sequence-split over t beside attention batch-split over d x t.
      {"llama_tp2_per_op_mlp_batch",
       per_op(plan_of(1, 2, 1), 2, {"fc1", "activation", "fc2"}, {{"b", {"t"}}}), Net::kLlama},
      {"llama_tp2_per_op_attention_batch",
       per_op(plan_of(1, 2, 1), 2, {"qkv", "attention", "proj"}, {{"b", {"t"}}}), Net::kLlama},
      // Contractions split: QKV's hidden (its output a partial sum, reduce-scattered onto the
      // heads) and the projection's head dimension (the context exchanged from heads to it).
      {"llama_tp2_per_op_contractions",
       per_op(per_op(plan_of(1, 2, 1), 1, {"qkv"}, {{"h", {"t"}}}), 1, {"proj"}, {{"d", {"t"}}}),
       Net::kLlama},
      {"llama_dp2_per_op_norm_sequence", per_op(plan_of(2, 1, 1), 1, {"norm2"}, {{"s", {"d"}}}),
       Net::kLlama},
      {"llama_tp2_sp_pp2_per_op_mlp_sequence",
       per_op(plan_of(1, 2, 2, 0, true), 1, {"fc1", "activation", "fc2"}, {{"s", {"t"}}}),
       Net::kLlama},
      {"llama_dp2_tp2_per_op",
       per_op(per_op(plan_of(2, 2, 1), 2, {"qkv", "attention", "proj"}, {{"b", {"d", "t"}}}), 2,
              {"fc1", "activation", "fc2"}, {{"b", {"d"}}, {"s", {"t"}}}),
       Net::kLlama},
      {"llama_dp2_tp2_pp2_per_op_attention_batch",
       per_op(plan_of(2, 2, 2), 2, {"qkv", "attention", "proj"}, {{"b", {"d", "t"}}}), Net::kLlama},
      // GPT's biases: QKV's added once beside its partial sums, the residuals' with their rows
      // split over t (their gradients summed over tp).
      {"tp2_per_op_mlp_batch",
       per_op(plan_of(1, 2, 1), 2, {"fc1", "activation", "fc2"}, {{"b", {"t"}}})},
      {"tp2_per_op_contractions",
       per_op(per_op(plan_of(1, 2, 1), 1, {"qkv"}, {{"h", {"t"}}}), 1, {"proj"}, {{"d", {"t"}}})},
      {"dp2_tp2_per_op_residuals_sequence",
       per_op(per_op(plan_of(2, 2, 1), 2, {"qkv", "attention", "proj"}, {{"b", {"d", "t"}}}), 2,
              {"residual1", "norm2", "residual2"}, {{"b", {"d"}}, {"s", {"t"}}})},
      {"dp2_tp2_pp2_per_op_mlp_sequence",
       per_op(plan_of(2, 2, 2), 2, {"fc1", "activation", "fc2"}, {{"b", {"d"}}, {"s", {"t"}}})},
      // Under sequence parallelism over two sequences a micro-batch: the stream splits each
      // sequence over t (LinearPairs::split_each_sequence), learned positions included.
      {"tp2_sp_per_op_attention_batch",
       per_op(plan_of(1, 2, 1, 0, true), 2, {"qkv", "attention", "proj"}, {{"b", {"t"}}})},
      {"llama_dp2_tp2_sp_per_op",
       per_op(
           per_op(plan_of(2, 2, 1, 0, true), 2, {"qkv", "attention", "proj"}, {{"b", {"d", "t"}}}),
           2, {"fc1", "activation", "fc2"}, {{"b", {"d"}}, {"s", {"t"}}}),
       Net::kLlama},
      {"llama_dp4_tp2_per_op_norms_sequence",
       per_op(plan_of(4, 2, 1), 1, {"norm1", "norm2"}, {{"b", {"d"}}, {"s", {"t"}}}), Net::kLlama},
      // Llama's logits split by op (models/per_op_head.hpp, exec/src/gpt/gpt_head.hpp): the
      // vocabulary over the replicas (each a block of the output weights for every replica's
      // tokens), over d x t, the tokens over t (the weights whole on each, their gradient summed
      // over t), with sequence parallelism, and beside the blocks' own splits; on a vocabulary of
      // 256 (every rank real tokens), and of 64 (padded to 256 over d x t: three ranks hold
      // padding only).
      {"llama_dp2_per_op_logits_vocabulary",
       per_op(plan_of(2, 1, 1), 1, {"logits"}, {{"V", {"d"}}}), Net::kLlamaWideVocab},
      {"llama_tp2_per_op_logits_tokens", per_op(plan_of(1, 2, 1), 2, {"logits"}, {{"b", {"t"}}}),
       Net::kLlamaWideVocab},
      {"llama_dp2_tp2_per_op_logits_vocabulary",
       per_op(plan_of(2, 2, 1), 1, {"logits"}, {{"V", {"d", "t"}}}), Net::kLlama},
      {"llama_dp2_tp2_sp_per_op_logits",
       per_op(plan_of(2, 2, 1, 0, true), 2, {"logits"}, {{"V", {"d"}}, {"s", {"t"}}}),
       Net::kLlamaWideVocab},
      {"llama_dp2_tp2_per_op_blocks_and_logits",

       per_op(per_op(plan_of(2, 2, 1), 2, {"qkv", "attention", "proj"}, {{"b", {"d", "t"}}}), 2,
              {"logits"}, {{"b", {"t"}}, {"V", {"d"}}}),
       Net::kLlamaWideVocab},
      {"llama_dp4_tp2_per_op_logits", per_op(plan_of(4, 2, 1), 2, {"logits"}, {{"V", {"t", "d"}}}),
       Net::kLlamaWideVocab},
      // A CNN's fc layers split by op (exec/src/per_op/split_fc_chain.hpp): the VGG's fc1 (layer5,
      // 64 -> 32, ReLU) and fc2 (layer6, 32 -> 10 classes), the ResNet's one fc (layer6, 32 -> 10).
      // Output features over the replicas (the batch gathered, each replica its weight columns),
      // whole weights on every replica (copies), the classifier's contracted features over the
      // replicas (its logits partial sums, reduce-scattered onto the batch), beside ZeRO-1/2.
      {"vgg_dp2_per_op_fc1_columns", per_op(plan_of(2, 1, 1), 2, {"layer5"}, {{"f1", {"d"}}}),
       Net::kVgg},
      {"vgg_dp2_per_op_columns",
       per_op(per_op(plan_of(2, 1, 1), 2, {"layer5"}, {{"f1", {"d"}}}), 2, {"layer6"},
              {{"f2", {"d"}}}),
       Net::kVgg},
      {"vgg_dp2_per_op_whole", per_op(plan_of(2, 1, 1), 1, {"layer5", "layer6"}, {}), Net::kVgg},
      {"vgg_dp2_per_op_contracted", per_op(plan_of(2, 1, 1), 2, {"layer6"}, {{"f1", {"d"}}}),
       Net::kVgg},
      {"cnn_dp2_per_op_contracted", per_op(plan_of(2, 1, 1), 1, {"layer6"}, {{"f0", {"d"}}}),
       Net::kCnn},
      {"vgg_dp2_zero1_per_op_fc1_columns",
       per_op(plan_of(2, 1, 1, 1), 2, {"layer5"}, {{"f1", {"d"}}}), Net::kVgg},
      {"vgg_dp4_per_op",
       per_op(per_op(plan_of(4, 1, 1), 1, {"layer5"}, {{"f1", {"d"}}}), 1, {"layer6"},
              {{"f1", {"d"}}}),
       Net::kVgg},
      {"vgg_dp4_zero2_per_op_fc1_columns",
       per_op(plan_of(4, 1, 1, 2), 2, {"layer5"}, {{"f1", {"d"}}}), Net::kVgg},
      {"vgg_dp8_per_op_fc1_columns", per_op(plan_of(8, 1, 1), 1, {"layer5"}, {{"f1", {"d"}}}),
       Net::kVgg},
      // An MLP's layers as the same chain (fc0 16 -> 32, fc1 and fc2 32 -> 32, the classifier
      // fc3 32 -> 8): output columns over the replicas, the classifier's contracted features
      // (partial logits), whole copies beside ZeRO-1/2, on 2, 4 and 8 ranks.
      {"mlp_dp2_per_op_columns", per_op(plan_of(2, 1, 1), 2, {"fc1"}, {{"f2", {"d"}}}), Net::kMlp},
      {"mlp_dp2_per_op_contracted", per_op(plan_of(2, 1, 1), 2, {"fc3"}, {{"f3", {"d"}}}),
       Net::kMlp},
      {"mlp_dp2_zero1_per_op_whole", per_op(plan_of(2, 1, 1, 1), 2, {"fc0", "fc1"}, {}), Net::kMlp},
      {"mlp_dp4_zero2_per_op",
       per_op(per_op(plan_of(4, 1, 1, 2), 2, {"fc1"}, {{"f2", {"d"}}}), 2, {"fc3"},
              {{"f3", {"d"}}}),
       Net::kMlp},
      {"mlp_dp8_per_op_columns", per_op(plan_of(8, 1, 1), 1, {"fc2"}, {{"f3", {"d"}}}), Net::kMlp},
  };
}

spec::Plan compressed(spec::Plan p, spec::CompressionKind kind, bool error_feedback) {
  p.compression.kind = kind;
  p.compression.error_feedback = error_feedback;
  p.compression.bucket = 64;  // several scales per bucket of the tiny models
  return p;
}

spec::Plan topk_ratio(spec::Plan p, double ratio) {
  p.compression.ratio = ratio;
  return p;
}

spec::Plan split_allgather(spec::Plan p) {
  p.compression.sparse_algorithm = spec::SparseAlgorithm::kSplitAllGather;
  return p;
}

spec::Plan powersgd_rank(spec::Plan p, int64_t rank) {
  p.compression.rank = rank;
  return p;
}

// Lossy, so not equal to the single-rank run: checked for the ops they run (and, on 2 ranks, for
// what they cost in bytes and in loss).
std::vector<Layout> compressed_layouts() {
  using C = spec::CompressionKind;
  return {
      {"dp2_qsgd", compressed(plan_of(2, 1, 1), C::kQsgd)},
      {"mlp_dp2_onebit", compressed(plan_of(2, 1, 1), C::kOnebit), Net::kMlp},
      {"dp4_topk", compressed(plan_of(4, 1, 1), C::kTopk)},
      {"llama_dp2_tp2_qsgd", compressed(plan_of(2, 2, 1), C::kQsgd), Net::kLlama},
      {"dp2_pp2_onebit_tied", compressed(plan_of(2, 1, 2), C::kOnebit)},
      {"dp2_tp2_pp2_sp_topk_noef", compressed(plan_of(2, 2, 2, 0, true), C::kTopk, false)},
      // SparCML: the top-k pairs summed by a sparse all-reduce; at 40% two ranks' pairs go dense.
      {"dp4_sparcml", compressed(plan_of(4, 1, 1), C::kSparcml)},
      {"dp4_sparcml_dense", topk_ratio(compressed(plan_of(4, 1, 1), C::kSparcml), 0.4)},
      {"dp2_pp2_sparcml_tied", compressed(plan_of(2, 1, 2), C::kSparcml)},
      {"dp8_sparcml_noef", compressed(plan_of(8, 1, 1), C::kSparcml, false)},
      // Its split all-gather: each range summed by its owner, the sums all-gathered.
      {"dp4_sparcml_split", split_allgather(compressed(plan_of(4, 1, 1), C::kSparcml))},
      {"dp4_sparcml_split_dense",
       split_allgather(topk_ratio(compressed(plan_of(4, 1, 1), C::kSparcml), 0.4))},
      {"dp2_pp2_sparcml_split_tied", split_allgather(compressed(plan_of(2, 1, 2), C::kSparcml))},
      // PowerSGD: each bucket's weight matrices as P and Q, the rest all-reduced.
      {"dp2_powersgd", compressed(plan_of(2, 1, 1), C::kPowersgd)},
      {"mlp_dp2_powersgd_noef", compressed(plan_of(2, 1, 1), C::kPowersgd, false), Net::kMlp},
      {"cnn_dp2_powersgd", compressed(plan_of(2, 1, 1), C::kPowersgd), Net::kCnn},
      {"llama_dp2_tp2_powersgd", compressed(plan_of(2, 2, 1), C::kPowersgd), Net::kLlama},
      {"dp2_pp2_powersgd_tied", compressed(plan_of(2, 1, 2), C::kPowersgd)},
      {"dp4_tp2_sp_powersgd2",
       powersgd_rank(compressed(plan_of(4, 2, 1, 0, true), C::kPowersgd), 2)},
      // A mixture of experts: the router's and every expert's gradient as P and Q too.
      {"moe_dp2_powersgd", compressed(plan_of(2, 1, 1), C::kPowersgd), Net::kMoe},
      {"moe_dp2_tp2_sp_powersgd", compressed(plan_of(2, 2, 1, 0, true), C::kPowersgd), Net::kMoe},
  };
}

// A capacity with the dispatcher over tp: each tp rank drops over its own s/tp tokens (as
// Megatron-LM's router does), not the single rank's choice, so checked for its ops only.
std::vector<Layout> per_tp_rank_capacity_layouts() {
  return {
      {"moe_capacity_dp2_tp2_sp_ep2", with_ep(plan_of(2, 2, 1, 0, true), 2), Net::kMoeCapacity}};
}

bool suite_clips(const spec::Plan& plan) {
  return !spec::asynchronous(plan.schedule) && !plan.parameter_server.enabled;
}

spec::ExecutorRun suite_run(const Layout& l, spec::ExecutorBackend backend,
                            spec::ExecutorPrecision precision) {
  spec::ExecutorRun run;
  run.backend = backend;
  run.precision = precision;
  run.clipping = suite_clips(l.plan);
  return run;
}

}  // namespace sextant::layout_suite
