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

#include "sextant/models/lowering.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::models {

// Elements top-k sends out of `elements`: ceil(ratio * elements), at least one.
int64_t topk_count(double ratio, int64_t elements);
// QSGD's levels for `bits` bits per element (one of them the sign): s = 2^(bits-1) - 1.
int64_t qsgd_levels(int64_t bits);

// One rank's encoded bucket of `elements` gradients, in 32-bit words:
//   qsgd:   ceil(elements * bits / 32) code words, then ceil(elements / bucket) fp32 norms;
//   onebit: ceil(elements / 32) sign words, then ceil(elements / bucket) fp32 scales;
//   topk:   k int32 indices, then k fp32 values (k = topk_count).
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

// Op names, shared by both traces.
inline constexpr const char* kCompressOp = "dp.compress";
inline constexpr const char* kCompressedGatherOp = "dp.compressed_all_gather";
inline constexpr const char* kDecompressOp = "dp.decompress";

// Device memory a rank keeps for compression of `params` gradients in buckets of at most
// `largest_bucket` elements: the fp32 error-feedback residual of every gradient, and the encoded
// bucket with the gathered ones of the largest bucket.
int64_t compression_memory_bytes(const spec::GradientCompression& c, int64_t params,
                                 int64_t largest_bucket, int64_t dp);

}  // namespace sextant::models
