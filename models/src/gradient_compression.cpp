// Wire format and codec work of compressed gradient exchanges.
#include "sextant/models/gradient_compression.hpp"

#include <algorithm>
#include <cmath>

#include "lowering_ops.hpp"

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
    case CompressionKind::kSparcml:
      return 2 * topk_count(c.ratio, elements);
    case CompressionKind::kPowersgd:
    case CompressionKind::kNone:
      break;
  }
  return elements;  // uncompressed fp32
}

double expected_union(int64_t elements, int64_t k, int64_t selections) {
  const double n = static_cast<double>(elements);
  const double miss = 1.0 - static_cast<double>(k) / n;
  return n * (1.0 - std::pow(miss, static_cast<double>(selections)));
}

bool sparse_goes_dense(int64_t pairs, int64_t elements) {
  return 2 * pairs > elements;
}

int64_t sparse_decode_bytes(int64_t elements, int64_t pairs, bool dense, int64_t grad_bytes) {
  return elements * grad_bytes + (dense ? elements * 4 : pairs * (8 + 2 * grad_bytes));
}

std::vector<SparseRound> sparse_all_reduce_rounds(int64_t elements, int64_t k, int64_t dp) {
  std::vector<SparseRound> rounds;
  bool dense = false;
  int64_t pairs = k;  // one selection: exactly k
  for (int64_t held = 1; held < dp; held *= 2) {
    SparseRound r;
    // Round to whole pairs; a union never shrinks below the largest selection in it.
    r.merged_pairs = std::max<int64_t>(k, std::llround(expected_union(elements, k, 2 * held)));
    dense = dense || sparse_goes_dense(pairs, elements);
    r.pairs = pairs;
    r.dense = dense;
    r.bytes = dense ? 4 * elements : 8 * pairs;
    rounds.push_back(r);
    pairs = r.merged_pairs;
  }
  return rounds;
}

int64_t sparse_range_begin(int64_t elements, int64_t dp, int64_t range) {
  return range * elements / dp;
}

int64_t sparse_range_merge_bytes(int64_t range_elements, int64_t received, int64_t union_pairs,
                                 bool dense) {
  return 8 * received + 2 * 5 * range_elements + (dense ? 0 : 8 * union_pairs);
}

SparseSplit sparse_split_allgather(int64_t elements, int64_t k, int64_t dp) {
  SparseSplit s;
  s.split_bytes = 8 * k;
  // The ranges differ by at most one element; priced as the mean range.
  const int64_t range = elements / dp;
  // Rounded to whole pairs; a range holds at least its share of one selection.
  s.range_pairs = std::max<int64_t>(
      (k + dp - 1) / dp, std::llround(expected_union(elements, k, dp) / static_cast<double>(dp)));
  s.dense = sparse_goes_dense(s.range_pairs, range);
  s.gather_bytes = s.dense ? 4 * elements : 8 * dp * s.range_pairs;
  s.merge_bytes = sparse_range_merge_bytes(range, k, s.range_pairs, s.dense);
  return s;
}

int64_t compressed_gather_bytes(const spec::GradientCompression& c, int64_t elements, int64_t dp) {
  return dp * encoded_words(c, elements) * 4;
}

Op compression_encode_op(const spec::GradientCompression& c, int64_t elements, int64_t grad_bytes) {
  Op op;
  op.id = OpId::kDpCompress;
  op.name = op_name(op.id);
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
  op.id = OpId::kDpDecompress;
  op.name = op_name(op.id);
  op.op_class = spec::OpClass::kElementwise;
  op.shape = {elements};
  op.bytes = dp * encoded_words(c, elements) * 4 + elements * grad_bytes;
  // Top-k adds each pair at its index: a read and a write of a gradient element per pair.
  if (c.kind == CompressionKind::kTopk)
    op.bytes += dp * topk_count(c.ratio, elements) * 2 * grad_bytes;
  if (c.kind == CompressionKind::kSparcml &&
      c.sparse_algorithm == spec::SparseAlgorithm::kSplitAllGather) {
    const SparseSplit split = sparse_split_allgather(elements, topk_count(c.ratio, elements), dp);
    op.bytes = sparse_decode_bytes(elements, dp * split.range_pairs, split.dense, grad_bytes);
  } else if (c.kind == CompressionKind::kSparcml) {
    // The final union, added at its indices over zeroed gradients, or the dense sum copied.
    const int64_t k = topk_count(c.ratio, elements);
    const std::vector<SparseRound> rounds = sparse_all_reduce_rounds(elements, k, dp);
    const int64_t pairs = rounds.empty() ? k : rounds.back().merged_pairs;
    const bool dense =
        sparse_goes_dense(pairs, elements) || (!rounds.empty() && rounds.back().dense);
    op.bytes = sparse_decode_bytes(elements, pairs, dense, grad_bytes);
  }
  op.flops = 0;
  op.kernels = 1;
  return op;
}

