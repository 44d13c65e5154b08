// Collectives from MPI point-to-point messages (p2p_collectives.hpp).
#include "p2p_collectives.hpp"

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>

#include "mpi_communicator.hpp"
#include "sextant/exec/tensor.hpp"
#include "sextant/spec/collective.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec::p2p {

namespace {

using spec::CollectiveAlgorithm;

template <typename T, typename Op>
void combine_as(const std::byte* in, std::byte* inout, int64_t n, Op op) {
  for (int64_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, in + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    std::memcpy(&b, inout + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    const T c = op(a, b);
    std::memcpy(inout + i * static_cast<int64_t>(sizeof(T)), &c, sizeof(T));
  }
}

int byte_count(int64_t n, const Elements& e) {
  const int64_t bytes = n * static_cast<int64_t>(e.bytes);
  SEXTANT_CHECK(bytes >= 0 && bytes <= INT_MAX, "message of {} bytes is too large for MPI", bytes);
  return static_cast<int>(bytes);
}

// Sends `send_n` elements to `to` while receiving `recv_n` from `from` (either may be 0).
void exchange(const Group& g, const std::byte* send, int64_t send_n, int to, std::byte* recv,
              int64_t recv_n, int from, const Elements& e) {
  MPI_CHECK(MPI_Sendrecv(send, byte_count(send_n, e), MPI_BYTE, to, 0, recv, byte_count(recv_n, e),
                         MPI_BYTE, from, 0, g.comm, MPI_STATUS_IGNORE));
}

void send_to(const Group& g, const std::byte* data, int64_t n, int to, const Elements& e) {
  MPI_CHECK(MPI_Send(data, byte_count(n, e), MPI_BYTE, to, 0, g.comm));
}

void receive_from(const Group& g, std::byte* data, int64_t n, int from, const Elements& e) {
  MPI_CHECK(MPI_Recv(data, byte_count(n, e), MPI_BYTE, from, 0, g.comm, MPI_STATUS_IGNORE));
}

// Where each block starts (in elements), with the end as a last entry.
std::vector<int64_t> starts_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> at(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) at[i + 1] = at[i] + counts[i];
  return at;
}

// n elements in p blocks as even as can be (the first n % p one larger).
std::vector<int64_t> even_blocks(int64_t n, int p) {
  std::vector<int64_t> counts(static_cast<size_t>(p), n / p);
  for (int64_t i = 0; i < n % p; ++i) ++counts[static_cast<size_t>(i)];
  return counts;
}

// The ranks that take part after a group of p folds into the largest power of two below it
// (Thakur et al. 2005, section 4.1): of the first 2 * (p - p2) ranks the even ones hand their
// data to the odd ones and wait. `real` maps a taking part rank to its rank in the group.
struct Folded {
  int rank = -1;  // -1: waits
  int size = 1;
  int extra = 0;  // p - p2
  int real(int folded) const { return folded < extra ? 2 * folded + 1 : folded + extra; }
};

Folded fold(const Group& g, std::byte* data, int64_t n, const Elements& e,
            std::vector<std::byte>& scratch) {
  Folded f;
  f.size = static_cast<int>(std::bit_floor(static_cast<unsigned>(g.size)));
  f.extra = g.size - f.size;
  if (g.rank < 2 * f.extra) {
    if (g.rank % 2 == 0) {
      send_to(g, data, n, g.rank + 1, e);
      return f;
    }
    scratch.resize(static_cast<size_t>(n) * e.bytes);
    receive_from(g, scratch.data(), n, g.rank - 1, e);
    e.combine(scratch.data(), data, n);
    f.rank = g.rank / 2;
  } else {
    f.rank = g.rank - f.extra;
  }
  return f;
}

// The folded ranks' result back to the ranks that waited.
void unfold(const Group& g, const Folded& f, std::byte* data, int64_t n, const Elements& e) {
  if (g.rank >= 2 * f.extra) return;
  if (g.rank % 2 == 1)
    send_to(g, data, n, g.rank - 1, e);
  else
    receive_from(g, data, n, g.rank + 1, e);
}

// Recursive halving over `size` (a power of two) taking-part ranks, `real` mapping them to the
// group: rank r keeps halving its range of blocks toward block r, summing the partner's half.
template <typename Real>
void halving(const Group& g, int rank, int size, Real real, std::byte* data,
             const std::vector<int64_t>& at, const Elements& e, std::vector<std::byte>& scratch) {
  int lo = 0, hi = size;
  for (int mask = size / 2; mask >= 1; mask /= 2) {
    const int partner = rank ^ mask, mid = lo + (hi - lo) / 2;
    const bool lower = (rank & mask) == 0;
    const int keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
    const int give_lo = lower ? mid : lo, give_hi = lower ? hi : mid;
    const int64_t keep_n = at[keep_hi] - at[keep_lo];
    scratch.resize(static_cast<size_t>(keep_n) * e.bytes);
    exchange(g, data + at[give_lo] * static_cast<int64_t>(e.bytes), at[give_hi] - at[give_lo],
             real(partner), scratch.data(), keep_n, real(partner), e);
    e.combine(scratch.data(), data + at[keep_lo] * static_cast<int64_t>(e.bytes), keep_n);
    lo = keep_lo;
    hi = keep_hi;
  }
}

// Recursive doubling of ranges of blocks: rank r starts with block r and doubles what it holds.
template <typename Real>
void doubling(const Group& g, int rank, int size, Real real, std::byte* data,
              const std::vector<int64_t>& at, const Elements& e) {
  for (int mask = 1; mask < size; mask *= 2) {
    const int partner = rank ^ mask;
    const int mine = rank & ~(mask - 1), theirs = partner & ~(mask - 1);
    exchange(g, data + at[mine] * static_cast<int64_t>(e.bytes), at[mine + mask] - at[mine],
             real(partner), data + at[theirs] * static_cast<int64_t>(e.bytes),
             at[theirs + mask] - at[theirs], real(partner), e);
  }
}

void ring_reduce_scatter(const Group& g, std::byte* data, const std::vector<int64_t>& at,
                         const Elements& e, std::vector<std::byte>& scratch) {
  const int p = g.size, r = g.rank, next = (r + 1) % p, prev = (r + p - 1) % p;
  // Step s sends block r - s - 1 on and receives block r - s - 2, which its sender summed over
  // s + 1 ranks; at step p - 2 that is block r, summed over all.
  for (int s = 0; s < p - 1; ++s) {
    const int give = ((r - s - 1) % p + p) % p, take = ((r - s - 2) % p + p) % p;
    const int64_t take_n = at[take + 1] - at[take];
    scratch.resize(static_cast<size_t>(take_n) * e.bytes);
    exchange(g, data + at[give] * static_cast<int64_t>(e.bytes), at[give + 1] - at[give], next,
             scratch.data(), take_n, prev, e);
    e.combine(scratch.data(), data + at[take] * static_cast<int64_t>(e.bytes), take_n);
  }
}

void ring_all_gather(const Group& g, std::byte* data, const std::vector<int64_t>& at,
                     const Elements& e) {
  const int p = g.size, r = g.rank, next = (r + 1) % p, prev = (r + p - 1) % p;
  for (int s = 0; s < p - 1; ++s) {
    const int give = ((r - s) % p + p) % p, take = ((r - s - 1) % p + p) % p;
    exchange(g, data + at[give] * static_cast<int64_t>(e.bytes), at[give + 1] - at[give], next,
             data + at[take] * static_cast<int64_t>(e.bytes), at[take + 1] - at[take], prev, e);
  }
}

void pairwise_reduce_scatter(const Group& g, std::byte* data, const std::vector<int64_t>& at,
                             const Elements& e, std::vector<std::byte>& scratch) {
  const int p = g.size, r = g.rank;
  const int64_t mine = at[r + 1] - at[r];
  scratch.resize(static_cast<size_t>(mine) * e.bytes);
  for (int s = 1; s < p; ++s) {
    const int to = (r + s) % p, from = (r - s + p) % p;
    exchange(g, data + at[to] * static_cast<int64_t>(e.bytes), at[to + 1] - at[to], to,
             scratch.data(), mine, from, e);
    e.combine(scratch.data(), data + at[r] * static_cast<int64_t>(e.bytes), mine);
  }
}

void require_power_of_two(const Group& g, CollectiveAlgorithm algorithm) {
  SEXTANT_CHECK(std::has_single_bit(static_cast<unsigned>(g.size)),
                "{} needs a power-of-two group here, not {} ranks (the plan check refuses it)",
                spec::enum_name(spec::collective_algorithm_names(), algorithm), g.size);
}

// Binomial reduce to rank 0 (Thakur et al. 2005, section 4.3): at each mask a rank with that bit
// sends its partial sum down and is done; the others add what comes from rank + mask.
void binomial_reduce(const Group& g, std::byte* data, int64_t n, const Elements& e,
                     std::vector<std::byte>& scratch) {
  scratch.resize(static_cast<size_t>(n) * e.bytes);
  for (int mask = 1; mask < g.size; mask *= 2) {
    if (g.rank & mask) {
      send_to(g, data, n, g.rank - mask, e);
      return;
    }
    if (g.rank + mask < g.size) {
      receive_from(g, scratch.data(), n, g.rank + mask, e);
      e.combine(scratch.data(), data, n);
    }
  }
}

}  // namespace

