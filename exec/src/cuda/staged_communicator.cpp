// Host-staged MPI collectives over device buffers. cudaMemcpy on the legacy default stream waits
// for the kernels that produced the data, so no extra synchronisation is needed.
#include "staged_communicator.hpp"

#include <cuda_runtime.h>

#include <type_traits>

#include "cuda_check.hpp"

namespace sextant::exec {

namespace {

template <typename T>
void to_host(const T* device, T* host, int64_t n) {
  CUDA_CHECK(cudaMemcpy(host, device, static_cast<size_t>(n) * sizeof(T), cudaMemcpyDeviceToHost));
}
template <typename T>
void to_device(const T* host, T* device, int64_t n) {
  CUDA_CHECK(cudaMemcpy(device, host, static_cast<size_t>(n) * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T>
T* staged(std::vector<T>& host, const T* device, int64_t n) {
  host.resize(static_cast<size_t>(n));
  to_host(device, host.data(), n);
  return host.data();
}

class DoneRequest : public CommRequest {
 public:
  void wait() override {}
};

// Owns the host copy until MPI has sent it.
template <typename T>
class StagedSend : public CommRequest {
 public:
  explicit StagedSend(std::vector<T> host) : host_(std::move(host)) {}
  void start(MpiCommunicator& mpi, int64_t n, int peer, int tag) {
    if constexpr (std::is_same_v<T, float>) {
      inner_ = mpi.send(host_.data(), n, peer, tag);
    } else {
      inner_ = mpi.send_bf16(host_.data(), n, peer, tag);
    }
  }
  void wait() override { inner_->wait(); }

 private:
  std::vector<T> host_;  // declared first: destroyed after inner_ has waited
  std::unique_ptr<CommRequest> inner_;
};

template <typename T>
std::unique_ptr<CommRequest> staged_send(MpiCommunicator& mpi, const T* data, int64_t n, int peer,
                                         int tag) {
  std::vector<T> host(static_cast<size_t>(n));
  to_host(data, host.data(), n);
  auto request = std::make_unique<StagedSend<T>>(std::move(host));
  request->start(mpi, n, peer, tag);
  return request;
}

}  // namespace

void StagedCommunicator::all_reduce(float* data, int64_t n) {
  if (size() == 1) return;
  mpi_.all_reduce(staged(host_in_, data, n), n);
  to_device(host_in_.data(), data, n);
}

void StagedCommunicator::all_reduce_max(float* data, int64_t n) {
  if (size() == 1) return;
  mpi_.all_reduce_max(staged(host_in_, data, n), n);
  to_device(host_in_.data(), data, n);
}

std::unique_ptr<CommRequest> StagedCommunicator::all_reduce_async(float* data, int64_t n) {
  all_reduce(data, n);
  return std::make_unique<DoneRequest>();
}

void StagedCommunicator::reduce_scatter(const float* in, float* out, int64_t n) {
  host_out_.resize(static_cast<size_t>(n));
  mpi_.reduce_scatter(staged(host_in_, in, size() * n), host_out_.data(), n);
  to_device(host_out_.data(), out, n);
}

void StagedCommunicator::all_gather(const float* in, float* out, int64_t n) {
  host_out_.resize(static_cast<size_t>(size() * n));
  mpi_.all_gather(staged(host_in_, in, n), host_out_.data(), n);
  to_device(host_out_.data(), out, size() * n);
}

void StagedCommunicator::all_to_all(const float* in, float* out, int64_t n) {
  host_out_.resize(static_cast<size_t>(size() * n));
  mpi_.all_to_all(staged(host_in_, in, size() * n), host_out_.data(), n);
  to_device(host_out_.data(), out, size() * n);
}

void StagedCommunicator::all_to_all_v(const float* in, const std::vector<int64_t>& send, float* out,
                                      const std::vector<int64_t>& recv) {
  int64_t s = 0, r = 0;
  for (int64_t n : send) s += n;
  for (int64_t n : recv) r += n;
  host_out_.resize(static_cast<size_t>(r));
  mpi_.all_to_all_v(staged(host_in_, in, s), send, host_out_.data(), recv);
  to_device(host_out_.data(), out, r);
}

void StagedCommunicator::all_gather_v(const float* in, float* out,
                                      const std::vector<int64_t>& counts) {
  int64_t total = 0;
  for (int64_t n : counts) total += n;
  host_out_.resize(static_cast<size_t>(total));
  mpi_.all_gather_v(staged(host_in_, in, counts[static_cast<size_t>(rank())]), host_out_.data(),
                    counts);
  to_device(host_out_.data(), out, total);
}

void StagedCommunicator::reduce_scatter_v(const float* in, float* out,
                                          const std::vector<int64_t>& counts) {
  int64_t total = 0;
  for (int64_t n : counts) total += n;
  const int64_t mine = counts[static_cast<size_t>(rank())];
  host_out_.resize(static_cast<size_t>(mine));
  mpi_.reduce_scatter_v(staged(host_in_, in, total), host_out_.data(), counts);
  to_device(host_out_.data(), out, mine);
}

void StagedCommunicator::broadcast(float* data, int64_t n, int root) {
  if (size() == 1) return;
  mpi_.broadcast(staged(host_in_, data, n), n, root);
  to_device(host_in_.data(), data, n);
}

std::unique_ptr<CommRequest> StagedCommunicator::send(const float* data, int64_t n, int peer,
                                                      int tag) {
  return staged_send(mpi_, data, n, peer, tag);
}

void StagedCommunicator::recv(float* data, int64_t n, int peer, int tag) {
  host_out_.resize(static_cast<size_t>(n));
  mpi_.recv(host_out_.data(), n, peer, tag);
  to_device(host_out_.data(), data, n);
}

void StagedCommunicator::all_reduce_bf16(uint16_t* data, int64_t n) {
  if (size() == 1) return;
  mpi_.all_reduce_bf16(staged(host_in_bf16_, data, n), n);
  to_device(host_in_bf16_.data(), data, n);
}

void StagedCommunicator::reduce_scatter_bf16(const uint16_t* in, uint16_t* out, int64_t n) {
  host_out_bf16_.resize(static_cast<size_t>(n));
  mpi_.reduce_scatter_bf16(staged(host_in_bf16_, in, size() * n), host_out_bf16_.data(), n);
  to_device(host_out_bf16_.data(), out, n);
}

void StagedCommunicator::all_gather_bf16(const uint16_t* in, uint16_t* out, int64_t n) {
  host_out_bf16_.resize(static_cast<size_t>(size() * n));
  mpi_.all_gather_bf16(staged(host_in_bf16_, in, n), host_out_bf16_.data(), n);
  to_device(host_out_bf16_.data(), out, size() * n);
}

void StagedCommunicator::all_to_all_bf16(const uint16_t* in, uint16_t* out, int64_t n) {
  host_out_bf16_.resize(static_cast<size_t>(size() * n));
  mpi_.all_to_all_bf16(staged(host_in_bf16_, in, size() * n), host_out_bf16_.data(), n);
  to_device(host_out_bf16_.data(), out, size() * n);
}

std::unique_ptr<CommRequest> StagedCommunicator::send_bf16(const uint16_t* data, int64_t n,
                                                           int peer, int tag) {
  return staged_send(mpi_, data, n, peer, tag);
}

void StagedCommunicator::recv_bf16(uint16_t* data, int64_t n, int peer, int tag) {
  host_out_bf16_.resize(static_cast<size_t>(n));
  mpi_.recv_bf16(host_out_bf16_.data(), n, peer, tag);
  to_device(host_out_bf16_.data(), data, n);
}

void StagedCommunicator::barrier() {
  CUDA_CHECK(cudaDeviceSynchronize());
  mpi_.barrier();
}

}  // namespace sextant::exec
