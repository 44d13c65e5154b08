// Trace: timed ops and collectives of every rank, written as Chrome Trace Event JSON (opens in
// Perfetto): one pid per rank, one tid per stream. The simulator (predicted) and the executor
// (measured) write the same schema with the same op names, so traces compare op by op.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sextant/spec/collective.hpp"
#include "sextant/spec/dtype.hpp"
#include "sextant/spec/json_reader.hpp"
#include "sextant/spec/units.hpp"

namespace sextant::spec {

// A plan that offloads copies over PCIe in both directions at once: the device's copy engines
// serve device-to-host and host-to-device copies apart, and PCIe is full duplex (NVIDIA, CUDA C++
// Programming Guide, "Asynchronous Concurrent Execution": asyncEngineCount 2 overlaps a copy each
// way), so the stacks keep a stream per direction (Transformer Engine's cpu_offload.py:
// d2h_stream and h2d_stream). kOffload: copies to host memory or NVMe, and the optimizer step on
// the host CPU after them, in order. kOffloadIn: copies to the device, in order.
// models::offload_stream says which an op runs on. kDepthComm: the collectives over the z axis of a
// 3D tensor grid (spec/tensor_grid.hpp), in order: AxoNN's depth group is a communicator of its
// own, so its weight gathers and gradient reduce-scatters queue on one NCCL stream of their own,
// beside the x and y groups' all-reduces (axonn/intra_layer/communication.py).
enum class Stream {
  kCompute,
  kTpComm,
  kDpComm,
  kPpSend,
  kPpRecv,
  kOffload,
  kOffloadIn,
  kDepthComm,
  // GEMS' second replica's stage transfers (spec::chunk_runs_up), in their own order beside the
  // first replica's: one send and one receive stream per direction of travel.
  kPpSendUp,
  kPpRecvUp
};
EnumNames<Stream> stream_names();
inline constexpr int kStreamCount = 10;

enum class OpClass {
  kGemm,
  kAttention,
  kElementwise,
  kNorm,
  kEmbedding,
  kLoss,
  kOptimizer,
  kConv,
  kPool,
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kAllToAll,
  kSend,
  kRecv,
  kBarrier,
  kHost,    // host work outside any op: per-step set-up, data, dispatch
  kMemcpy,  // a copy between device and host memory (offload)
};
EnumNames<OpClass> op_class_names();
bool is_communication(OpClass op_class);
// The collective an op class stands for (a send as send_recv); nullopt otherwise (a recv too).
std::optional<CollectiveKind> collective_of(OpClass op_class);

// The kernel family a memory-bound op runs where it sustains a bandwidth of its own (a cluster
// file's device.memory_efficiency_by_kernel; bench/eager_kernel_rates.py measures them):
// kGeneric: the op class's efficiency. kNativeNorm: ATen's layer_norm / rms_norm kernels, which
// eager PyTorch runs (aten/src/ATen/native/cuda/layer_norm_kernel.cu). kMixedDtype: an eager
// elementwise kernel whose inputs differ in dtype from its output (a bf16 -> fp32 copy, an fp32 +
// bf16 add): TensorIterator's dynamic-casting path, unrolled with no vector loads
// (aten/src/ATen/native/cuda/CUDALoops.cuh, LoadWithCast); fp32 -> bf16 copies have a vectorized
// kernel of their own (Copy.cu, bfloat16_copy_kernel_cuda) and are generic. kStrided: eager
// copies of non-contiguous tensors (a broadcast key/value expanded to every query head, a
// transposed head layout) and reductions over an axis (a bias gradient, repeat_kv's backward):
// TensorIterator's legacy elementwise_kernel and its reduce_kernel, no vector loads.
// kEmbeddingBackward: ATen's embedding_dense_backward segment sums (EmbeddingBackwardKernel.cu
// compute_grad_weight, sum_and_scatter): one thread per feature of a token row gathered through the
// sorted order. kCastTranspose: Transformer Engine's fp8 cast-transpose and transpose kernels
// (transformer_engine/common/transpose/cast_transpose.cu: a 128-thread block per tile of at most
// 8-byte vectors, the transpose staged through shared memory), which the fp8 recipe runs on each
// linear's input and output gradient.
enum class MemoryKernel {
  kGeneric,
  kNativeNorm,
  kMixedDtype,
  kStrided,
  kEmbeddingBackward,
  kCastTranspose
};
EnumNames<MemoryKernel> memory_kernel_names();

enum class Phase { kFwd, kBwd, kRecompute, kOpt, kNone };
EnumNames<Phase> phase_names();

struct TraceEvent {
  std::string name;  // op name, e.g. "attn.qkv", "all_reduce"
  OpClass op_class = OpClass::kGemm;
  int64_t rank = 0;
  Stream stream = Stream::kCompute;
  Picoseconds start_ps = 0;
  Picoseconds duration_ps = 0;
  Phase phase = Phase::kNone;
  std::optional<int64_t> layer;
  std::optional<int64_t> micro_batch;
  int64_t step = 0;
  double flops = 0;            // FLOPs of the op on this rank
  int64_t bytes = 0;           // bytes moved (memory traffic for compute, message size for comm)
  std::vector<int64_t> shape;  // GEMM: m, n, k; others: tensor shape
  std::optional<Dtype> dtype;
  int64_t group_size = 0;  // collectives
  std::string algorithm;   // collectives
};

struct Trace {
  std::string kind;                // "predicted" or "measured"
  Json metadata = Json::object();  // model, cluster, plan, commit, ...
  std::vector<TraceEvent> events;
};

inline constexpr std::string_view kTraceSchema = "sextant.trace/1";

// Chrome Trace Event JSON text (object form with "traceEvents"), with process/thread names.
// Events are written in the order given; ts and dur in microseconds with picosecond resolution.
std::string trace_to_chrome_json(const Trace& trace);
void write_trace_file(const std::string& path, const Trace& trace);
// Reads a trace written by Sextant (ours, not arbitrary Chrome traces); throws InputError.
Trace trace_from_json(const Json& json, const std::string& source);
Trace read_trace_file(const std::string& path);

}  // namespace sextant::spec