Elements float_sum() {
  return {sizeof(float), [](const std::byte* in, std::byte* inout, int64_t n) {
            combine_as<float>(in, inout, n, [](float a, float b) { return a + b; });
          }};
}

Elements float_max() {
  return {sizeof(float), [](const std::byte* in, std::byte* inout, int64_t n) {
            combine_as<float>(in, inout, n, [](float a, float b) { return std::max(a, b); });
          }};
}

Elements double_sum() {
  return {sizeof(double), [](const std::byte* in, std::byte* inout, int64_t n) {
            combine_as<double>(in, inout, n, [](double a, double b) { return a + b; });
          }};
}

Elements bf16_sum() {
  return {sizeof(uint16_t), [](const std::byte* in, std::byte* inout, int64_t n) {
            combine_as<uint16_t>(in, inout, n, [](uint16_t a, uint16_t b) {
              return to_bf16(from_bf16(a) + from_bf16(b));
            });
          }};
}

Elements plain(size_t bytes) {
  return {bytes, nullptr};
}

void reduce_scatter(const Group& g, CollectiveAlgorithm algorithm, std::byte* data,
                    const std::vector<int64_t>& counts, const Elements& e) {
  if (g.size == 1) return;
  const std::vector<int64_t> at = starts_of(counts);
  std::vector<std::byte> scratch;
  switch (algorithm) {
    case CollectiveAlgorithm::kRing:
      return ring_reduce_scatter(g, data, at, e, scratch);
    case CollectiveAlgorithm::kPairwise:
      return pairwise_reduce_scatter(g, data, at, e, scratch);
    case CollectiveAlgorithm::kRecursiveDoubling:
      require_power_of_two(g, algorithm);
      return halving(
          g, g.rank, g.size, [](int r) { return r; }, data, at, e, scratch);
    default:
      SEXTANT_CHECK(false, "no reduce-scatter by {} here",
                    spec::enum_name(spec::collective_algorithm_names(), algorithm));
  }
}

