// NCCL collectives over device buffers, one GPU per rank, bootstrapped over MPI (rank 0 creates
// the unique id and broadcasts it). Blocking collectives run on the compute stream (the legacy
// default stream), so they are ordered with the kernels around them without the host waiting.
// The asynchronous all-reduce of gradient buckets runs on a stream of its own, after an event on
// the compute stream, and wait() makes the compute stream wait for it: the bucket's reduction
// overlaps the rest of the backward pass, as in PyTorch DDP.
//
// Pipeline transfers stay on host-staged MPI (the base class). ncclSend/ncclRecv block the GPU
// until the peer posts the matching call, and the 1F1B schedule posts a send to the next stage
// before a receive from it on one rank while its neighbour does the converse: on one NCCL stream
// that deadlocks unless the pair is fused in ncclGroupStart/End, which needs the schedule to pair
// its transfers (Megatron's batch_isend_irecv). Until the trainer does that, MPI carries them.
#include <cuda_runtime.h>
#include <nccl.h>

#include "cuda_check.hpp"
#include "cuda_module.hpp"
#include "staged_communicator.hpp"

namespace sextant::exec {

namespace {

class NcclRequest : public CommRequest {
 public:
  explicit NcclRequest(cudaEvent_t done) : done_(done) {}
  ~NcclRequest() override {
    if (done_ != nullptr) {
      cudaStreamWaitEvent(nullptr, done_, 0);
      cudaEventDestroy(done_);
    }
  }
  // The compute stream waits (the host does not).
  void wait() override {
    CUDA_CHECK(cudaStreamWaitEvent(nullptr, done_, 0));
    CUDA_CHECK(cudaEventDestroy(done_));
    done_ = nullptr;
  }

 private:
  cudaEvent_t done_;
};

class NcclCommunicator : public StagedCommunicator {
 public:
  NcclCommunicator(MPI_Comm comm, std::string name) : StagedCommunicator(comm, std::move(name)) {
    ncclUniqueId id{};
    if (rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi().comm()));
    NCCL_CHECK(ncclCommInitRank(&comm_, size(), id, rank()));
    CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  }
  ~NcclCommunicator() override {
    cudaStreamSynchronize(side_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(side_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  void all_reduce(float* data, int64_t n) override { all_reduce_of(data, n, ncclFloat, ncclSum); }
  void all_reduce_max(float* data, int64_t n) override {
    all_reduce_of(data, n, ncclFloat, ncclMax);
  }
  std::unique_ptr<CommRequest> all_reduce_async(float* data, int64_t n) override {
    cudaEvent_t ready = nullptr, done = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(ready, nullptr));
    CUDA_CHECK(cudaStreamWaitEvent(side_, ready, 0));
    if (size() > 1)
      NCCL_CHECK(
          ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum, comm_, side_));
    CUDA_CHECK(cudaEventRecord(done, side_));
    CUDA_CHECK(cudaEventDestroy(ready));
    return std::make_unique<NcclRequest>(done);
  }
  void reduce_scatter(const float* in, float* out, int64_t n) override {
    reduce_scatter_of(in, out, n, ncclFloat);
  }
  void all_gather(const float* in, float* out, int64_t n) override {
    all_gather_of(in, out, n, ncclFloat);
  }
  void all_to_all(const float* in, float* out, int64_t n) override {
    all_to_all_of(in, out, n, ncclFloat);
  }
  void all_reduce_bf16(uint16_t* data, int64_t n) override {
    all_reduce_of(data, n, ncclBfloat16, ncclSum);
  }
  void reduce_scatter_bf16(const uint16_t* in, uint16_t* out, int64_t n) override {
    reduce_scatter_of(in, out, n, ncclBfloat16);
  }
  void all_gather_bf16(const uint16_t* in, uint16_t* out, int64_t n) override {
    all_gather_of(in, out, n, ncclBfloat16);
  }
  void all_to_all_bf16(const uint16_t* in, uint16_t* out, int64_t n) override {
    all_to_all_of(in, out, n, ncclBfloat16);
  }
  void broadcast(float* data, int64_t n, int root) override {
    if (size() == 1) return;
    NCCL_CHECK(ncclBroadcast(data, data, static_cast<size_t>(n), ncclFloat, root, comm_, nullptr));
  }

 private:
  // The float and bf16 calls differ only in the element type and NCCL's name for it; all on the
  // compute stream.
  void all_reduce_of(void* data, int64_t n, ncclDataType_t type, ncclRedOp_t op) {
    if (size() == 1) return;
    NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(n), type, op, comm_, nullptr));
  }
  void reduce_scatter_of(const void* in, void* out, int64_t n, ncclDataType_t type) {
    NCCL_CHECK(ncclReduceScatter(in, out, static_cast<size_t>(n), type, ncclSum, comm_, nullptr));
  }
  void all_gather_of(const void* in, void* out, int64_t n, ncclDataType_t type) {
    NCCL_CHECK(ncclAllGather(in, out, static_cast<size_t>(n), type, comm_, nullptr));
  }
  // NCCL has no all-to-all: a group of sends and receives, one pair per peer (the pattern of
  // NCCL's documentation, "Point-to-point communication: all-to-all").
  template <typename T>
  void all_to_all_of(const T* in, T* out, int64_t n, ncclDataType_t type) {
    NCCL_CHECK(ncclGroupStart());
    for (int peer = 0; peer < size(); ++peer) {
      const size_t at = static_cast<size_t>(peer) * static_cast<size_t>(n);
      NCCL_CHECK(ncclSend(in + at, static_cast<size_t>(n), type, peer, comm_, nullptr));
      NCCL_CHECK(ncclRecv(out + at, static_cast<size_t>(n), type, peer, comm_, nullptr));
    }
    NCCL_CHECK(ncclGroupEnd());
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t side_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> cuda_module::make_communicator(CommKind kind, MPI_Comm comm,
                                                             std::string name) {
  if (kind == CommKind::kNccl) return std::make_unique<NcclCommunicator>(comm, std::move(name));
  return std::make_unique<StagedCommunicator>(comm, std::move(name));
}

}  // namespace sextant::exec
