// Structure of the lowering: tensor-parallel collectives, backward costs, pipeline split, and the
// zoo files' robustness.
#include "sextant/models/lowering.hpp"

#include <gtest/gtest.h>

#include "json_mutations.hpp"
#include "sextant/models/counts.hpp"
#include "sextant/models/vocabulary.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::models {
namespace {

int count_class(const std::vector<Op>& ops, spec::OpClass c) {
  int n = 0;
  for (const Op& op : ops) n += op.op_class == c ? 1 : 0;
  return n;
}

TEST(Lowering, MegatronTensorParallelHasTwoAllReducesPerPass) {
  spec::ModelSpec m = zoo_model("gpt3-1.3b");
  LoweredModel l = lower(m, {1, 0, spec::Dtype::kBf16, 4, false});
  const Layer& block = l.layers[1];
  EXPECT_EQ(count_class(block.forward, spec::OpClass::kAllReduce), 2);
  EXPECT_EQ(count_class(block.backward, spec::OpClass::kAllReduce), 2);
  // Message size: the full activation b*s*h in bf16.
  for (const Op& op : block.forward) {
    if (op.op_class == spec::OpClass::kAllReduce) {
      EXPECT_EQ(op.bytes, 2048 * 2048 * 2);
    }
  }
}

TEST(Lowering, SequenceParallelReplacesAllReduceByReduceScatterAndAllGather) {
  spec::ModelSpec m = zoo_model("gpt3-1.3b");
  LoweredModel l = lower(m, {1, 0, spec::Dtype::kBf16, 4, true});
  for (const std::vector<Op>* ops : {&l.layers[1].forward, &l.layers[1].backward}) {
    EXPECT_EQ(count_class(*ops, spec::OpClass::kAllReduce), 0);
    EXPECT_EQ(count_class(*ops, spec::OpClass::kReduceScatter), 2);
    EXPECT_EQ(count_class(*ops, spec::OpClass::kAllGather), 2);
  }
}

TEST(Lowering, NoCollectivesWithoutTensorParallelism) {
  LoweredModel l = lower(zoo_model("gpt2-124m"), {1, 0, spec::Dtype::kBf16, 1, false});
  for (const Layer& layer : l.layers)
    for (const Op& op : layer.forward) EXPECT_FALSE(op.is_comm()) << op.name;
}

TEST(Lowering, BackwardMatmulsCostTwiceTheForward) {
  LoweredModel l = lower(zoo_model("gpt2-350m"), {2, 0, spec::Dtype::kBf16, 1, false});
  for (const Layer& layer : l.layers)
    EXPECT_NEAR(layer.backward_flops(), 2 * layer.forward_flops(), 1e-6 * layer.forward_flops())
        << layer.name;
}

TEST(Lowering, PipelineSplitCoversTheBlocks) {
  LoweredModel l = lower(zoo_model("gpt-tiny"), {1, 0, spec::Dtype::kFp32, 1, false});
  EXPECT_EQ(l.layers.size(), 6u);  // embedding, 4 blocks, head
  EXPECT_EQ(pipeline_layer_count(l), 4);
  EXPECT_EQ(l.layers.front().kind, LayerKind::kEmbedding);
  EXPECT_EQ(l.layers.back().kind, LayerKind::kHead);
  LoweredModel r = lower(zoo_model("resnet50"), {1, 0, spec::Dtype::kBf16, 1, false});
  EXPECT_EQ(pipeline_layer_count(r), 2 + 16 + 2);  // stem conv, pool, 16 blocks, pool, fc
}

// gpt3-1.3b's 24 blocks are lowered alike (only their names differ: block0 ... block23); the
// embedding and head are not blocks; one op of one block made cheaper, or a block's saved bytes
// changed, makes it other work.
TEST(Lowering, BlocksDoTheSameWorkAndOnlyThey) {
  spec::ModelSpec m = zoo_model("gpt3-1.3b");
  LoweredModel l = lower(m, {2, 0, spec::Dtype::kBf16, 2, true});
  ASSERT_EQ(l.layers.size(), 26u);
  for (size_t i = 2; i + 1 < l.layers.size(); ++i) {
    EXPECT_TRUE(l.layers[i].same_work_as(l.layers[1])) << l.layers[i].name;
    EXPECT_NE(l.layers[i].name, l.layers[1].name);
  }
  EXPECT_EQ(l.layers[24].name, "block23");
  EXPECT_FALSE(l.layers[0].same_work_as(l.layers[1]));
  EXPECT_FALSE(l.layers[25].same_work_as(l.layers[24]));
  Layer changed = l.layers[2];
  changed.backward[3].flops *= 0.5;
  EXPECT_FALSE(changed.same_work_as(l.layers[1]));
  changed = l.layers[2];
  changed.saved_bytes_full += 1;
  EXPECT_FALSE(changed.same_work_as(l.layers[1]));
}

// Megatron-LM's _vocab_size_with_padding: the vocabulary rounded up to a multiple of
// make_vocab_size_divisible_by x tp, split evenly. GPT-2's 50257 by hand: 50304 = 393 x 128 at tp
// 1; 50432 = 197 x 256 at tp 2, 25216 rows a rank; without padding ceil(50257 / 8) = 6283 at tp 8.
TEST(Lowering, VocabularyPaddedToTheStacksMultipleTimesTp) {
  EXPECT_EQ(vocab_shard(50257, 1, 128), 50304);
  EXPECT_EQ(vocab_shard(50257, 2, 128), 25216);
  EXPECT_EQ(vocab_shard(50257, 8, 1), 6283);
  EXPECT_EQ(vocab_shard(51200, 8, 128), 6400);  // already a multiple: unchanged
  // The real rows of each shard: rank 1 of 2 holds 50257 - 25216 = 25041, the rest padding; a
  // small vocabulary (64 at tp 2, 128 a rank) leaves rank 1 nothing but padding.
  EXPECT_EQ(vocab_rows_used(50257, 25216, 0), 25216);
  EXPECT_EQ(vocab_rows_used(50257, 25216, 1), 25041);
  EXPECT_EQ(vocab_rows_used(64, 128, 1), 0);
  // The lowering prices and counts the padded shard: the logits GEMM's N, the head's and the
  // tied table's parameters; the model's own parameter count stays unpadded.
  spec::ModelSpec m = zoo_model("gpt2-124m");
  LoweringOptions o{1, 0, spec::Dtype::kBf16, 2, false};
  o.vocab_multiple = 128;
  LoweredModel padded = lower(m, o);
  EXPECT_EQ(padded.vocab_shard, 25216);
  EXPECT_EQ(padded.tied_table_params, 25216 * 768);
  EXPECT_EQ(padded.layers.front().params, 25216 * 768 + 1024 * 768);  // table + positions
  EXPECT_EQ(padded.layers.front().params_total, 50257 * 768 + 1024 * 768);
  bool found = false;
  for (const Op& op : padded.layers.back().forward) {
    if (op.name != "head.logits") continue;
    found = true;
    ASSERT_EQ(op.matmuls.size(), 1u);
    EXPECT_EQ(op.matmuls[0].n, 25216);
  }
  EXPECT_TRUE(found);
  o.vocab_multiple = 1;
  EXPECT_EQ(lower(m, o).vocab_shard, 25129);  // ceil(50257 / 2)
}

// ZeRO's shard rule (zero_updated_params): mlp-small's four layers, widths 64-256-256-256-16
// with biases, hold 64 x 256 + 256 = 16640, 256 x 256 + 256 = 65792 (twice) and 256 x 16 + 16 =
// 4112 parameters, 152336 in all. With buckets of one layer each (any layer's gradients fill a
// 1-byte bucket) over 3 replicas every rank's padded shards are ceil(4112 / 3) = 1371,
// 2 x ceil(65792 / 3) = 2 x 21931 and ceil(16640 / 3) = 5547: 50780, one more than
// ceil(152336 / 3) = 50779 (the spans' padding). ZeRO-3 shards each layer: the same spans.
TEST(Lowering, ZeroShardsArePaddedPerSpan) {
  EXPECT_EQ(zero_shard(10, 4), 3);
  EXPECT_EQ(zero_shard(12, 4), 3);
  EXPECT_EQ(zero_shard(0, 4), 0);
  const LoweredModel l = lower(zoo_model("mlp-small"), {2, 0, spec::Dtype::kFp32, 1, false});
  spec::Plan plan;
  plan.dp = 3;
  plan.micro_batch = 2;
  plan.global_batch = 6;
  const std::vector<GradientBucket> buckets = gradient_buckets(plan, l, 0, 1, 4);
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(stage_params(plan, l, 0), 152336);
  EXPECT_EQ(zero_updated_params(plan, l, 0, buckets), 152336);  // no ZeRO: every parameter
  for (int zero : {1, 2, 3}) {
    plan.zero = zero;
    EXPECT_EQ(zero_updated_params(plan, l, 0, buckets), 50780) << "zero " << zero;
  }
  // One bucket of everything: one span, ceil(152336 / 3).
  plan.zero = 1;
  EXPECT_EQ(zero_updated_params(plan, l, 0, gradient_buckets(plan, l, 0, int64_t{1} << 30, 4)),
            50779);
  // One replica holds it all.
  plan.dp = 1;
  plan.global_batch = 2;
  EXPECT_EQ(zero_updated_params(plan, l, 0, {}), 152336);
}

TEST(Lowering, TensorParallelOnAnMlpOrAnUndividedCnnIsRefused) {
  // tp splits a CNN's channels (channel_split_lowering_test.cpp) when it divides them all:
  // ResNet-50's stem has 64.
  EXPECT_THROW(lower(zoo_model("resnet50"), {1, 0, spec::Dtype::kBf16, 3, false}), InputError);
  EXPECT_NO_THROW(lower(zoo_model("resnet50"), {1, 0, spec::Dtype::kBf16, 2, false}));
  EXPECT_THROW(lower(zoo_model("mlp-small"), {1, 0, spec::Dtype::kBf16, 2, false}), InputError);
}

TEST(Zoo, EveryModelLoadsAndRoundTrips) {
  std::vector<std::string> names = zoo_names();
  EXPECT_GE(names.size(), 21u);
  for (const std::string& name : names) {
    spec::ModelSpec m = zoo_model(name);
    EXPECT_EQ(m.name, name);
    EXPECT_FALSE(m.source.empty()) << name;
    EXPECT_EQ(spec::to_json(spec::model_from_json(spec::to_json(m), "again")), spec::to_json(m));
    EXPECT_GT(parameter_count(m), 0);
  }
}

TEST(Zoo, EveryMutationOfAZooFileIsRejectedNamingTheField) {
  for (const char* name : {"gpt2-124m", "llama3-8b", "bert-large", "mlp-small", "alexnet"}) {
    spec::Json valid = spec::to_json(zoo_model(name));
    for (const test::Mutation& mu : test::leaf_mutations(valid)) {
      // Free text fields accept any string but not a number; numbers must be > 0 or >= 0.
      try {
        spec::model_from_json(mu.document, "doc.json");
        ADD_FAILURE() << name << mu.pointer << ": " << mu.description << " was accepted";
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find(mu.pointer), std::string::npos) << e.what();
      }
    }
    std::string text = valid.dump(2);
    for (const std::string& cut : test::truncations(text))
      EXPECT_THROW(spec::model_from_json(spec::parse_json_text(cut, "doc.json"), "doc.json"),
                   InputError);
  }
}

}  // namespace
}  // namespace sextant::models
