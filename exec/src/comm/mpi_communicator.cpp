// MPI collectives. Counts above 2^31 are refused (MPI's int counts); the executor's messages are
// far below that.
#include "mpi_communicator.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "sextant/exec/tensor.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {

void mpi_check(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, message, &length);
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  throw std::runtime_error(fmt::format("{} failed at {}:{} on rank {} ({}): {}", call, file, line,
                                       rank, host,
                                       std::string(message, static_cast<size_t>(length))));
}

namespace {

int count(int64_t n) {
  SEXTANT_CHECK(n >= 0 && n <= INT_MAX, "message of {} elements is too large for MPI", n);
  return static_cast<int>(n);
}

// MPI_User_function: inout[i] = bf16(in[i] + inout[i]), the addition in fp32 and rounded once,
// as a bf16 add unit (and NCCL's bf16 sum) computes it.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = to_bf16(from_bf16(a[i]) + from_bf16(b[i]));
}

class MpiRequest : public CommRequest {
 public:
  explicit MpiRequest(MPI_Request r) : request_(r) {}
  ~MpiRequest() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  void wait() override { MPI_CHECK(MPI_Wait(&request_, MPI_STATUS_IGNORE)); }

 private:
  MPI_Request request_;
};

// The float, bf16 (and int64) calls differ only in the element type, its MPI datatype and the
// sum.
void all_reduce_of(MPI_Comm comm, int size, void* data, int64_t n, MPI_Datatype type, MPI_Op op) {
  if (size == 1) return;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count(n), type, op, comm));
}

template <typename T>
void reduce_scatter_of(MPI_Comm comm, int size, const T* in, T* out, int64_t n, MPI_Datatype type,
                       MPI_Op sum) {
  if (size == 1) {
    std::copy(in, in + n, out);
    return;
  }
  MPI_CHECK(MPI_Reduce_scatter_block(in, out, count(n), type, sum, comm));
}

template <typename T>
void all_gather_of(MPI_Comm comm, int size, const T* in, T* out, int64_t n, MPI_Datatype type) {
  if (size == 1) {
    std::copy(in, in + n, out);
    return;
  }
  MPI_CHECK(MPI_Allgather(in, count(n), type, out, count(n), type, comm));
}

template <typename T>
void all_to_all_of(MPI_Comm comm, int size, const T* in, T* out, int64_t n, MPI_Datatype type) {
  if (size == 1) {
    std::copy(in, in + n, out);
    return;
  }
  MPI_CHECK(MPI_Alltoall(in, count(n), type, out, count(n), type, comm));
}

std::unique_ptr<CommRequest> send_of(MPI_Comm comm, const void* data, int64_t n, MPI_Datatype type,
                                     int peer, int tag) {
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Isend(data, count(n), type, peer, tag, comm, &r));
  return std::make_unique<MpiRequest>(r);
}

void recv_of(MPI_Comm comm, void* data, int64_t n, MPI_Datatype type, int peer, int tag) {
  MPI_CHECK(MPI_Recv(data, count(n), type, peer, tag, comm, MPI_STATUS_IGNORE));
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name,
                                 spec::CollectiveAlgorithms algorithms)
    : comm_(comm), algorithms_(std::move(algorithms)), name_(std::move(name)) {
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  MPI_CHECK(MPI_Op_create(&bf16_sum, 1, &bf16_sum_));
  if (!algorithms_.empty()) MPI_CHECK(MPI_Comm_dup(comm_, &p2p_comm_));
}

std::optional<spec::CollectiveAlgorithm> MpiCommunicator::chosen(spec::CollectiveKind kind) const {
  const auto it = algorithms_.find(kind);
  if (it == algorithms_.end()) return std::nullopt;
  return it->second;
}

void MpiCommunicator::p2p_reduce_scatter(spec::CollectiveAlgorithm a, const void* in, void* out,
                                         const std::vector<int64_t>& counts,
                                         const p2p::Elements& e) {
  int64_t total = 0, mine = 0;
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) mine = total;
    total += counts[static_cast<size_t>(j)];
  }
  // The algorithms reduce in place: the whole input, then this rank's block out.
  scratch_.resize(static_cast<size_t>(total) * e.bytes);
  std::memcpy(scratch_.data(), in, scratch_.size());
  p2p::reduce_scatter(p2p_group(), a, scratch_.data(), counts, e);
  std::memcpy(out, scratch_.data() + mine * static_cast<int64_t>(e.bytes),
              static_cast<size_t>(counts[static_cast<size_t>(rank_)]) * e.bytes);
}

