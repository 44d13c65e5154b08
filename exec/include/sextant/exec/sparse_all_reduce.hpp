// SparCML's sparse all-reduce (Renggli, Ashkboos, Aghagolzadeh, Alistarh & Hoefler, "SparCML:
// High-Performance Sparse Communication for Machine Learning", SC'19): each rank holds top-k
// (index, value) pairs of a vector of n elements; in round r it swaps its pairs with the rank
// whose index in the group differs in bit r and merges them, summing the values of shared indices
// (SSAR_Recursive_double). Once a rank's union holds more than n / 2 pairs -- 8 bytes each against
// 4 for a dense element -- it goes dense (DSAR's switch). After log2(p) rounds every rank holds the
// sum of all ranks' pairs, bitwise alike: each merge adds two partners' values, the same two on
// both sides. models::sparse_all_reduce_rounds prices the same rounds.
#pragma once

#include <cstdint>
#include <vector>

#include "sextant/exec/communicator.hpp"

namespace sextant::exec {

class SparseAllReduce {
 public:
  // `encoded`: k sorted, distinct indices below n, then their k values, as top-k encodes them
  // (models::encoded_words). The group's size must be a power of two (spec::sparcml_problem).
  SparseAllReduce(Communicator& group, int64_t n, const uint32_t* encoded, int64_t k);

  // Round `round`: sends this rank's union to its partner and receives the partner's. Returns the
  // bytes sent (8 a pair, or 4 an element once dense).
  int64_t exchange(int round);
  // Merges the partner's union received by the last exchange into this rank's. Returns the bytes
  // read and written (both unions and the merged one; three dense vectors once either is dense).
  int64_t merge();
  // The sum: `out` (n elements) zeroed and the union's values written at their indices.
  void write(float* out) const;

  // This rank's union: its pairs (while sparse) and whether it went dense.
  int64_t pairs() const { return static_cast<int64_t>(mine_.index.size()); }
  bool dense() const { return mine_.dense; }
  // log2 of the group's size.
  int rounds() const;

 private:
  struct Union {
    bool dense = false;
    std::vector<uint32_t> index;  // sparse: sorted
    std::vector<float> value;     // sparse: one per index; dense: n
  };
  void go_dense(Union& u) const;

  Communicator* group_;
  int64_t n_;
  Union mine_, theirs_;
};

}  // namespace sextant::exec
