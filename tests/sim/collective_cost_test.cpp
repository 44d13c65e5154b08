// Collective costs against the α-β-γ formulas of Thakur, Rabenseifner & Gropp (2005) as printed
// in MPICH's sources (shared/reference/published.md T15b), written out again here.
#include "sextant/sim/collective_cost.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "sextant/sim/collective_model.hpp"
#include "sextant/sim/sync_wait.hpp"
#include "test_clusters.hpp"

namespace sextant::sim {
namespace {

using A = spec::CollectiveAlgorithm;
using K = spec::CollectiveKind;

constexpr double kTol = 1e-12;
const AlphaBetaGamma kLink{2e-6, 1.0 / 25e9, 1.0 / 200e9};

double cost(K k, A a, int64_t p, double n) {
  return flat_cost(k, a, p, n, kLink).total();
}

TEST(CollectiveCost, AllReduceFormulasPowerOfTwo) {
  const double a = kLink.alpha, b = kLink.beta, g = kLink.gamma;
  for (int64_t p : {2, 4, 8, 16, 64}) {
    for (double n : {1e3, 1e6, 1e9}) {
      const double P = static_cast<double>(p), lg = std::log2(P);
      EXPECT_NEAR(cost(K::kAllReduce, A::kRing, p, n),
                  2 * (P - 1) * a + 2 * (P - 1) / P * n * b + (P - 1) / P * n * g, kTol * n);
      EXPECT_NEAR(cost(K::kAllReduce, A::kRecursiveDoubling, p, n),
                  lg * a + n * lg * b + n * lg * g, kTol * n);
      EXPECT_NEAR(cost(K::kAllReduce, A::kRabenseifner, p, n),
                  2 * lg * a + 2 * (P - 1) / P * n * b + (P - 1) / P * n * g, kTol * n);
      EXPECT_NEAR(cost(K::kAllReduce, A::kBinomialTree, p, n),
                  2 * lg * a + 2 * lg * n * b + lg * n * g, kTol * n);
      // The seeds' slides: parameter server 2pα + 2pnβ + pnγ.
      EXPECT_NEAR(cost(K::kAllReduce, A::kParameterServer, p, n),
                  2 * P * a + 2 * P * n * b + P * n * g, kTol * n);
    }
  }
}

TEST(CollectiveCost, NonPowerOfTwoRows) {
  const double a = kLink.alpha, b = kLink.beta, g = kLink.gamma;
  const int64_t p = 6;
  const double P = 6, n = 1e6, fl = 2;  // floor(lg 6)
  EXPECT_NEAR(cost(K::kAllReduce, A::kRabenseifner, p, n),
              (2 * fl + 2) * a + (2 * (P - 1) / P + 2) * n * b + n * (1 + (P - 1) / P) * g,
              kTol * n);
  EXPECT_NEAR(cost(K::kAllReduce, A::kRecursiveDoubling, p, n),
              (fl + 2) * a + (fl + 2) * n * b + (fl + 1) * n * g, kTol * n);
  // Ring needs no power of two.
  EXPECT_NEAR(cost(K::kAllGather, A::kRing, p, n), (P - 1) * a + (P - 1) / P * n * b, kTol * n);
}

TEST(CollectiveCost, OtherCollectives) {
  const double a = kLink.alpha, b = kLink.beta, g = kLink.gamma;
  const int64_t p = 8;
  const double P = 8, lg = 3, n = 4e6;
  EXPECT_NEAR(cost(K::kReduceScatter, A::kRing, p, n), (P - 1) * a + (P - 1) / P * n * (b + g),
              kTol * n);
  EXPECT_NEAR(cost(K::kReduceScatter, A::kRecursiveDoubling, p, n),
              lg * a + (P - 1) / P * n * (b + g), kTol * n);
  EXPECT_NEAR(cost(K::kAllGather, A::kRecursiveDoubling, p, n), lg * a + (P - 1) / P * n * b,
              kTol * n);
  EXPECT_NEAR(cost(K::kBroadcast, A::kBinomialTree, p, n), lg * a + n * lg * b, kTol * n);
  EXPECT_NEAR(cost(K::kBroadcast, A::kRabenseifner, p, n), 2 * lg * a + 2 * (P - 1) / P * n * b,
              kTol * n);
  EXPECT_NEAR(cost(K::kReduce, A::kBinomialTree, p, n), lg * a + n * lg * b + n * lg * g, kTol * n);
  EXPECT_NEAR(cost(K::kAllToAll, A::kPairwise, p, n), (P - 1) * a + (P - 1) / P * n * b, kTol * n);
  EXPECT_NEAR(cost(K::kAllToAll, A::kRecursiveDoubling, p, n), lg * a + n / 2 * lg * b, kTol * n);
  EXPECT_NEAR(cost(K::kSendRecv, A::kPairwise, 2, n), a + n * b, kTol * n);
  EXPECT_EQ(cost(K::kAllReduce, A::kRing, 1, n), 0.0);
}

TEST(CollectiveModel, AutomaticChoiceIsTheCheapestFormula) {
  spec::ClusterSpec c = test::ideal_cluster(100, 200, 25, 5);
  CollectiveModel model(c, {});
  for (GroupShape shape : {GroupShape{8, 1, 8}, GroupShape{16, 2, 8}, GroupShape{64, 64, 1}}) {
    for (int64_t bytes : {int64_t{8}, int64_t{1} << 16, int64_t{1} << 28}) {
      for (K kind : {K::kAllReduce, K::kReduceScatter, K::kAllGather, K::kBroadcast}) {
        CollectiveCost best = model.cheapest(kind, bytes, shape);
        for (A a : flat_algorithms(kind))
          EXPECT_LE(best.seconds(), model.cost_of(kind, a, bytes, shape).seconds() * (1 + 1e-12));
      }
    }
  }
  // Small messages on many ranks go to a logarithmic algorithm, large ones to a bandwidth-optimal
  // one (ring or Rabenseifner).
  GroupShape wide{64, 64, 1};
  EXPECT_NE(model.cheapest(K::kAllReduce, 8, wide).algorithm, A::kRing);
  A large = model.cheapest(K::kAllReduce, int64_t{1} << 30, wide).algorithm;
  EXPECT_TRUE(large == A::kRing || large == A::kRabenseifner);
}

TEST(CollectiveModel, HierarchicalAllReduceOnTwoLevels) {
  spec::ClusterSpec c = test::ideal_cluster(100, 200, 25, 3);
  CollectiveModel model(c, {});
  const double n = 64e6;
  // 2 nodes x 4 ranks: ring reduce-scatter in the node (4 ranks, NVLink), ring all-reduce of the
  // n/4 shard across the 2 nodes (one NIC per local rank), ring all-gather in the node.
  const AlphaBetaGamma intra{3e-6, 1 / 200e9, 1 / 1e21};
  const AlphaBetaGamma inter{3e-6, 1 / 25e9, 1 / 1e21};
  double expected =
      (3 * intra.alpha + 0.75 * n * (intra.beta + intra.gamma)) +
      (2 * inter.alpha + 2 * 0.5 * (n / 4) * inter.beta + 0.5 * (n / 4) * inter.gamma) +
      (3 * intra.alpha + 0.75 * n * intra.beta);
  double got =
      model.cost_of(K::kAllReduce, A::kHierarchical, static_cast<int64_t>(n), {8, 2, 4}).seconds();
  EXPECT_NEAR(got, expected, 1e-9 * expected);
}

TEST(CollectiveModel, MultiChannelRingUsesEveryRailNic) {
  // 8 ranks per node, 8 NICs: NCCL's 8 rotated rings each leave through a different NIC, so a
  // rank's bandwidth across nodes is min(8 * nic, 8/7 * nvlink) (A100: 8 x 24 = 192 GB/s,
  // what NCCL maintainers measure on DGX A100).
  spec::ClusterSpec c = test::ideal_cluster(100, 230, 24, 0);
  CollectiveModel model(c, {});
  EXPECT_NEAR(model.inter_node_bandwidth(8), 192e9, 1);
  EXPECT_NEAR(model.inter_node_bandwidth(1), 24e9, 1);
  EXPECT_NEAR(model.inter_node_bandwidth(2), 48e9, 1);
}

TEST(CollectiveModel, NcclModelMatchesPublishedA100BusBandwidth) {
  // Azure ND A100 v4, 8 GPUs, nccl-tests all_reduce_perf at 1 GiB: 228.1 GB/s bus bandwidth
  // (published.md T15c). busbw = (n / t) * 2 (p - 1) / p.
  spec::ClusterSpec c = test::ideal_cluster(312, 230, 24, 2);
  c.network.library = spec::CollectiveLibrary::kNccl;
  CollectiveModel model(c, {});
  const double n = 1073741824;
  CollectiveCost cost = model.cost(K::kAllReduce, static_cast<int64_t>(n), {8, 1, 8});
  double busbw = n / cost.seconds() * 2 * 7 / 8 / 1e9;
  EXPECT_NEAR(busbw, 228.1, 0.05 * 228.1);
  EXPECT_EQ(cost.algorithm, A::kRing);
  EXPECT_EQ(cost.protocol, "Simple");
  // Tiny messages take the low-latency protocol.
  EXPECT_EQ(model.cost(K::kAllReduce, 1024, {8, 1, 8}).protocol, "LL");
  // Across many nodes, mid-size all-reduces go to the tree (log depth beats 2(p-1) hops).
  EXPECT_EQ(model.cost(K::kAllReduce, 1 << 16, {512, 64, 8}).algorithm, A::kDoubleBinaryTree);
}

TEST(CollectiveModel, OverrideAndRejection) {
  spec::ClusterSpec c = test::ideal_cluster();
  CollectiveModel model(c, {{K::kAllReduce, A::kBinomialTree}});
  EXPECT_EQ(model.cost(K::kAllReduce, 1 << 20, {8, 1, 8}).algorithm, A::kBinomialTree);
  CollectiveModel bad(c, {{K::kAllGather, A::kParameterServer}});
  EXPECT_THROW(bad.cost(K::kAllGather, 1 << 20, {8, 1, 8}), InputError);
}

TEST(CollectiveModel, CalibratedFitOverridesTheFormula) {
  spec::ClusterSpec c = test::ideal_cluster();
  c.collective_fits.push_back({"all_reduce", "nvlink", 10.0, 0.001, 0.99, 12});
  CollectiveModel model(c, {});
  // Through the ring formula with p = 8: 2(p-1) α + 2(p-1)/p n β.
  const double expected = (14 * 10.0 + 2 * 7.0 / 8.0 * 1e6 * 0.001) * 1e-6;
  EXPECT_NEAR(model.cost(K::kAllReduce, 1000000, {8, 1, 8}).seconds(), expected, 1e-12);
  // A plan that names recursive doubling gets the fitted α and β through its formula (p = 8, a
  // power of two, no reduction cost in a fit): log2(p) (α + n β) = 3 α + 3 n β.
  CollectiveModel named(c, {{K::kAllReduce, A::kRecursiveDoubling}});
  const CollectiveCost doubling = named.cost(K::kAllReduce, 1000000, {8, 1, 8});
  EXPECT_EQ(doubling.algorithm, A::kRecursiveDoubling);
  EXPECT_NEAR(doubling.seconds(), (3 * 10.0 + 3 * 1e6 * 0.001) * 1e-6, 1e-12);
  CollectiveModel bad(c, {{K::kAllReduce, A::kPairwise}});
  EXPECT_THROW(bad.cost(K::kAllReduce, 1000000, {8, 1, 8}), InputError);
}

// Fits by size range: a message takes the fit with the smallest bound that holds it; one above
// every bound takes the largest. Ring all-reduce at p = 8: 14 α + 1.75 n β.
TEST(CollectiveModel, CalibratedFitsBySizeRange) {
  spec::ClusterSpec c = test::ideal_cluster();
  c.collective_fits.push_back({"all_reduce", "nvlink", 100.0, 0.0001, 0.99, 4, 0});
  c.collective_fits.push_back({"all_reduce", "nvlink", 10.0, 0.001, 0.99, 4, 1 << 20});
  c.collective_fits.push_back({"all_reduce", "nvlink", 1.0, 0.01, 0.99, 4, 1 << 16});
  CollectiveModel model(c, {});
  auto ring = [](double alpha_us, double beta_us, double n) {
    return (14 * alpha_us + 1.75 * n * beta_us) * 1e-6;
  };
  EXPECT_NEAR(model.cost(K::kAllReduce, 1 << 16, {8, 1, 8}).seconds(), ring(1.0, 0.01, 1 << 16),
              1e-12);
  EXPECT_NEAR(model.cost(K::kAllReduce, 1 << 19, {8, 1, 8}).seconds(), ring(10.0, 0.001, 1 << 19),
              1e-12);
  EXPECT_NEAR(model.cost(K::kAllReduce, 1 << 22, {8, 1, 8}).seconds(), ring(100.0, 0.0001, 1 << 22),
              1e-12);
  spec::ClusterSpec bounded = test::ideal_cluster();
  bounded.collective_fits = {c.collective_fits[1], c.collective_fits[2]};
  CollectiveModel capped(bounded, {});
  EXPECT_NEAR(capped.cost(K::kAllReduce, 1 << 22, {8, 1, 8}).seconds(), ring(10.0, 0.001, 1 << 22),
              1e-12);
}

}  // namespace
}  // namespace sextant::sim

namespace sextant::sim {
namespace {

// E[max of p standard normals]: closed forms for 2 and 3 (1/sqrt(pi), 3/(2 sqrt(pi))); for 16
// and 100 Harter's (1961) tabulated 1.7660 and 2.5076 against Blom's approximation (within 1%).
TEST(SyncWait, ExpectedMaximumOfNormals) {
  EXPECT_NEAR(expected_max_of_normals(1), 0.0, 0);
  EXPECT_NEAR(expected_max_of_normals(2), 1 / std::sqrt(M_PI), 1e-4);
  EXPECT_NEAR(expected_max_of_normals(3), 3 / (2 * std::sqrt(M_PI)), 1e-4);
  EXPECT_NEAR(expected_max_of_normals(16), 1.7660, 0.01 * 1.7660);
  EXPECT_NEAR(expected_max_of_normals(100), 2.5076, 0.01 * 2.5076);
}

}  // namespace
}  // namespace sextant::sim