void MpiCommunicator::p2p_all_gather(spec::CollectiveAlgorithm a, const void* in, void* out,
                                     const std::vector<int64_t>& counts, const p2p::Elements& e) {
  int64_t mine = 0;
  for (int j = 0; j < rank_; ++j) mine += counts[static_cast<size_t>(j)];
  auto* blocks = static_cast<std::byte*>(out);
  std::memmove(blocks + mine * static_cast<int64_t>(e.bytes), in,
               static_cast<size_t>(counts[static_cast<size_t>(rank_)]) * e.bytes);
  p2p::all_gather(p2p_group(), a, blocks, counts, e);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (bf16_sum_ != MPI_OP_NULL) MPI_Op_free(&bf16_sum_);
  if (p2p_comm_ != MPI_COMM_NULL) MPI_Comm_free(&p2p_comm_);
  if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF) MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(MPI_Comm parent, int color, int key,
                                                        std::string name) {
  MPI_Comm comm;
  MPI_CHECK(MPI_Comm_split(parent, color, key, &comm));
  return std::make_unique<MpiCommunicator>(comm, std::move(name));
}

void MpiCommunicator::all_reduce(float* data, int64_t n) {
  if (auto a = chosen(spec::CollectiveKind::kAllReduce))
    return p2p::all_reduce(p2p_group(), *a, reinterpret_cast<std::byte*>(data), n,
                           p2p::float_sum());
  all_reduce_of(comm_, size_, data, n, MPI_FLOAT, MPI_SUM);
}

void MpiCommunicator::all_reduce_max(float* data, int64_t n) {
  if (auto a = chosen(spec::CollectiveKind::kAllReduce))
    return p2p::all_reduce(p2p_group(), *a, reinterpret_cast<std::byte*>(data), n,
                           p2p::float_max());
  all_reduce_of(comm_, size_, data, n, MPI_FLOAT, MPI_MAX);
}

void MpiCommunicator::all_reduce(double* data, int64_t n) {
  if (auto a = chosen(spec::CollectiveKind::kAllReduce))
    return p2p::all_reduce(p2p_group(), *a, reinterpret_cast<std::byte*>(data), n,
                           p2p::double_sum());
  all_reduce_of(comm_, size_, data, n, MPI_DOUBLE, MPI_SUM);
}

// Open MPI without an asynchronous progress thread advances a non-blocking all-reduce only inside
// MPI calls, so it does not overlap with compute; its libnbc algorithm is also slower than the
// blocking one. The bucket is therefore reduced with the blocking call, at the moment it is ready:
// the same schedule, measured cleanly. (NCCL's all-reduce is truly asynchronous.)
std::unique_ptr<CommRequest> MpiCommunicator::all_reduce_async(float* data, int64_t n) {
  all_reduce(data, n);
  return std::make_unique<MpiRequest>(MPI_REQUEST_NULL);
}

std::unique_ptr<CommRequest> MpiCommunicator::all_reduce_host_async(double* data, int64_t n) {
  MPI_Request request = MPI_REQUEST_NULL;
  if (chosen(spec::CollectiveKind::kAllReduce)) {
    all_reduce(data, n);  // the named algorithm, at once
    return std::make_unique<MpiRequest>(request);
  }
  if (size_ > 1)
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count(n), MPI_DOUBLE, MPI_SUM, comm_, &request));
  return std::make_unique<MpiRequest>(request);
}

void MpiCommunicator::reduce_scatter(const float* in, float* out, int64_t n) {
  if (auto a = chosen(spec::CollectiveKind::kReduceScatter))
    return p2p_reduce_scatter(*a, in, out, std::vector<int64_t>(static_cast<size_t>(size_), n),
                              p2p::float_sum());
  reduce_scatter_of(comm_, size_, in, out, n, MPI_FLOAT, MPI_SUM);
}

void MpiCommunicator::all_gather(const float* in, float* out, int64_t n) {
  if (auto a = chosen(spec::CollectiveKind::kAllGather))
    return p2p_all_gather(*a, in, out, std::vector<int64_t>(static_cast<size_t>(size_), n),
                          p2p::plain(sizeof(float)));
  all_gather_of(comm_, size_, in, out, n, MPI_FLOAT);
}