bool powersgd_compresses(int64_t rank, const WeightMatrix& m) {
  // PyTorch's _should_compress with min_compression_rate 2: (rows + cols) * rank * 2 < rows * cols.
  return (m.rows + m.cols) * rank * 2 < m.rows * m.cols;
}

PowerSgdSplit powersgd_split(int64_t rank, const GradientBucket& bucket) {
  PowerSgdSplit s;
  for (const WeightMatrix& m : bucket.matrices) {
    if (!powersgd_compresses(rank, m)) continue;
    ++s.matrices;
    s.compressed += m.rows * m.cols;
    s.p_elements += rank * m.rows;
    s.q_elements += rank * m.cols;
  }
  s.uncompressed = bucket.params - s.compressed;
  return s;
}

namespace {

Op codec_op(OpId name, int64_t bytes, int64_t elements, int kernels) {
  Op op = memory_op(name, OpClass::kElementwise, bytes, TpSplit::kReplicated, {elements});
  op.kernels = kernels;
  return op;
}

std::vector<Op> powersgd_ops(const spec::GradientCompression& c, const GradientBucket& bucket,
                             int64_t g) {
  const PowerSgdSplit s = powersgd_split(c.rank, bucket);
  std::vector<Op> ops;
  if (s.uncompressed > 0)
    ops.push_back(comm_op(OpId::kDpAllReduce, CollectiveKind::kAllReduce, s.uncompressed * g));
  if (s.matrices == 0) return ops;
  const int64_t r = c.rank, n = s.compressed, p = s.p_elements, q = s.q_elements;
  const bool ef = c.error_feedback;
  // M as the codec reads it: the fp32 residual it was folded into, or the gradients.
  const int64_t m_bytes = ef ? 4 : g;
  // Error feedback: residual += gradients (a read of each, a write of the residual).
  const int64_t fold = ef ? n * g + 2 * n * 4 : 0;
  ops.push_back(codec_op(OpId::kDpCompress, fold + n * m_bytes + q * g + p * g, n, ef ? 2 : 1));
  ops.push_back(comm_op(OpId::kDpPowerSgdPAllReduce, CollectiveKind::kAllReduce, p * g));
  // Gram-Schmidt on each column: normalised (a read and a write), then taken out of each later
  // column (a read of it, a read and a write of the later one): 2 r + 3 r (r - 1) / 2 column
  // passes, (4 + 3 (r - 1)) / 2 passes over P.
  const int64_t orthonormalise = p * g * (4 + 3 * (r - 1)) / 2;
  ops.push_back(codec_op(OpId::kDpPowerSgdProject, orthonormalise + n * m_bytes + p * g + q * g, n,
                         static_cast<int>(r) + 1));
  ops.push_back(comm_op(OpId::kDpPowerSgdQAllReduce, CollectiveKind::kAllReduce, q * g));
  // P Q^T written over the gradients; error feedback: residual = M - P Q_local^T (M read from the
  // residual, the product's factors read again, the residual written).
  const int64_t residual = ef ? 2 * n * 4 + p * g + q * g : 0;
  ops.push_back(codec_op(OpId::kDpDecompress, p * g + q * g + n * g + residual, n, ef ? 2 : 1));
  return ops;
}

}  // namespace

