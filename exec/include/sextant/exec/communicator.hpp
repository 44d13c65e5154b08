// Collectives and point-to-point transfers within a group of ranks. The MPI implementation backs
// the CPU executor; NCCL (and MPI through host staging) back the CUDA executor. The float and bf16
// buffers of collectives and transfers are the backend's memory (device memory on CUDA); the
// *_host calls, the double all-reduce, the barrier and gather_strings work on host memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sextant::exec {

// A pending non-blocking operation.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // tp, dp, pp, world, embedding

  // In place, elementwise sum (or max) over the group.
  virtual void all_reduce(float* data, int64_t n) = 0;
  virtual void all_reduce_max(float* data, int64_t n) = 0;
  virtual void all_reduce(double* data, int64_t n) = 0;  // host memory
  virtual void all_reduce_host(float* data, int64_t n) = 0;
  virtual void all_reduce_max_host(float* data, int64_t n) = 0;
  virtual std::unique_ptr<CommRequest> all_reduce_async(float* data, int64_t n) = 0;
  // A truly non-blocking sum of host doubles (MPI_Iallreduce), for a result nobody needs soon:
  // under PipeDream-2BW the stages end a batch at different times, and a blocking sum of its loss
  // would hold every stage until the first one got there. `data` must live until wait().
  virtual std::unique_ptr<CommRequest> all_reduce_host_async(double* data, int64_t n) = 0;
  // in: size() * n elements; out: this rank's n-element block of the sum.
  virtual void reduce_scatter(const float* in, float* out, int64_t n) = 0;
  // in: n elements; out: size() * n, blocks in rank order.
  virtual void all_gather(const float* in, float* out, int64_t n) = 0;
  // in: size() blocks of n elements, block j for rank j; out: size() blocks, block j from rank j.
  virtual void all_to_all(const float* in, float* out, int64_t n) = 0;
  // The same with blocks of their own sizes: in holds send[j] elements for rank j after one
  // another, out receives recv[j] elements from rank j after one another (the counts every pair
  // agreed on, e.g. by all_to_all_host). A mixture of experts' token dispatch.
  virtual void all_to_all_v(const float* in, const std::vector<int64_t>& send, float* out,
                            const std::vector<int64_t>& recv) = 0;
  // Blocks of their own sizes, counts[j] elements for rank j (the counts every rank agreed on):
  // all_gather_v sends this rank's counts[rank()] and receives every rank's block in rank order;
  // reduce_scatter_v sums `in` (all blocks in rank order) over the ranks and keeps this rank's
  // block. A mixture of experts' routed rows over tp.
  virtual void all_gather_v(const float* in, float* out, const std::vector<int64_t>& counts) = 0;
  virtual void reduce_scatter_v(const float* in, float* out,
                                const std::vector<int64_t>& counts) = 0;
  // Whether all_gather_v, all_gather_v_in_place and reduce_scatter_v are the library's own
  // collectives (MPI_Allgatherv, MPI_Reduce_scatter), so that ZeRO's spans, which rarely divide by
  // the group, travel unpadded and uncopied. False where they are host-staged (device buffers
  // over MPI) or would be emulated (NCCL has neither): ZeRO pads its spans into buffers of its
  // own there.
  virtual bool uneven_collectives() const { return false; }
  // all_gather_v where `data` holds every block in rank order, this rank's already in place
  // (MPI_IN_PLACE). Only where uneven_collectives().
  virtual void all_gather_v_in_place(float* data, const std::vector<int64_t>& counts);
  // Host memory: in holds n values for each rank, out receives n from each.
  virtual void all_to_all_host(const int64_t* in, int64_t* out, int64_t n) = 0;
  virtual void broadcast(float* data, int64_t n, int root) = 0;
  virtual std::unique_ptr<CommRequest> send(const float* data, int64_t n, int peer, int tag) = 0;
  virtual void recv(float* data, int64_t n, int peer, int tag) = 0;
  // Activations in mixed precision: bf16 values as their bit patterns (tensor.hpp's to_bf16), 2
  // bytes an element on the wire, as Megatron-LM's tensor-parallel collectives and pipeline sends
  // move them. Sums are bf16 sums (each addition rounded to bf16: NCCL's ncclBfloat16; over MPI a
  // user-defined sum). The same shapes as the float calls above.
  virtual void all_reduce_bf16(uint16_t* data, int64_t n) = 0;
  virtual void reduce_scatter_bf16(const uint16_t* in, uint16_t* out, int64_t n) = 0;
  virtual void all_gather_bf16(const uint16_t* in, uint16_t* out, int64_t n) = 0;
  virtual void all_to_all_bf16(const uint16_t* in, uint16_t* out, int64_t n) = 0;
  virtual std::unique_ptr<CommRequest> send_bf16(const uint16_t* data, int64_t n, int peer,
                                                 int tag) = 0;
  virtual void recv_bf16(uint16_t* data, int64_t n, int peer, int tag) = 0;
  virtual void barrier() = 0;
  // Bytes gathered at root: each rank's blob, concatenated (root only).
  virtual std::vector<std::string> gather_strings(const std::string& mine, int root) = 0;
};

}  // namespace sextant::exec
