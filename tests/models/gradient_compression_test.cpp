// The wire format and codec work of compressed gradient exchanges, by hand.
#include "sextant/models/gradient_compression.hpp"

#include <gtest/gtest.h>

#include <numeric>

#include "sextant/models/zoo.hpp"

namespace sextant::models {
namespace {

spec::GradientCompression make(spec::CompressionKind kind, bool ef = true) {
  spec::GradientCompression c;
  c.kind = kind;
  c.error_feedback = ef;
  return c;
}

GradientBucket bucket(int64_t params, std::vector<WeightMatrix> matrices = {}) {
  GradientBucket b;
  b.params = params;
  b.matrices = std::move(matrices);
  return b;
}

TEST(GradientCompression, EncodedWordsByHand) {
  spec::GradientCompression q = make(spec::CompressionKind::kQsgd);  // 4 bits, 512 per norm
  // 1000 elements of 4 bits: 4000 bits = 125 words; 2 norms (512 + 488 elements).
  EXPECT_EQ(encoded_words(q, 1000), 125 + 2);
  q.bits = 8;
  EXPECT_EQ(encoded_words(q, 1000), 250 + 2);
  EXPECT_EQ(qsgd_levels(2), 1);
  EXPECT_EQ(qsgd_levels(4), 7);
  EXPECT_EQ(qsgd_levels(8), 127);
  // 1-bit: 1000 signs in 32 words (the last holds 8), 2 scales.
  EXPECT_EQ(encoded_words(make(spec::CompressionKind::kOnebit), 1000), 32 + 2);
  // Top-k at 1%: 10 (index, value) pairs; at least one pair however small the ratio.
  spec::GradientCompression t = make(spec::CompressionKind::kTopk);
  EXPECT_EQ(encoded_words(t, 1000), 20);
  t.ratio = 1e-6;
  EXPECT_EQ(encoded_words(t, 1000), 2);
  t.ratio = 0.0015;  // 1.5 elements round up to 2
  EXPECT_EQ(topk_count(t.ratio, 1000), 2);
  // The all-gather carries every rank's words.
  EXPECT_EQ(compressed_gather_bytes(make(spec::CompressionKind::kOnebit), 1000, 4), 4 * 34 * 4);
}

TEST(GradientCompression, CodecBytesByHand) {
  const spec::GradientCompression q = make(spec::CompressionKind::kQsgd);
  // Encode: two reads of 1000 fp32 gradients (8000 B), 127 words written (508 B); error feedback
  // reads and writes the fp32 residual (8000 B).
  EXPECT_EQ(compression_encode_op(q, 1000, 4).bytes, 8000 + 508 + 8000);
  EXPECT_EQ(compression_encode_op(make(spec::CompressionKind::kQsgd, false), 1000, 4).bytes,
            8000 + 508);
  // bf16 gradients are read at 2 bytes; the residual stays fp32.
  EXPECT_EQ(compression_encode_op(q, 1000, 2).bytes, 4000 + 508 + 8000);
  // Decode over 4 ranks: 4 x 127 words read, 1000 gradients written.
  const Op d = compression_decode_op(q, 1000, 4, 4);
  EXPECT_EQ(d.bytes, 4 * 127 * 4 + 4000);
  EXPECT_EQ(d.name, models::op_name(models::OpId::kDpDecompress));
  EXPECT_EQ(d.op_class, spec::OpClass::kElementwise);
  // Top-k: also a read and a write of the gradient at each of the 4 x 10 pairs.
  EXPECT_EQ(compression_decode_op(make(spec::CompressionKind::kTopk), 1000, 4, 4).bytes,
            4 * 20 * 4 + 4000 + 4 * 10 * 2 * 4);
}

TEST(GradientCompression, MemoryIsTheResidualAndTheBuckets) {
  const spec::GradientCompression q = make(spec::CompressionKind::kQsgd);
  // 10^6 fp32 residuals, and this rank's plus 4 gathered encodings of the largest bucket's 1000
  // elements.
  const std::vector<GradientBucket> buckets{bucket(1000), bucket(600)};
  EXPECT_EQ(compression_memory_bytes(q, 1000000, buckets, 4, 4), 4000000 + 5 * 127 * 4);
  EXPECT_EQ(
      compression_memory_bytes(make(spec::CompressionKind::kQsgd, false), 1000000, buckets, 4, 4),
      5 * 127 * 4);
  EXPECT_EQ(compression_memory_bytes(spec::GradientCompression{}, 1000000, buckets, 4, 4), 0);
}

// SparCML's rounds by hand (n = 1000, k = 10, dp 4): the union of j independent uniform
// selections of 10 of 1000 is expected to hold 1000 (1 - 0.99^j) pairs: 19.9 for j = 2, 39.404
// for j = 4. Round 0 sends the 10 selected pairs (80 B), round 1 the 20 of two ranks (160 B).
TEST(SparCml, TheRoundsByHand) {
  EXPECT_NEAR(expected_union(1000, 10, 1), 10, 1e-9);
  EXPECT_NEAR(expected_union(1000, 10, 2), 19.9, 1e-9);
  EXPECT_NEAR(expected_union(1000, 10, 4), 39.40399, 1e-9);
  const std::vector<SparseRound> r = sparse_all_reduce_rounds(1000, 10, 4);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].pairs, 10);
  EXPECT_EQ(r[0].bytes, 80);
  EXPECT_EQ(r[0].merged_pairs, 20);
  EXPECT_FALSE(r[0].dense);
  EXPECT_EQ(r[1].pairs, 20);
  EXPECT_EQ(r[1].bytes, 160);
  EXPECT_EQ(r[1].merged_pairs, 39);
  EXPECT_TRUE(sparse_all_reduce_rounds(1000, 10, 1).empty());
  // The ops in order: encode, (exchange, merge) a round, decode. Merge reads both unions and
  // writes the merged one: 8 (10 + 10 + 20) and 8 (20 + 20 + 39). Decode zeroes 1000 gradients
  // (4000 B) and adds 39 pairs, each read (8 B) and added to its gradient (4 + 4 B).
  spec::GradientCompression c = make(spec::CompressionKind::kSparcml);
  const std::vector<Op> ops = compressed_exchange_ops(c, bucket(1000), 4, 4);
  ASSERT_EQ(ops.size(), 6u);
  EXPECT_EQ(ops[0].bytes, compression_encode_op(c, 1000, 4).bytes);
  EXPECT_EQ(ops[1].name, op_name(OpId::kDpSparseExchange));
  EXPECT_EQ(ops[1].collective, spec::CollectiveKind::kSendRecv);
  EXPECT_EQ(ops[1].bytes, 80);
  EXPECT_EQ(ops[2].name, op_name(OpId::kDpSparseMerge));
  EXPECT_EQ(ops[2].bytes, 8 * 40);
  EXPECT_EQ(ops[3].bytes, 160);
  EXPECT_EQ(ops[4].bytes, 8 * 79);
  EXPECT_EQ(ops[5].name, op_name(OpId::kDpDecompress));
  EXPECT_EQ(ops[5].bytes, 4000 + 39 * 16);
}

