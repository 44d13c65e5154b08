// Wire format and codec work of compressed gradient exchanges.
#include "sextant/models/gradient_compression.hpp"

#include <algorithm>
#include <cmath>

namespace sextant::models {

using spec::CompressionKind;

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

int64_t topk_count(double ratio, int64_t elements) {
  const auto k = static_cast<int64_t>(std::ceil(ratio * static_cast<double>(elements)));
  return std::clamp<int64_t>(k, 1, std::max<int64_t>(elements, 1));
}

int64_t qsgd_levels(int64_t bits) {
  return (int64_t{1} << (bits - 1)) - 1;
}

int64_t encoded_words(const spec::GradientCompression& c, int64_t elements) {
  switch (c.kind) {
    case CompressionKind::kQsgd:
      return ceil_div(elements * c.bits, 32) + ceil_div(elements, c.bucket);
    case CompressionKind::kOnebit:
      return ceil_div(elements, 32) + ceil_div(elements, c.bucket);
    case CompressionKind::kTopk:
      return 2 * topk_count(c.ratio, elements);
    case CompressionKind::kNone:
      break;
  }
  return elements;  // uncompressed fp32
}

int64_t compressed_gather_bytes(const spec::GradientCompression& c, int64_t elements, int64_t dp) {
  return dp * encoded_words(c, elements) * 4;
}

Op compression_encode_op(const spec::GradientCompression& c, int64_t elements, int64_t grad_bytes) {
  Op op;
  op.name = kCompressOp;
  op.op_class = spec::OpClass::kElementwise;
  op.shape = {elements};
  op.bytes = 2 * elements * grad_bytes + encoded_words(c, elements) * 4;
  if (c.error_feedback) op.bytes += 2 * elements * 4;
  // Not matrix FLOPs: the elementwise work is priced by its bytes.
  op.flops = 0;
  op.kernels = 2;
  return op;
}

Op compression_decode_op(const spec::GradientCompression& c, int64_t elements, int64_t dp,
                         int64_t grad_bytes) {
  Op op;
  op.name = kDecompressOp;
  op.op_class = spec::OpClass::kElementwise;
  op.shape = {elements};
  op.bytes = dp * encoded_words(c, elements) * 4 + elements * grad_bytes;
  // Top-k adds each pair at its index: a read and a write of a gradient element per pair.
  if (c.kind == CompressionKind::kTopk)
    op.bytes += dp * topk_count(c.ratio, elements) * 2 * grad_bytes;
  op.flops = 0;
  op.kernels = 1;
  return op;
}

int64_t compression_memory_bytes(const spec::GradientCompression& c, int64_t params,
                                 int64_t largest_bucket, int64_t dp) {
  if (!c.any()) return 0;
  const int64_t residual = c.error_feedback ? params * 4 : 0;
  return residual + (dp + 1) * encoded_words(c, largest_bucket) * 4;
}

}  // namespace sextant::models
