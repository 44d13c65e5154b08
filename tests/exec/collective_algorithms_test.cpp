// The collectives a plan names, run from point-to-point messages
// (exec/src/comm/p2p_collectives.hpp), against MPI's own on the same data, on 2, 3, 4 and 5 ranks
// (mpirun; 3 and 5 fold into a power of two first). Integer-valued data sums exactly in any order,
// so every result must equal MPI's bit for bit; random data must agree to rounding and be bitwise
// alike on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <random>

#include "sextant/exec/communicators.hpp"
#include "sextant/exec/sparse_all_reduce.hpp"
#include "sextant/exec/tensor.hpp"
#include "sextant/spec/executor_support.hpp"

namespace sextant::exec {
namespace {

using spec::CollectiveAlgorithm;
using spec::CollectiveKind;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

std::unique_ptr<Communicator> communicator(spec::CollectiveAlgorithms algorithms = {}) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  return make_communicator(CommKind::kMpi, comm, "test", algorithms);
}

// The algorithms the executor runs `kind` by on this many ranks.
std::vector<CollectiveAlgorithm> algorithms_for(CollectiveKind kind) {
  std::vector<CollectiveAlgorithm> out;
  for (const auto& [name, algorithm] : spec::collective_algorithm_names()) {
    if (!spec::executor_runs_collective(kind, algorithm)) continue;
    const bool needs_power_of_two =
        algorithm == CollectiveAlgorithm::kRecursiveDoubling && kind != CollectiveKind::kAllReduce;
    if (needs_power_of_two && !std::has_single_bit(static_cast<unsigned>(world_size()))) continue;
    out.push_back(algorithm);
  }
  return out;
}

std::string name_of(CollectiveAlgorithm a) {
  return std::string(spec::enum_name(spec::collective_algorithm_names(), a));
}

// Small integers that differ per rank and element: their sums are exact in float and bf16.
std::vector<float> integers(int64_t n, int rank) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = static_cast<float>((rank + 1) * (i % 7) - (3 * i + rank) % 5);
  return v;
}

std::vector<float> randoms(int64_t n, int rank) {
  std::mt19937 gen(1234 + static_cast<unsigned>(rank));
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(gen);
  return v;
}