// DSAR's switch (n = 100, k = 30, dp 4): two ranks' union is expected at 100 (1 - 0.7^2) = 51
// pairs, more than n / 2, so round 1 sends 100 dense values (400 B) and merges three dense
// vectors (1200 B); four ranks' 76 pairs stay dense and are copied (400 B read, 400 B written).
TEST(SparCml, GoesDenseOnceThePairsOutweighTheVector) {
  EXPECT_FALSE(sparse_goes_dense(50, 100));
  EXPECT_TRUE(sparse_goes_dense(51, 100));
  const std::vector<SparseRound> r = sparse_all_reduce_rounds(100, 30, 4);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].bytes, 240);
  EXPECT_EQ(r[0].merged_pairs, 51);
  EXPECT_TRUE(r[1].dense);
  EXPECT_EQ(r[1].bytes, 400);
  EXPECT_EQ(r[1].merged_pairs, 76);
  spec::GradientCompression c = make(spec::CompressionKind::kSparcml);
  c.ratio = 0.3;
  const std::vector<Op> ops = compressed_exchange_ops(c, bucket(100), 4, 4);
  ASSERT_EQ(ops.size(), 6u);
  EXPECT_EQ(ops[2].bytes, 8 * (30 + 30 + 51));
  EXPECT_EQ(ops[4].bytes, 1200);
  EXPECT_EQ(ops[5].bytes, 800);
  // Its buffers: the fp32 residual, and three vectors of the largest bucket, each up to dense.
  EXPECT_EQ(compression_memory_bytes(c, 5000, {bucket(100), bucket(60)}, 4, 4), 20000 + 1200);
}

