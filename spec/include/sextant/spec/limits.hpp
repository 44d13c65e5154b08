// Sizes past which Sextant refuses an input before doing any work: far past anything trained, small
// enough that counting, allocating and simulating them stays finite (a model of 10^12 layers never
// returned; a sequence of 2*10^9 tokens overflowed the simulator's picoseconds). The one place for
// the policy; readers and commands ask it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace sextant::spec {

struct TransformerSpec;

// Nesting of JSON arrays and objects (no Sextant file needs more than ~8; nlohmann's tree is
// destroyed recursively, so 10^5 nested '[' overflowed the stack).
inline constexpr int kMaxJsonDepth = 256;
// Tokens per sequence: 2^24, past any trained context.
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 24;
// Transformer layers: 2^14 (the deepest trained dense models have ~10^2).
inline constexpr int64_t kMaxLayers = int64_t{1} << 14;
// Hidden size, FFN width, heads: 2^20.
inline constexpr int64_t kMaxWidth = int64_t{1} << 20;
// Vocabulary rows: 2^24.
inline constexpr int64_t kMaxVocab = int64_t{1} << 24;
// Ranks of a plan (and each of dp, tp, pp): 2^24, past any cluster built; products of degrees
// then stay far inside int64.
inline constexpr int64_t kMaxRanks = int64_t{1} << 24;
// Gradient elements sharing one scale of a compressed exchange (plan "compression" bucket): 2^24,
// more than any gradient bucket holds (25 MB DDP buckets are ~6.5 M fp32 elements).
inline constexpr int64_t kMaxCompressionBucket = int64_t{1} << 24;
// Columns of PowerSGD's low-rank factors (plan "compression" rank): 32. Vogels et al. train with
// ranks 1 to 4; up to 32 the rank-r products stay memory-bound (2r FLOPs per 4-byte element read,
// under the fp32 ridge point of the GPUs and CPUs in spec/device_models), which is how the codec
// ops are priced (models/gradient_compression.hpp).
inline constexpr int64_t kMaxPowerSgdRank = 32;
// Sequences (samples) per optimizer step, and per micro-batch: 2^24 (published batches are ~10^4).
inline constexpr int64_t kMaxGlobalBatch = int64_t{1} << 24;
// Micro-batches per data-parallel replica per step: 2^16. The simulator schedules each one and the
// executor runs each one, so 10^9 sequences in micro-batches of 1 never returned.
inline constexpr int64_t kMaxMicroBatches = int64_t{1} << 16;
// A CNN's spatial extent (input rows, columns, slices; kernels, strides, paddings, adaptive pool
// outputs): 2^16. The largest published inputs are ~10^4 (whole-slide and satellite tiles, 2048^3
// volumes of Dryden et al.'s cosmology data); a 2^32-wide input overflowed the activation bytes.
inline constexpr int64_t kMaxCnnExtent = int64_t{1} << 16;
// Elements of one sample's feature map (channels x slices x rows x columns): 2^36 (256 GiB in
// fp32 per sample, far past any device).
inline constexpr double kMaxCnnMapElements = 0x1p36;
// A gzip-compressed input once decompressed: 4 GiB (the largest trace Sextant writes for a
// Llama-70B step on 64 GPUs was 1.7 GB before --trace-ranks existed).
inline constexpr int64_t kMaxDecompressedBytes = int64_t{4} << 30;
// Decompressed over compressed bytes of a gzip input: 100. Sextant's and PyTorch's traces
// compress 12-15x, a trace of one event repeated 36x; deflate reaches ~1032x, which a 4 MB "bomb"
// uses to take 12 GB of memory before the absolute limit above is reached.
inline constexpr int64_t kMaxGzipRatio = 100;
// Memory nlohmann/json takes to hold a parsed document, per byte of its text: 6.4 for the H100
// Kineto sample, 8.0 for a Sextant trace (measured with getrusage); JSON past 64 MiB is refused
// before parsing when this many times its size exceeds the memory available.
inline constexpr double kJsonMemoryPerByte = 8;
inline constexpr int64_t kJsonMemoryCheckBytes = int64_t{64} << 20;
// Times and durations read from traces: what int64 picoseconds hold (9.2e18 ps, about 106 days).
inline constexpr double kMaxSeconds = 9.2e6;

// A field of /proc/meminfo ("MemAvailable", "MemTotal") in bytes; 0 when unknown (no /proc).
int64_t meminfo_bytes(std::string_view field);
// MemAvailable of /proc/meminfo in bytes; 0 when unknown.
int64_t available_memory_bytes();

// What is wrong with `micro_batches` micro-batches per replica per step (past kMaxMicroBatches),
// or "" when nothing is. Plans and plan searches ask it.
std::string micro_batch_count_problem(int64_t micro_batches);

// The fields of `t` past these limits, as (field, value, what is expected); empty when none.
std::vector<std::tuple<std::string, int64_t, std::string>> transformer_limit_problems(
    const TransformerSpec& t);

}  // namespace sextant::spec