void MpiCommunicator::all_to_all(const float* in, float* out, int64_t n) {
  if (chosen(spec::CollectiveKind::kAllToAll)) {
    const std::vector<int64_t> blocks(static_cast<size_t>(size_), n);
    return p2p::all_to_all(p2p_group(), reinterpret_cast<const std::byte*>(in), blocks,
                           reinterpret_cast<std::byte*>(out), blocks, p2p::plain(sizeof(float)));
  }
  all_to_all_of(comm_, size_, in, out, n, MPI_FLOAT);
}

void MpiCommunicator::all_to_all_v(const float* in, const std::vector<int64_t>& send, float* out,
                                   const std::vector<int64_t>& recv) {
  std::vector<int> send_counts, send_at, recv_counts, recv_at;
  int64_t s = 0, r = 0;
  for (int j = 0; j < size_; ++j) {
    send_counts.push_back(count(send[static_cast<size_t>(j)]));
    send_at.push_back(count(s));
    s += send[static_cast<size_t>(j)];
    recv_counts.push_back(count(recv[static_cast<size_t>(j)]));
    recv_at.push_back(count(r));
    r += recv[static_cast<size_t>(j)];
  }
  if (size_ == 1) {
    std::copy(in, in + s, out);
    return;
  }
  if (chosen(spec::CollectiveKind::kAllToAll))
    return p2p::all_to_all(p2p_group(), reinterpret_cast<const std::byte*>(in), send,
                           reinterpret_cast<std::byte*>(out), recv, p2p::plain(sizeof(float)));
  MPI_CHECK(MPI_Alltoallv(in, send_counts.data(), send_at.data(), MPI_FLOAT, out,
                          recv_counts.data(), recv_at.data(), MPI_FLOAT, comm_));
}

namespace {

// MPI's counts and displacements of blocks of `counts` elements laid one after another.
struct Blocks {
  std::vector<int> sizes, at;
};
Blocks blocks_of(const std::vector<int64_t>& counts) {
  Blocks b;
  int64_t total = 0;
  for (int64_t n : counts) {
    b.sizes.push_back(count(n));
    b.at.push_back(count(total));
    total += n;
  }
  return b;
}

}  // namespace

void MpiCommunicator::all_gather_v(const float* in, float* out,
                                   const std::vector<int64_t>& counts) {
  const auto [sizes, at] = blocks_of(counts);
  if (size_ == 1) {
    std::copy(in, in + counts[0], out);
    return;
  }
  if (auto a = chosen(spec::CollectiveKind::kAllGather))
    return p2p_all_gather(*a, in, out, counts, p2p::plain(sizeof(float)));
  MPI_CHECK(MPI_Allgatherv(in, sizes[static_cast<size_t>(rank_)], MPI_FLOAT, out, sizes.data(),
                           at.data(), MPI_FLOAT, comm_));
}

void MpiCommunicator::all_gather_v_in_place(float* data, const std::vector<int64_t>& counts) {
  if (size_ == 1) return;
  if (auto a = chosen(spec::CollectiveKind::kAllGather))
    return p2p::all_gather(p2p_group(), *a, reinterpret_cast<std::byte*>(data), counts,
                           p2p::plain(sizeof(float)));
  const auto [sizes, at] = blocks_of(counts);
  MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, sizes.data(), at.data(),
                           MPI_FLOAT, comm_));
}

void MpiCommunicator::reduce_scatter_v(const float* in, float* out,
                                       const std::vector<int64_t>& counts) {
  std::vector<int> sizes;
  for (int j = 0; j < size_; ++j) sizes.push_back(count(counts[static_cast<size_t>(j)]));
  if (size_ == 1) {
    std::copy(in, in + counts[0], out);
    return;
  }
  if (auto a = chosen(spec::CollectiveKind::kReduceScatter))
    return p2p_reduce_scatter(*a, in, out, counts, p2p::float_sum());
  MPI_CHECK(MPI_Reduce_scatter(in, out, sizes.data(), MPI_FLOAT, MPI_SUM, comm_));
}

void MpiCommunicator::all_to_all_host(const int64_t* in, int64_t* out, int64_t n) {
  if (chosen(spec::CollectiveKind::kAllToAll)) {
    const std::vector<int64_t> blocks(static_cast<size_t>(size_), n);
    return p2p::all_to_all(p2p_group(), reinterpret_cast<const std::byte*>(in), blocks,
                           reinterpret_cast<std::byte*>(out), blocks, p2p::plain(sizeof(int64_t)));
  }
  all_to_all_of(comm_, size_, in, out, n, MPI_INT64_T);
}

