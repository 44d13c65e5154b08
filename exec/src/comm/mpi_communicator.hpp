// Communicators over MPI: the world, and sub-groups split from it.
#pragma once

#include <mpi.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "p2p_collectives.hpp"
#include "sextant/exec/communicator.hpp"
#include "sextant/spec/collective_kinds.hpp"

namespace sextant::exec {

// Calls MPI and turns a failure into an exception naming the call, the MPI message and the rank.
#define MPI_CHECK(call) ::sextant::exec::mpi_check((call), #call, __FILE__, __LINE__)
void mpi_check(int code, const char* call, const char* file, int line);

class MpiCommunicator : public Communicator {
 public:
  // Takes ownership of `comm` unless it is MPI_COMM_WORLD or MPI_COMM_SELF. The collectives
  // `algorithms` names run by that algorithm from point-to-point messages (p2p_collectives.hpp),
  // on a duplicate of `comm` so that their messages meet no other; the rest by MPI's choice.
  MpiCommunicator(MPI_Comm comm, std::string name, spec::CollectiveAlgorithms algorithms = {});
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  // The group of world ranks with the same `color`, ordered by `key`.
  static std::unique_ptr<MpiCommunicator> split(MPI_Comm parent, int color, int key,
                                                std::string name);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  MPI_Comm comm() const { return comm_; }

  void all_reduce(float* data, int64_t n) override;
  void all_reduce_max(float* data, int64_t n) override;
  void all_reduce(double* data, int64_t n) override;
  void all_reduce_host(float* data, int64_t n) override { all_reduce(data, n); }
  void all_reduce_max_host(float* data, int64_t n) override { all_reduce_max(data, n); }
  std::unique_ptr<CommRequest> all_reduce_async(float* data, int64_t n) override;
  std::unique_ptr<CommRequest> all_reduce_host_async(double* data, int64_t n) override;
  void reduce_scatter(const float* in, float* out, int64_t n) override;
  void all_gather(const float* in, float* out, int64_t n) override;
  void all_to_all(const float* in, float* out, int64_t n) override;
  void all_to_all_v(const float* in, const std::vector<int64_t>& send, float* out,
                    const std::vector<int64_t>& recv) override;
  void all_gather_v(const float* in, float* out, const std::vector<int64_t>& counts) override;
  void reduce_scatter_v(const float* in, float* out, const std::vector<int64_t>& counts) override;
  bool uneven_collectives() const override { return true; }
  void all_gather_v_in_place(float* data, const std::vector<int64_t>& counts) override;
  void all_to_all_host(const int64_t* in, int64_t* out, int64_t n) override;
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
  void barrier() override;
  std::vector<std::string> gather_strings(const std::string& mine, int root) override;

 private:
  // The algorithm a plan named for `kind` (none: MPI's own).
  std::optional<spec::CollectiveAlgorithm> chosen(spec::CollectiveKind kind) const;
  p2p::Group p2p_group() const { return {p2p_comm_, rank_, size_}; }
  // Reduce-scatter and all-gather by the named algorithm, out of place (`in` whole or a block).
  void p2p_reduce_scatter(spec::CollectiveAlgorithm a, const void* in, void* out,
                          const std::vector<int64_t>& counts, const p2p::Elements& e);
  void p2p_all_gather(spec::CollectiveAlgorithm a, const void* in, void* out,
                      const std::vector<int64_t>& counts, const p2p::Elements& e);

  MPI_Comm comm_;
  spec::CollectiveAlgorithms algorithms_;
  MPI_Comm p2p_comm_ = MPI_COMM_NULL;  // comm_'s duplicate when algorithms_ names any
  std::vector<std::byte> scratch_;
  MPI_Op bf16_sum_ = MPI_OP_NULL;  // MPI has no bf16: a sum over MPI_UINT16_T bit patterns
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace sextant::exec