// Every rank holds what rank 0 holds, bit for bit.
void expect_alike_on_every_rank(const std::vector<float>& v) {
  std::vector<float> first = v;
  MPI_Bcast(first.data(), static_cast<int>(first.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  for (size_t i = 0; i < v.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(v[i]), std::bit_cast<uint32_t>(first[i])) << "element " << i;
}

TEST(CollectiveAlgorithms, AllReduceEqualsMpisOnEveryAlgorithmAndSize) {
  const auto mpi = communicator();
  for (CollectiveAlgorithm a : algorithms_for(CollectiveKind::kAllReduce)) {
    const auto named = communicator({{CollectiveKind::kAllReduce, a}});
    for (int64_t n : {1, 5, 64, 1003}) {
      SCOPED_TRACE(name_of(a) + " n=" + std::to_string(n));
      std::vector<float> want = integers(n, world_rank()), got = want;
      mpi->all_reduce(want.data(), n);
      named->all_reduce(got.data(), n);
      EXPECT_EQ(got, want);
      want = randoms(n, world_rank());
      got = want;
      mpi->all_reduce_max(want.data(), n);
      named->all_reduce_max(got.data(), n);
      EXPECT_EQ(got, want);  // a maximum is exact in any order
      want = randoms(n, world_rank());
      got = want;
      mpi->all_reduce(want.data(), n);
      named->all_reduce(got.data(), n);
      for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5);
      expect_alike_on_every_rank(got);
      std::vector<double> wide(static_cast<size_t>(n), 0.5 * (world_rank() + 1)), sum = wide;
      named->all_reduce(sum.data(), n);
      const double expected = 0.25 * world_size() * (world_size() + 1);
      for (double x : sum) EXPECT_EQ(x, expected);
      std::vector<uint16_t> bf16(static_cast<size_t>(n)), bf16_mpi(static_cast<size_t>(n));
      const std::vector<float> ints = integers(n, world_rank());
      for (size_t i = 0; i < ints.size(); ++i) bf16[i] = bf16_mpi[i] = to_bf16(ints[i]);
      mpi->all_reduce_bf16(bf16_mpi.data(), n);
      named->all_reduce_bf16(bf16.data(), n);
      EXPECT_EQ(bf16, bf16_mpi);
    }
  }
}

// Uneven blocks, one of them empty: what the executor's ZeRO shards look like.
std::vector<int64_t> uneven_counts() {
  std::vector<int64_t> counts;
  for (int j = 0; j < world_size(); ++j) counts.push_back(j == 1 ? 0 : 3 + 2 * j);
  return counts;
}

TEST(CollectiveAlgorithms, ReduceScatterEqualsMpisEvenAndUneven) {
  const auto mpi = communicator();
  const int p = world_size(), r = world_rank();
  for (CollectiveAlgorithm a : algorithms_for(CollectiveKind::kReduceScatter)) {
    SCOPED_TRACE(name_of(a));
    const auto named = communicator({{CollectiveKind::kReduceScatter, a}});
    const int64_t block = 37;
    const std::vector<float> in = integers(block * p, r);
    std::vector<float> want(block), got(block);
    mpi->reduce_scatter(in.data(), want.data(), block);
    named->reduce_scatter(in.data(), got.data(), block);
    EXPECT_EQ(got, want);
    const std::vector<int64_t> counts = uneven_counts();
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const std::vector<float> uneven = integers(total, r);
    std::vector<float> want_v(static_cast<size_t>(counts[static_cast<size_t>(r)])),
        got_v(want_v.size());
    mpi->reduce_scatter_v(uneven.data(), want_v.data(), counts);
    named->reduce_scatter_v(uneven.data(), got_v.data(), counts);
    EXPECT_EQ(got_v, want_v);
    std::vector<uint16_t> bf16_in(in.size()), want16(block), got16(block);
    for (size_t i = 0; i < in.size(); ++i) bf16_in[i] = to_bf16(in[i]);
    mpi->reduce_scatter_bf16(bf16_in.data(), want16.data(), block);
    named->reduce_scatter_bf16(bf16_in.data(), got16.data(), block);
    EXPECT_EQ(got16, want16);
  }
}

TEST(CollectiveAlgorithms, AllGatherEqualsMpisEvenUnevenAndInPlace) {
  const auto mpi = communicator();
  const int p = world_size(), r = world_rank();
  for (CollectiveAlgorithm a : algorithms_for(CollectiveKind::kAllGather)) {
    SCOPED_TRACE(name_of(a));
    const auto named = communicator({{CollectiveKind::kAllGather, a}});
    const int64_t block = 29;
    const std::vector<float> mine = randoms(block, r);
    std::vector<float> want(static_cast<size_t>(block * p)), got(want.size());
    mpi->all_gather(mine.data(), want.data(), block);
    named->all_gather(mine.data(), got.data(), block);
    EXPECT_EQ(got, want);
    const std::vector<int64_t> counts = uneven_counts();
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const std::vector<float> part = randoms(counts[static_cast<size_t>(r)], r);
    std::vector<float> want_v(static_cast<size_t>(total)), got_v(want_v.size());
    mpi->all_gather_v(part.data(), want_v.data(), counts);
    named->all_gather_v(part.data(), got_v.data(), counts);
    EXPECT_EQ(got_v, want_v);
    // In place: this rank's block already where it belongs, the rest garbage.
    std::vector<float> in_place(static_cast<size_t>(total), -7.0f);
    const int64_t at = std::accumulate(counts.begin(), counts.begin() + r, int64_t{0});
    std::copy(part.begin(), part.end(), in_place.begin() + at);
    named->all_gather_v_in_place(in_place.data(), counts);
    EXPECT_EQ(in_place, want_v);
  }
}

TEST(CollectiveAlgorithms, AllToAllAndBroadcastEqualMpis) {
  const auto mpi = communicator();
  const int p = world_size(), r = world_rank();
  const auto named =
      communicator({{CollectiveKind::kAllToAll, CollectiveAlgorithm::kPairwise},
                    {CollectiveKind::kBroadcast, CollectiveAlgorithm::kBinomialTree}});
  const int64_t block = 11;
  const std::vector<float> in = randoms(block * p, r);
  std::vector<float> want(in.size()), got(in.size());
  mpi->all_to_all(in.data(), want.data(), block);
  named->all_to_all(in.data(), got.data(), block);
  EXPECT_EQ(got, want);
  // Rank r sends j + r + 1 elements to rank j.
  std::vector<int64_t> send, recv;
  for (int j = 0; j < p; ++j) {
    send.push_back(j + r + 1);
    recv.push_back(r + j + 1);
  }
  const std::vector<float> in_v = randoms(std::accumulate(send.begin(), send.end(), int64_t{0}), r);
  std::vector<float> want_v(static_cast<size_t>(std::accumulate(recv.begin(), recv.end(), 0L))),
      got_v(want_v.size());
  mpi->all_to_all_v(in_v.data(), send, want_v.data(), recv);
  named->all_to_all_v(in_v.data(), send, got_v.data(), recv);
  EXPECT_EQ(got_v, want_v);
  std::vector<int64_t> ids(static_cast<size_t>(p * 3)), want_ids(ids.size()), got_ids(ids.size());
  std::iota(ids.begin(), ids.end(), 100 * r);
  mpi->all_to_all_host(ids.data(), want_ids.data(), 3);
  named->all_to_all_host(ids.data(), got_ids.data(), 3);
  EXPECT_EQ(got_ids, want_ids);
  for (int root : {0, p - 1}) {
    std::vector<float> data = randoms(50, r), expected = randoms(50, root);
    named->broadcast(data.data(), 50, root);
    EXPECT_EQ(data, expected) << "root " << root;
  }
}

// Rank `rank`'s top-k selection for the sparse all-reduce test: k distinct indices below n
// (13 j + 7 rank mod n, 13 prime to n = 100), sorted, then their values as bits, as top-k encodes
// them (exec/src/comm/gradient_codec.cpp): small integers, which sum exactly in any order.
std::vector<uint32_t> selection(int rank, int64_t k, int64_t n) {
  std::vector<uint32_t> index;
  for (int64_t j = 0; j < k; ++j) index.push_back(static_cast<uint32_t>((13 * j + 7 * rank) % n));
  std::sort(index.begin(), index.end());
  std::vector<uint32_t> encoded = index;
  for (uint32_t i : index)
    encoded.push_back(std::bit_cast<uint32_t>(static_cast<float>((rank + 1) * (i % 5 + 1))));
  return encoded;
}

// selection()'s indices with random values.
std::vector<uint32_t> random_selection(int rank, int64_t k, int64_t n) {
  std::vector<uint32_t> e = selection(rank, k, n);
  const std::vector<float> values = randoms(k, rank);
  for (int64_t j = 0; j < k; ++j) e[k + j] = std::bit_cast<uint32_t>(values[j]);
  return e;
}

// SparCML's sparse all-reduce (exec/sparse_all_reduce.hpp) against the dense sum of every rank's
// pairs, added here one rank after another: exact on integers, on every rank. Three pairs of
// 100 stay sparse (at most 3 p <= 12 pairs); 45 go dense at the first merge (two selections
// share 6 indices: 13 (i - j) = 7 mod 100 for i - j = 39, j < 6, so the union holds 84 > 50).
TEST(SparseAllReduce, SumsEveryRanksPairsSparseOrDense) {
  const int p = world_size(), r = world_rank();
  constexpr int64_t n = 100;
  auto comm = communicator();
  if (!std::has_single_bit(static_cast<unsigned>(p))) {
    const std::vector<uint32_t> mine = selection(r, 3, n);
    EXPECT_ANY_THROW(SparseAllReduce(*comm, n, mine.data(), 3)) << "needs a power of two";
    return;
  }
  for (int64_t k : {3, 45}) {
    std::vector<float> want(n, 0.0f);
    for (int q = 0; q < p; ++q) {
      const std::vector<uint32_t> theirs = selection(q, k, n);
      for (int64_t j = 0; j < k; ++j) want[theirs[j]] += std::bit_cast<float>(theirs[k + j]);
    }
    const std::vector<uint32_t> mine = selection(r, k, n);
    SparseAllReduce sum(*comm, n, mine.data(), k);
    EXPECT_EQ(sum.rounds(), std::countr_zero(static_cast<unsigned>(p)));
    for (int round = 0; round < sum.rounds(); ++round) {
      const int64_t sent = sum.exchange(round);
      if (round == 0) {
        EXPECT_EQ(sent, 8 * k) << "the rank's own pairs";
      }
      sum.merge();
    }
    std::vector<float> got(n, -1.0f);
    sum.write(got.data());
    EXPECT_EQ(got, want) << "k " << k;
    EXPECT_EQ(sum.dense(), k == 45 && p > 1) << "k " << k;
  }
}

// Random values: the sum agrees with the dense sum to rounding and is bitwise alike on every rank.
TEST(SparseAllReduce, EveryRankEndsBitwiseAlike) {
  const int p = world_size(), r = world_rank();
  if (!std::has_single_bit(static_cast<unsigned>(p))) GTEST_SKIP() << "a power of two";
  constexpr int64_t n = 1000, k = 40;
  auto comm = communicator();
  std::vector<double> want(n, 0.0);
  for (int q = 0; q < p; ++q) {
    const std::vector<uint32_t> e = random_selection(q, k, n);
    for (int64_t j = 0; j < k; ++j) want[e[j]] += std::bit_cast<float>(e[k + j]);
  }
  const std::vector<uint32_t> mine = random_selection(r, k, n);
  SparseAllReduce sum(*comm, n, mine.data(), k);
  for (int round = 0; round < sum.rounds(); ++round) {
    sum.exchange(round);
    sum.merge();
  }
  std::vector<float> got(n);
  sum.write(got.data());
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
  expect_alike_on_every_rank(got);
}

// SparCML's split all-gather (exec/sparse_all_reduce.hpp) on any number of ranks, against the
// dense sum of every rank's pairs added here rank after rank: exact on integers. Whether a range
// went dense is counted here from the selections: its distinct indices against half its extent.
TEST(SparseSplitAllGather, SumsEveryRanksPairsOnAnyNumberOfRanks) {
  const int p = world_size(), r = world_rank();
  constexpr int64_t n = 100;
  auto comm = communicator();
  for (int64_t k : {3, 45}) {
    std::vector<float> want(n, 0.0f);
    std::vector<uint8_t> held(n, 0);
    for (int q = 0; q < p; ++q) {
      const std::vector<uint32_t> theirs = selection(q, k, n);
      for (int64_t j = 0; j < k; ++j) {
        want[theirs[j]] += std::bit_cast<float>(theirs[k + j]);
        held[theirs[j]] = 1;
      }
    }
    const int64_t first = r * n / p, last = (r + 1) * n / p;  // this rank's range
    const auto distinct = std::count(held.begin() + first, held.begin() + last, 1);
    const std::vector<uint32_t> mine = selection(r, k, n);
    SparseSplitAllGather sum(*comm, n, mine.data(), k);
    EXPECT_EQ(sum.split(), 8 * k) << "the rank's own pairs, each sent to its range's owner";
    sum.merge();
    EXPECT_EQ(sum.range_dense(), 2 * distinct > last - first) << "k " << k;
    if (!sum.range_dense()) {
      EXPECT_EQ(sum.range_pairs(), distinct) << "k " << k;
    }
    sum.gather();
    std::vector<float> got(n, -1.0f);
    sum.write(got.data());
    EXPECT_EQ(got, want) << "k " << k;
  }
}

// Random values: each element is 0 plus the values of the ranks that selected it, added in rank
// order -- top-k's decode, to the bit -- and every rank ends bitwise alike.
TEST(SparseSplitAllGather, AddsInRankOrderAsTopksDecodeDoes) {
  const int p = world_size(), r = world_rank();
  constexpr int64_t n = 1000, k = 40;
  auto comm = communicator();
  std::vector<float> want(n, 0.0f);
  for (int q = 0; q < p; ++q) {
    const std::vector<uint32_t> e = random_selection(q, k, n);
    for (int64_t j = 0; j < k; ++j) want[e[j]] += std::bit_cast<float>(e[k + j]);
  }
  const std::vector<uint32_t> mine = random_selection(r, k, n);
  SparseSplitAllGather sum(*comm, n, mine.data(), k);
  sum.split();
  sum.merge();
  sum.gather();
  std::vector<float> got(n);
  sum.write(got.data());
  EXPECT_EQ(got, want);
  expect_alike_on_every_rank(got);
}

}  // namespace
}  // namespace sextant::exec
