// A compressed data-parallel gradient exchange, one bucket at a time: each rank encodes its
// bucket's gradients (plus, with error feedback, what earlier encodings left out), the encoded
// buckets are all-gathered over the data-parallel group, and every rank decodes all of them and
// sums them in rank order, so the replicas stay identical. The wire format (32-bit words) and the
// codec's work, priced by the simulator and the planner, run by the executor and named in both
// traces: one home.
//
// Why an all-gather: quantized and sparse gradients cannot be summed inside a ring all-reduce
// without decoding at every hop (GRACE, Xu et al., ICDCS'21, exchanges them with an all-gather;
// so does the QSGD paper's MPI implementation). Its bytes grow with dp -- each rank receives
// (dp - 1) encoded buckets against a ring all-reduce's 2 (dp - 1) / dp uncompressed ones -- which
// is the trade-off a simulator should show: compression pays at small dp and slow links.
#pragma once

#include <cstdint>
#include <vector>

#include "sextant/models/lowering.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::models {

// Elements top-k sends out of `elements`: ceil(ratio * elements), at least one.
int64_t topk_count(double ratio, int64_t elements);
// QSGD's levels for `bits` bits per element (one of them the sign): s = 2^(bits-1) - 1.
int64_t qsgd_levels(int64_t bits);

// SparCML's sparse all-reduce of `k` (index, value) pairs per rank out of `elements` over `dp`
// ranks (a power of two; Renggli et al., SC'19): round r (0 <= r < log2 dp) sends the rank's
// pairs -- the union of 2^r ranks' selections, summed -- to the rank whose index differs in bit r
// and merges the pairs it receives. Once a union would weigh more as pairs (8 bytes each) than as
// a dense vector (4 bytes an element: more than elements / 2 pairs), it is sent and merged dense
// (DSAR's switch). The union of j ranks' selections is priced at its expectation for selections
// drawn independently and uniformly: elements * (1 - (1 - k / elements)^j). Gradients of one
// model correlate across replicas, so real unions are smaller; the executor traces the bytes it
// sent, and bench/results/sparcml.md sets them against this.
struct SparseRound {
  int64_t pairs = 0;         // the expected pairs each rank sends (its union of 2^r selections)
  bool dense = false;        // sent as a dense vector of `elements` values instead
  int64_t bytes = 0;         // sent by each rank: 8 * pairs, or 4 * elements when dense
  int64_t merged_pairs = 0;  // the expected union after the merge (2^(r+1) selections)
};
double expected_union(int64_t elements, int64_t k, int64_t selections);
std::vector<SparseRound> sparse_all_reduce_rounds(int64_t elements, int64_t k, int64_t dp);
// Whether a union of `pairs` pairs out of `elements` goes dense (DSAR's switch).
bool sparse_goes_dense(int64_t pairs, int64_t elements);

// SparCML's split all-gather (SSAR/DSAR_Split_allgather, Renggli et al., SC'19 §5.3) of `k` pairs
// per rank out of `elements` over `dp` ranks. The index space is split into dp ranges, range r
// [sparse_range_begin(r), sparse_range_begin(r + 1)) owned by rank r. Each rank sends its pairs
// in range r to rank r (an all-to-all of its k pairs: (dp - 1) / dp of them leave), each owner
// sums its range in rank order, and the ranges' sums are all-gathered: as pairs, or dense (4
// bytes an element of the range) once its union outweighs it. Priced at the expectation for
// independent uniform selections, as the rounds above: a range receives k / dp pairs from each
// rank and holds expected_union(elements, k, dp) / dp of them summed.
int64_t sparse_range_begin(int64_t elements, int64_t dp, int64_t range);
struct SparseSplit {
  int64_t split_bytes = 0;   // a rank's all-to-all buffer: its k pairs, 8 bytes each
  int64_t range_pairs = 0;   // the expected union of one range
  bool dense = false;        // the ranges' sums gathered dense
  int64_t gather_bytes = 0;  // the all-gather's output, every range's sum: pairs or dense
  int64_t merge_bytes = 0;   // the owner's sum: sparse_range_merge_bytes of a range
};
SparseSplit sparse_split_allgather(int64_t elements, int64_t k, int64_t dp);
// The owner's sum of a range of `range_elements` from `received` pairs into a `union_pairs`
// union: the pairs read (8 bytes each), an fp32 accumulator and a touched mark per element
// zeroed and scanned, and the union written as pairs (none when dense: the accumulator is it).
int64_t sparse_range_merge_bytes(int64_t range_elements, int64_t received, int64_t union_pairs,
                                 bool dense);
// The decode of a final union of `pairs` pairs (or a dense sum): the gradients zeroed, then each
// pair read (8 bytes) and its gradient read and written -- or the dense sum copied.
int64_t sparse_decode_bytes(int64_t elements, int64_t pairs, bool dense, int64_t grad_bytes);

