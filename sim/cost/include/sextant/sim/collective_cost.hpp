// Closed-form α-β-γ costs of collective algorithms (Thakur, Rabenseifner & Gropp, IJHPCA 2005, as
// written in MPICH's source comments; shared/reference/published.md T15b). α: seconds per message,
// β: seconds per byte on a link, γ: seconds per byte reduced. Sizes follow nccl-tests: n is the
// buffer of an all-reduce, broadcast or reduce, and the whole (gathered or scattered) array of an
// all-gather, reduce-scatter or all-to-all.
#pragma once

#include <cstdint>
#include <vector>

#include "sextant/spec/collective.hpp"

namespace sextant::sim {

struct AlphaBetaGamma {
  double alpha = 0;  // s
  double beta = 0;   // s/byte
  double gamma = 0;  // s/byte
};

// A cost split into the part that scales with link bandwidth (the β terms) and the rest (α
// latencies and γ reductions), so that the flow model can share the bandwidth part among
// concurrent transfers.
struct CostTerms {
  double latency = 0;    // s: α and γ terms
  double bandwidth = 0;  // s: β terms
  double total() const { return latency + bandwidth; }
};

// Algorithms the formulas cover for `kind`, in a stable order.
std::vector<spec::CollectiveAlgorithm> flat_algorithms(spec::CollectiveKind kind);
bool supports(spec::CollectiveKind kind, spec::CollectiveAlgorithm algorithm);

// Seconds for `p` ranks and `n` bytes with one (α, β, γ) for every hop. p = 1 costs nothing.
// Precondition: supports(kind, algorithm) and algorithm != kHierarchical.
CostTerms flat_cost(spec::CollectiveKind kind, spec::CollectiveAlgorithm algorithm, int64_t p,
                    double n, const AlphaBetaGamma& link);

// The algorithm whose α and β a calibration fit stands for: ring (pipelined chain for broadcast
// and reduce) for collectives, pairwise for all-to-all and send/recv. A fitted (α, β) then
// predicts every group size through that algorithm's formula.
spec::CollectiveAlgorithm fitted_algorithm(spec::CollectiveKind kind);

// Hierarchical all-reduce on `nodes` nodes of `per_node` ranks: ring reduce-scatter inside each
// node, ring all-reduce of the n/per_node shard across nodes (one per local rank, in parallel),
// ring all-gather inside each node.
CostTerms hierarchical_all_reduce_cost(int64_t per_node, int64_t nodes, double n,
                                       const AlphaBetaGamma& intra, const AlphaBetaGamma& inter);

}  // namespace sextant::sim