// SparCML's split all-gather by hand (n = 1000, k = 10, dp 4): four ranges of 250; a rank's
// all-to-all buffer is its 10 pairs (80 B); a range's union is expected at a quarter of four
// selections' 39.404 pairs, 9.85, so 10 pairs, and the gather collects 4 x 10 pairs (320 B).
// The owner reads the 10 pairs it receives (80 B), zeroes and scans its accumulator and marks
// (2 x 5 B x 250) and writes its 10 pairs (80 B); the decode zeroes 1000 gradients (4000 B) and
// adds 40 pairs (16 B each).
TEST(SparCml, TheSplitAllGatherByHand) {
  EXPECT_EQ(sparse_range_begin(1000, 4, 1), 250);
  EXPECT_EQ(sparse_range_begin(10, 3, 1), 3);  // 3, 3 and 4 elements
  EXPECT_EQ(sparse_range_begin(10, 3, 2), 6);
  const SparseSplit s = sparse_split_allgather(1000, 10, 4);
  EXPECT_EQ(s.split_bytes, 80);
  EXPECT_EQ(s.range_pairs, 10);
  EXPECT_FALSE(s.dense);
  EXPECT_EQ(s.gather_bytes, 320);
  EXPECT_EQ(s.merge_bytes, 80 + 2500 + 80);
  spec::GradientCompression c = make(spec::CompressionKind::kSparcml);
  c.sparse_algorithm = spec::SparseAlgorithm::kSplitAllGather;
  const std::vector<Op> ops = compressed_exchange_ops(c, bucket(1000), 4, 4);
  ASSERT_EQ(ops.size(), 5u);
  EXPECT_EQ(ops[0].bytes, compression_encode_op(c, 1000, 4).bytes);
  EXPECT_EQ(ops[1].name, op_name(OpId::kDpSparseSplit));
  EXPECT_EQ(ops[1].collective, spec::CollectiveKind::kAllToAll);
  EXPECT_EQ(ops[1].bytes, 80);
  EXPECT_EQ(ops[2].name, op_name(OpId::kDpSparseMerge));
  EXPECT_EQ(ops[2].bytes, 2660);
  EXPECT_EQ(ops[3].name, op_name(OpId::kDpSparseGather));
  EXPECT_EQ(ops[3].collective, spec::CollectiveKind::kAllGather);
  EXPECT_EQ(ops[3].bytes, 320);
  EXPECT_EQ(ops[4].name, op_name(OpId::kDpDecompress));
  EXPECT_EQ(ops[4].bytes, 4000 + 40 * 16);
  // Dense ranges (n = 100, k = 45, dp 2): two selections' union is expected at
  // 100 (1 - 0.55^2) = 69.75 pairs, 35 a range of 50 -- more than half of it -- so the gather
  // collects the dense vector (400 B), the owner writes no pairs (8 x 45 + 10 x 50 B), and the
  // decode copies it (400 B read, 400 B written).
  c.ratio = 0.45;
  const std::vector<Op> dense = compressed_exchange_ops(c, bucket(100), 2, 4);
  ASSERT_EQ(dense.size(), 5u);
  EXPECT_EQ(dense[2].bytes, 360 + 500);
  EXPECT_EQ(dense[3].bytes, 400);
  EXPECT_EQ(dense[4].bytes, 800);
  // Its buffers: the fp32 residual, the 45 pairs sent and those received (720 B), the range's
  // accumulator and marks (5 B x 51) and the gathered sums (400 B).
  EXPECT_EQ(compression_memory_bytes(c, 5000, {bucket(100), bucket(60)}, 2, 4),
            20000 + 720 + 255 + 400);
}

TEST(PowerSgd, CompressesAMatrixWhenItsFactorsAreLessThanHalfOfIt) {
  // PyTorch's rule: (rows + cols) * rank * 2 < rows * cols.
  EXPECT_FALSE(powersgd_compresses(1, {4, 4}));  // 16 < 16: no
  EXPECT_TRUE(powersgd_compresses(1, {5, 5}));   // 20 < 25
  EXPECT_FALSE(powersgd_compresses(2, {8, 8}));  // 64 < 64: no
  EXPECT_TRUE(powersgd_compresses(2, {9, 9}));   // 72 < 81
  EXPECT_FALSE(powersgd_compresses(1, {1, 1000}));
}

