// Collectives built from MPI point-to-point messages, one named algorithm each, so that a plan's
// `collective_algorithms` run as the simulator prices them (sim/cost/src/collective_cost.cpp)
// instead of as MPI's library picks (which ones run: spec::executor_runs_collective).
// Sources: Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
// MPICH" (IJHPCA 2005): recursive doubling and halving, Rabenseifner's all-reduce, binomial trees,
// pairwise exchange, and the step that folds a group of p ranks into the largest power of two below
// it; Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations"
// (JPDC 2009): the ring. Every rank of a group ends with bitwise the same values: each sum is taken
// once, in one order, and sent on.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sextant/spec/collective_kinds.hpp"

namespace sextant::exec::p2p {

struct Group {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
};

// The elements a collective moves: their size, and for reductions how one is added into another
// (inout[i] = in[i] op inout[i]; commutative, as every reduction here is).
struct Elements {
  size_t bytes = 4;
  void (*combine)(const std::byte* in, std::byte* inout, int64_t n) = nullptr;
};
Elements float_sum();
Elements float_max();
Elements double_sum();
Elements bf16_sum();  // the sum in fp32, rounded once to bf16 (as the MPI op of mpi_communicator)
Elements plain(size_t bytes);  // moved, never reduced

// In place over `data`, blocks of `counts` elements one after another, one per rank: afterwards
// block `g.rank` holds the reduction of every rank's block `g.rank` (the others are scratch).
// Ring and pairwise for any group; recursive_doubling (recursive halving) for a power of two.
void reduce_scatter(const Group& g, spec::CollectiveAlgorithm algorithm, std::byte* data,
                    const std::vector<int64_t>& counts, const Elements& e);
// In place: block `g.rank` holds this rank's part before; every block, every rank's after. Ring
// for any group; recursive_doubling for a power of two.
void all_gather(const Group& g, spec::CollectiveAlgorithm algorithm, std::byte* data,
                const std::vector<int64_t>& counts, const Elements& e);
// In place over n elements: ring, recursive_doubling, rabenseifner or binomial_tree.
void all_reduce(const Group& g, spec::CollectiveAlgorithm algorithm, std::byte* data, int64_t n,
                const Elements& e);
// Pairwise exchange: block j of `in` (send[j] elements) goes to rank j, block j of `out`
// (recv[j]) comes from rank j.
void all_to_all(const Group& g, const std::byte* in, const std::vector<int64_t>& send,
                std::byte* out, const std::vector<int64_t>& recv, const Elements& e);
// Binomial tree from `root`.
void broadcast(const Group& g, std::byte* data, int64_t n, int root, const Elements& e);

}  // namespace sextant::exec::p2p