void MpiCommunicator::broadcast(float* data, int64_t n, int root) {
  if (size_ == 1) return;
  if (chosen(spec::CollectiveKind::kBroadcast))
    return p2p::broadcast(p2p_group(), reinterpret_cast<std::byte*>(data), n, root,
                          p2p::plain(sizeof(float)));
  MPI_CHECK(MPI_Bcast(data, count(n), MPI_FLOAT, root, comm_));
}

std::unique_ptr<CommRequest> MpiCommunicator::send(const float* data, int64_t n, int peer,
                                                   int tag) {
  return send_of(comm_, data, n, MPI_FLOAT, peer, tag);
}

void MpiCommunicator::recv(float* data, int64_t n, int peer, int tag) {
  recv_of(comm_, data, n, MPI_FLOAT, peer, tag);
}

void MpiCommunicator::all_reduce_bf16(uint16_t* data, int64_t n) {
  if (auto a = chosen(spec::CollectiveKind::kAllReduce))
    return p2p::all_reduce(p2p_group(), *a, reinterpret_cast<std::byte*>(data), n, p2p::bf16_sum());
  all_reduce_of(comm_, size_, data, n, MPI_UINT16_T, bf16_sum_);
}

void MpiCommunicator::reduce_scatter_bf16(const uint16_t* in, uint16_t* out, int64_t n) {
  if (auto a = chosen(spec::CollectiveKind::kReduceScatter))
    return p2p_reduce_scatter(*a, in, out, std::vector<int64_t>(static_cast<size_t>(size_), n),
                              p2p::bf16_sum());
  reduce_scatter_of(comm_, size_, in, out, n, MPI_UINT16_T, bf16_sum_);
}

void MpiCommunicator::all_gather_bf16(const uint16_t* in, uint16_t* out, int64_t n) {
  if (auto a = chosen(spec::CollectiveKind::kAllGather))
    return p2p_all_gather(*a, in, out, std::vector<int64_t>(static_cast<size_t>(size_), n),
                          p2p::plain(sizeof(uint16_t)));
  all_gather_of(comm_, size_, in, out, n, MPI_UINT16_T);
}

void MpiCommunicator::all_to_all_bf16(const uint16_t* in, uint16_t* out, int64_t n) {
  if (chosen(spec::CollectiveKind::kAllToAll)) {
    const std::vector<int64_t> blocks(static_cast<size_t>(size_), n);
    return p2p::all_to_all(p2p_group(), reinterpret_cast<const std::byte*>(in), blocks,
                           reinterpret_cast<std::byte*>(out), blocks, p2p::plain(sizeof(uint16_t)));
  }
  all_to_all_of(comm_, size_, in, out, n, MPI_UINT16_T);
}

std::unique_ptr<CommRequest> MpiCommunicator::send_bf16(const uint16_t* data, int64_t n, int peer,
                                                        int tag) {
  return send_of(comm_, data, n, MPI_UINT16_T, peer, tag);
}

void MpiCommunicator::recv_bf16(uint16_t* data, int64_t n, int peer, int tag) {
  recv_of(comm_, data, n, MPI_UINT16_T, peer, tag);
}

void MpiCommunicator::barrier() {
  MPI_CHECK(MPI_Barrier(comm_));
}

std::vector<std::string> MpiCommunicator::gather_strings(const std::string& mine, int root) {
  int len = count(static_cast<int64_t>(mine.size()));
  std::vector<int> lengths(static_cast<size_t>(size_));
  MPI_CHECK(MPI_Gather(&len, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, comm_));
  std::vector<int> offsets(static_cast<size_t>(size_), 0);
  int64_t total = 0;
  for (int i = 0; i < size_; ++i) {
    offsets[static_cast<size_t>(i)] = static_cast<int>(total);
    total += lengths[static_cast<size_t>(i)];
  }
  std::string all(rank_ == root ? static_cast<size_t>(total) : 0, '\0');
  MPI_CHECK(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                        MPI_CHAR, root, comm_));
  std::vector<std::string> out;
  if (rank_ == root) {
    for (int i = 0; i < size_; ++i)
      out.push_back(all.substr(static_cast<size_t>(offsets[static_cast<size_t>(i)]),
                               static_cast<size_t>(lengths[static_cast<size_t>(i)])));
  }
  return out;
}

}  // namespace sextant::exec