namespace {

std::vector<Op> sparcml_ops(const spec::GradientCompression& c, const GradientBucket& bucket,
                            int64_t dp, int64_t g) {
  const int64_t n = bucket.params, k = topk_count(c.ratio, n);
  std::vector<Op> ops = {compression_encode_op(c, n, g)};
  if (c.sparse_algorithm == spec::SparseAlgorithm::kSplitAllGather) {
    const SparseSplit split = sparse_split_allgather(n, k, dp);
    ops.push_back(comm_op(OpId::kDpSparseSplit, CollectiveKind::kAllToAll, split.split_bytes));
    ops.push_back(codec_op(OpId::kDpSparseMerge, split.merge_bytes, n, 1));
    ops.push_back(comm_op(OpId::kDpSparseGather, CollectiveKind::kAllGather, split.gather_bytes));
    ops.push_back(compression_decode_op(c, n, dp, g));
    return ops;
  }
  for (const SparseRound& r : sparse_all_reduce_rounds(n, k, dp)) {
    ops.push_back(comm_op(OpId::kDpSparseExchange, CollectiveKind::kSendRecv, r.bytes));
    // Both unions read and the merged one written (pairs: 8 bytes each), or two dense vectors
    // read and their sum written.
    const int64_t merged = r.dense ? 3 * 4 * n : 8 * (2 * r.pairs + r.merged_pairs);
    ops.push_back(codec_op(OpId::kDpSparseMerge, merged, n, 1));
  }
  ops.push_back(compression_decode_op(c, n, dp, g));
  return ops;
}

}  // namespace

std::vector<Op> compressed_exchange_ops(const spec::GradientCompression& c,
                                        const GradientBucket& bucket, int64_t dp,
                                        int64_t grad_bytes) {
  if (c.kind == CompressionKind::kPowersgd) return powersgd_ops(c, bucket, grad_bytes);
  if (c.kind == CompressionKind::kSparcml) return sparcml_ops(c, bucket, dp, grad_bytes);
  return {compression_encode_op(c, bucket.params, grad_bytes),
          comm_op(OpId::kDpCompressedAllGather, CollectiveKind::kAllGather,
                  compressed_gather_bytes(c, bucket.params, dp)),
          compression_decode_op(c, bucket.params, dp, grad_bytes)};
}

int64_t compression_memory_bytes(const spec::GradientCompression& c, int64_t params,
                                 const std::vector<GradientBucket>& buckets, int64_t dp,
                                 int64_t grad_bytes) {
  if (!c.any()) return 0;
  const int64_t residual = c.error_feedback ? params * 4 : 0;
  if (c.kind == CompressionKind::kPowersgd) {
    int64_t q_kept = 0, largest = 0;
    for (const GradientBucket& b : buckets) {
      const PowerSgdSplit s = powersgd_split(c.rank, b);
      q_kept += s.q_elements;
      largest = std::max(largest, s.p_elements + s.q_elements);
    }
    return residual + (q_kept + largest) * grad_bytes;
  }
  int64_t largest_bucket = 0;
  for (const GradientBucket& b : buckets) largest_bucket = std::max(largest_bucket, b.params);
  // SparCML by split all-gather: the rank's k pairs and the k it receives, its range's
  // accumulator with touched marks, and the gathered sums (pairs only while a range's union is
  // at most half the range: never more than the dense vector's 4 bytes an element).
  if (c.kind == CompressionKind::kSparcml &&
      c.sparse_algorithm == spec::SparseAlgorithm::kSplitAllGather) {
    const int64_t k = topk_count(c.ratio, largest_bucket);
    return residual + 2 * 8 * k + 5 * (largest_bucket / dp + 1) + 4 * largest_bucket;
  }
  // SparCML: the rank's union, the partner's and the merged one, each up to a dense vector.
  if (c.kind == CompressionKind::kSparcml) return residual + 3 * largest_bucket * 4;
  return residual + (dp + 1) * encoded_words(c, largest_bucket) * 4;
}

}  // namespace sextant::models