TEST(PowerSgd, TheBucketsExchangeByHand) {
  // Rank 2; a 10 x 20 matrix is compressed ((30) * 2 * 2 = 120 < 200), a 3 x 100 one is not
  // (103 * 4 = 412 > 300); the bucket's other 500 elements are vectors.
  spec::GradientCompression c = make(spec::CompressionKind::kPowersgd);
  c.rank = 2;
  const GradientBucket b = bucket(1000, {{10, 20}, {3, 100}});
  const PowerSgdSplit split = powersgd_split(2, b);
  EXPECT_EQ(split.matrices, 1);
  EXPECT_EQ(split.compressed, 200);
  EXPECT_EQ(split.uncompressed, 800);
  EXPECT_EQ(split.p_elements, 20);  // 2 x 10
  EXPECT_EQ(split.q_elements, 40);  // 2 x 20

  // fp32 gradients (g = 4), error feedback: n = 200 compressed elements, p = 20, q = 40.
  const std::vector<Op> ops = compressed_exchange_ops(c, b, 8, 4);
  ASSERT_EQ(ops.size(), 6u);
  EXPECT_EQ(ops[0].name, models::op_name(models::OpId::kDpAllReduce));
  EXPECT_EQ(ops[0].collective, spec::CollectiveKind::kAllReduce);
  EXPECT_EQ(ops[0].bytes, 800 * 4);
  // Fold (gradients read, residual read and written: 800 + 1600), M read from the residual
  // (800), Q read (160), P written (80).
  EXPECT_EQ(ops[1].name, models::op_name(models::OpId::kDpCompress));
  EXPECT_EQ(ops[1].bytes, 2400 + 800 + 160 + 80);
  EXPECT_EQ(ops[2].name, models::op_name(models::OpId::kDpPowerSgdPAllReduce));
  EXPECT_EQ(ops[2].bytes, 80);  // independent of dp, unlike the gathers
  // Gram-Schmidt over 2 columns: col 0 normalised (2 passes over it), taken out of col 1 (3),
  // col 1 normalised (2): 7 column passes = 3.5 passes over P (280 bytes); M read (800), P read
  // (80), Q written (160).
  EXPECT_EQ(ops[3].name, models::op_name(models::OpId::kDpPowerSgdProject));
  EXPECT_EQ(ops[3].bytes, 280 + 800 + 80 + 160);
  EXPECT_EQ(ops[4].name, models::op_name(models::OpId::kDpPowerSgdQAllReduce));
  EXPECT_EQ(ops[4].bytes, 160);
  // P Q^T: factors read (240), gradients written (800); residual read and written (1600) after
  // the local factors are read (240).
  EXPECT_EQ(ops[5].name, models::op_name(models::OpId::kDpDecompress));
  EXPECT_EQ(ops[5].bytes, 240 + 800 + 1600 + 240);
  EXPECT_EQ(compressed_exchange_ops(c, b, 64, 4)[2].bytes, 80);

  // No error feedback: M is the gradients; nothing folded, no residual kept.
  c.error_feedback = false;
  const std::vector<Op> plain = compressed_exchange_ops(c, b, 8, 4);
  EXPECT_EQ(plain[1].bytes, 800 + 160 + 80);
  EXPECT_EQ(plain[5].bytes, 240 + 800);
  // A bucket of vectors only is one uncompressed all-reduce.
  const std::vector<Op> vectors = compressed_exchange_ops(c, bucket(300, {{3, 100}}), 8, 4);
  ASSERT_EQ(vectors.size(), 1u);
  EXPECT_EQ(vectors[0].bytes, 1200);

  // Memory: the fp32 residual of 10^6 parameters, every compressed matrix's Q (40 + 40) and the
  // largest bucket's P and Q (60), in 4-byte elements.
  c.error_feedback = true;
  EXPECT_EQ(compression_memory_bytes(c, 1000000, {b, b}, 8, 4), 4000000 + (80 + 60) * 4);
}

TEST(PowerSgd, TheLoweringListsTheExecutorsWeightMatrices) {
  // GPT-2 350M at tp 2, by hand (h = 1024, ffn = 4096, biases, learned positions, tied table):
  // a block holds qkv [h, 3h/2], proj [h/2, h], fc1 [h, 2h], fc2 [2h, h]; the rest of its
  // parameters are two layer norms (4h) and the biases 3h/2 + h + 2h + h.
  const spec::ModelSpec model = zoo_model("gpt2-350m");
  LoweringOptions o;
  o.tp = 2;
  const LoweredModel lowered = lower(model, o);
  const int64_t h = 1024;
  const Layer& block = lowered.layers[1];
  ASSERT_EQ(block.kind, LayerKind::kBlock);
  const std::vector<WeightMatrix> expected{{h, 3 * h / 2}, {h / 2, h}, {h, 2 * h}, {2 * h, h}};
  EXPECT_EQ(block.matrices, expected);
  int64_t in_matrices = 0;
  for (const WeightMatrix& m : block.matrices) in_matrices += m.rows * m.cols;
  EXPECT_EQ(block.params - in_matrices, 4 * h + 3 * h / 2 + h + 2 * h + h);
  // The embedding: the vocabulary shard of the table and the 1024 learned positions.
  const Layer& embedding = lowered.layers.front();
  const std::vector<WeightMatrix> table{{lowered.vocab_shard, h}, {1024, h}};
  EXPECT_EQ(embedding.matrices, table);
  EXPECT_EQ(embedding.params, lowered.vocab_shard * h + 1024 * h);
}

}  // namespace
}  // namespace sextant::models
