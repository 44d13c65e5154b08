// Device buffers through MPI: each collective copies its device data to host memory, runs the MPI
// collective there and copies the result back. Slow, but it lets several ranks share one GPU
// (which NCCL refuses) and it is the transport of pipeline transfers under NCCL too (see
// nccl_communicator.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "sextant/exec/communicator.hpp"

namespace sextant::exec {

class StagedCommunicator : public Communicator {
 public:
  StagedCommunicator(MPI_Comm comm, std::string name) : mpi_(comm, std::move(name)) {}

  int rank() const override { return mpi_.rank(); }
  int size() const override { return mpi_.size(); }
  std::string name() const override { return mpi_.name(); }
  MpiCommunicator& mpi() { return mpi_; }

  void all_reduce(float* data, int64_t n) override;
  void all_reduce_max(float* data, int64_t n) override;
  void all_reduce(double* data, int64_t n) override { mpi_.all_reduce(data, n); }
  void all_reduce_host(float* data, int64_t n) override { mpi_.all_reduce(data, n); }
  void all_reduce_max_host(float* data, int64_t n) override { mpi_.all_reduce_max(data, n); }
  // Blocking, like the MPI communicator's (mpi_communicator.cpp says why).
  std::unique_ptr<CommRequest> all_reduce_async(float* data, int64_t n) override;
  std::unique_ptr<CommRequest> all_reduce_host_async(double* data, int64_t n) override {
    return mpi_.all_reduce_host_async(data, n);
  }
  void reduce_scatter(const float* in, float* out, int64_t n) override;
  void all_gather(const float* in, float* out, int64_t n) override;
  void all_to_all(const float* in, float* out, int64_t n) override;
  void all_to_all_v(const float* in, const std::vector<int64_t>& send, float* out,
                    const std::vector<int64_t>& recv) override;
  void all_gather_v(const float* in, float* out, const std::vector<int64_t>& counts) override;
  void reduce_scatter_v(const float* in, float* out, const std::vector<int64_t>& counts) override;
  void all_to_all_host(const int64_t* in, int64_t* out, int64_t n) override {
    mpi_.all_to_all_host(in, out, n);
  }
  void broadcast(float* data, int64_t n, int root) override;
  std::unique_ptr<CommRequest> send(const float* data, int64_t n, int peer, int tag) override;
  void recv(float* data, int64_t n, int peer, int tag) override;
  void all_reduce_bf16(uint16_t* data, int64_t n) override;
  void reduce_scatter_bf16(const uint16_t* in, uint16_t* out, int64_t n) override;
  void all_gather_bf16(const uint16_t* in, uint16_t* out, int64_t n) override;
  void all_to_all_bf16(const uint16_t* in, uint16_t* out, int64_t n) override;
  std::unique_ptr<CommRequest> send_bf16(const uint16_t* data, int64_t n, int peer,
                                         int tag) override;
  void recv_bf16(uint16_t* data, int64_t n, int peer, int tag) override;
  // Waits for this rank's device work, then for every rank: a common time zero.
  void barrier() override;
  std::vector<std::string> gather_strings(const std::string& mine, int root) override {
    return mpi_.gather_strings(mine, root);
  }

 private:
  MpiCommunicator mpi_;
  // Host copies: what a collective sends (in) and what it receives (out), per element type.
  std::vector<float> host_in_, host_out_;
  std::vector<uint16_t> host_in_bf16_, host_out_bf16_;
};

}  // namespace sextant::exec
