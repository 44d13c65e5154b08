// The wire format and codec work of compressed gradient exchanges, by hand.
#include "sextant/models/gradient_compression.hpp"

#include <gtest/gtest.h>

namespace sextant::models {
namespace {

spec::GradientCompression make(spec::CompressionKind kind, bool ef = true) {
  spec::GradientCompression c;
  c.kind = kind;
  c.error_feedback = ef;
  return c;
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
  EXPECT_EQ(d.name, kDecompressOp);
  EXPECT_EQ(d.op_class, spec::OpClass::kElementwise);
  // Top-k: also a read and a write of the gradient at each of the 4 x 10 pairs.
  EXPECT_EQ(compression_decode_op(make(spec::CompressionKind::kTopk), 1000, 4, 4).bytes,
            4 * 20 * 4 + 4000 + 4 * 10 * 2 * 4);
}

TEST(GradientCompression, MemoryIsTheResidualAndTheBuckets) {
  const spec::GradientCompression q = make(spec::CompressionKind::kQsgd);
  // 10^6 fp32 residuals, and this rank's plus 4 gathered encodings of a 1000-element bucket.
  EXPECT_EQ(compression_memory_bytes(q, 1000000, 1000, 4), 4000000 + 5 * 127 * 4);
  EXPECT_EQ(compression_memory_bytes(make(spec::CompressionKind::kQsgd, false), 1000000, 1000, 4),
            5 * 127 * 4);
  EXPECT_EQ(compression_memory_bytes(spec::GradientCompression{}, 1000000, 1000, 4), 0);
}

}  // namespace
}  // namespace sextant::models