// One rank's encoded bucket of `elements` gradients, in 32-bit words:
//   qsgd:   ceil(elements * bits / 32) code words, then ceil(elements / bucket) fp32 norms;
//   onebit: ceil(elements / 32) sign words, then ceil(elements / bucket) fp32 scales;
//   topk, sparcml: k int32 indices, then k fp32 values (k = topk_count);
//   powersgd: not a per-rank encoding (compressed_exchange_ops): `elements`.
int64_t encoded_words(const spec::GradientCompression& c, int64_t elements);

// The codec's work on one bucket, as ops the compute model prices (memory-bound elementwise
// kernels). `grad_bytes`: bytes of a gradient element.
//   encode: a pass for the scales (qsgd's norms, onebit's mean magnitudes; top-k's threshold,
//     found on a sample as Deep Gradient Compression does, Lin et al., ICLR'18) and a pass that
//     writes the codes: 2 reads of the gradients plus the encoded words; error feedback adds a
//     read and a write of the fp32 residual.
//   decode: the dp encoded buckets read and the summed gradients written once (qsgd, onebit),
//     or the gradients zeroed and the dp * k pairs added at their indices (topk).
Op compression_encode_op(const spec::GradientCompression& c, int64_t elements, int64_t grad_bytes);
Op compression_decode_op(const spec::GradientCompression& c, int64_t elements, int64_t dp,
                         int64_t grad_bytes);
// The all-gather's bytes as traces count a gather: all dp encoded buckets.
int64_t compressed_gather_bytes(const spec::GradientCompression& c, int64_t elements, int64_t dp);

// PowerSGD (Vogels et al., NeurIPS'19, Algorithm 1 with error feedback; PyTorch's
// powerSGD_hook), of a bucket's weight matrices M (rows x cols, GradientBucket::matrices):
//   P = M Q (Q: cols x rank, the last step's, warm start), P all-reduced, P orthonormalised
//   (Gram-Schmidt), Q = M^T P, Q all-reduced, and the bucket's M replaced by P Q^T: the
//   projection of the summed gradients onto P's columns. Linear, so the factors are all-reduced
//   and their bytes do not grow with dp. With error feedback each rank keeps M - P (M^T P), what
//   its own gradients lost. A matrix is compressed only when the factors are less than half its
//   size (PyTorch's min_compression_rate 2); the rest of the bucket -- vectors and such matrices --
//   is all-reduced as it is.
bool powersgd_compresses(int64_t rank, const WeightMatrix& m);
struct PowerSgdSplit {
  int64_t matrices = 0;      // compressed
  int64_t compressed = 0;    // their elements
  int64_t uncompressed = 0;  // the bucket's other elements
  int64_t p_elements = 0;    // sum of rank * rows over the compressed matrices
  int64_t q_elements = 0;    // sum of rank * cols
  bool operator==(const PowerSgdSplit&) const = default;
};
PowerSgdSplit powersgd_split(int64_t rank, const GradientBucket& bucket);

// The exchange of one compressed bucket as ops, in the order they run on the data-parallel
// stream: for QSGD, top-k and 1-bit the encode op, the all-gather (compressed_gather_bytes) and
// the decode op; for SparCML the encode op, each round's dp.sparse_exchange (a send/recv of the
// round's bytes) and dp.sparse_merge (reading both unions and writing the merged one, or the
// dense sum), and the decode op (the gradients zeroed and the final union added, or copied
// dense) -- by split all-gather the encode op, dp.sparse_split (the all-to-all), dp.sparse_merge
// (the owner's range), dp.sparse_gather (the all-gather) and the decode op; for PowerSGD the
// uncompressed part's all-reduce (when it has one), then
//   dp.compress                error feedback folded into M, P = M Q;
//   dp.powersgd_p_all_reduce   every compressed matrix's P (rank * rows each);
//   dp.powersgd_project        P orthonormalised (modified Gram-Schmidt: 2 + 3 (rank - 1) / 2
//                              passes over P), Q = M^T P;
//   dp.powersgd_q_all_reduce   every Q (rank * cols each);
//   dp.decompress              M = P Q^T written to the gradients and, with error feedback, the
//                              residual M - P Q_local^T.
// The factors have the gradients' element size (PyTorch's hook allocates them so). The codec ops
// are memory-bound (a rank-r product does 2r FLOPs per element read; spec/limits.hpp
// kMaxPowerSgdRank) and priced by their bytes. `grad_bytes`: bytes of a gradient element.
std::vector<Op> compressed_exchange_ops(const spec::GradientCompression& c,
                                        const GradientBucket& bucket, int64_t dp,
                                        int64_t grad_bytes);

// Device memory a rank keeps for compression of `params` gradients in `buckets`: the fp32
// error-feedback residual of every gradient, and the encoded bucket with the gathered ones of the
// largest bucket (PowerSGD: every compressed matrix's Q, kept for the warm start, and the largest
// bucket's P and local Q).
int64_t compression_memory_bytes(const spec::GradientCompression& c, int64_t params,
                                 const std::vector<GradientBucket>& buckets, int64_t dp,
                                 int64_t grad_bytes);

}  // namespace sextant::models