void all_gather(const Group& g, CollectiveAlgorithm algorithm, std::byte* data,
                const std::vector<int64_t>& counts, const Elements& e) {
  if (g.size == 1) return;
  const std::vector<int64_t> at = starts_of(counts);
  switch (algorithm) {
    case CollectiveAlgorithm::kRing:
      return ring_all_gather(g, data, at, e);
    case CollectiveAlgorithm::kRecursiveDoubling:
      require_power_of_two(g, algorithm);
      return doubling(
          g, g.rank, g.size, [](int r) { return r; }, data, at, e);
    default:
      SEXTANT_CHECK(false, "no all-gather by {} here",
                    spec::enum_name(spec::collective_algorithm_names(), algorithm));
  }
}

void all_reduce(const Group& g, CollectiveAlgorithm algorithm, std::byte* data, int64_t n,
                const Elements& e) {
  if (g.size == 1 || n == 0) return;
  std::vector<std::byte> scratch;
  switch (algorithm) {
    case CollectiveAlgorithm::kRing: {
      // Ring reduce-scatter, then ring all-gather (Patarasuk & Yuan 2009).
      const std::vector<int64_t> at = starts_of(even_blocks(n, g.size));
      ring_reduce_scatter(g, data, at, e, scratch);
      return ring_all_gather(g, data, at, e);
    }
    case CollectiveAlgorithm::kRecursiveDoubling: {
      // Whole vectors exchanged with rank ^ mask, log2 p2 times, after the fold.
      const Folded f = fold(g, data, n, e, scratch);
      if (f.rank >= 0) {
        scratch.resize(static_cast<size_t>(n) * e.bytes);
        for (int mask = 1; mask < f.size; mask *= 2) {
          exchange(g, data, n, f.real(f.rank ^ mask), scratch.data(), n, f.real(f.rank ^ mask), e);
          e.combine(scratch.data(), data, n);
        }
      }
      return unfold(g, f, data, n, e);
    }
    case CollectiveAlgorithm::kRabenseifner: {
      // Recursive halving reduce-scatter, then recursive doubling all-gather, after the fold.
      const Folded f = fold(g, data, n, e, scratch);
      if (f.rank >= 0) {
        const std::vector<int64_t> at = starts_of(even_blocks(n, f.size));
        const auto real = [&f](int r) { return f.real(r); };
        halving(g, f.rank, f.size, real, data, at, e, scratch);
        doubling(g, f.rank, f.size, real, data, at, e);
      }
      return unfold(g, f, data, n, e);
    }
    case CollectiveAlgorithm::kBinomialTree:
      binomial_reduce(g, data, n, e, scratch);
      return broadcast(g, data, n, 0, e);
    default:
      SEXTANT_CHECK(false, "no all-reduce by {} here",
                    spec::enum_name(spec::collective_algorithm_names(), algorithm));
  }
}

void all_to_all(const Group& g, const std::byte* in, const std::vector<int64_t>& send,
                std::byte* out, const std::vector<int64_t>& recv, const Elements& e) {
  const std::vector<int64_t> send_at = starts_of(send), recv_at = starts_of(recv);
  const auto bytes = static_cast<int64_t>(e.bytes);
  std::memcpy(out + recv_at[g.rank] * bytes, in + send_at[g.rank] * bytes,
              static_cast<size_t>(send[static_cast<size_t>(g.rank)] * bytes));
  for (int s = 1; s < g.size; ++s) {
    const int to = (g.rank + s) % g.size, from = (g.rank - s + g.size) % g.size;
    exchange(g, in + send_at[to] * bytes, send[static_cast<size_t>(to)], to,
             out + recv_at[from] * bytes, recv[static_cast<size_t>(from)], from, e);
  }
}

void broadcast(const Group& g, std::byte* data, int64_t n, int root, const Elements& e) {
  if (g.size == 1) return;
  // Binomial tree (Thakur et al. 2005, section 4.2) over ranks relative to the root.
  const int rel = (g.rank - root + g.size) % g.size;
  int mask = 1;
  for (; mask < g.size; mask *= 2)
    if (rel & mask) {
      receive_from(g, data, n, (rel - mask + root) % g.size, e);
      break;
    }
  for (mask /= 2; mask > 0; mask /= 2)
    if (rel + mask < g.size) send_to(g, data, n, (rel + mask + root) % g.size, e);
}

}  // namespace sextant::exec::p2p
