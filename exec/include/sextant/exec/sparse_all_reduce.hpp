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

// A sparse message's header word for a dense payload (else the header counts the pairs that
// follow); the words travel as floats, copied bit for bit.
inline constexpr uint32_t kSparseDenseMark = 0xffffffffu;

// Summed pairs as both sparse all-reduces hold and send them: sorted indices and their values, or
// a dense vector. On the wire a header word (kSparseDenseMark or the pairs' count) and a payload
// (the indices, then the values; or the dense values).
struct SparsePairs {
  bool dense = false;
  std::vector<uint32_t> index;  // sparse: sorted
  std::vector<float> value;     // sparse: one per index; dense: every element
  float header() const;
  std::vector<float> payload() const;
  // The payload's words after `header`, a dense one holding `dense_elements`.
  static int64_t payload_words(float header, int64_t dense_elements);
  // Reads `words` of a payload sent after `header`.
  void read(float header, const float* words, int64_t count);
};

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
  using Union = SparsePairs;  // dense: n values
  void go_dense(Union& u) const;

  Communicator* group_;
  int64_t n_;
  Union mine_, theirs_;
};

// SparCML's split all-gather (SSAR/DSAR_Split_allgather, Renggli et al., SC'19 §5.3): the index
// space split into one range per rank (models::sparse_range_begin); each rank sends its pairs in
// range r to rank r, which sums them in rank order into its range -- each element 0 + the
// selecting ranks' values in rank order, the additions top-k's decode does -- and the ranges' sums
// are all-gathered, each as pairs or, once its union is more than half the range, dense. Every
// rank ends bitwise alike; any group size. models::sparse_split_allgather prices the same steps.
class SparseSplitAllGather {
 public:
  // `encoded` as SparseAllReduce's.
  SparseSplitAllGather(Communicator& group, int64_t n, const uint32_t* encoded, int64_t k);

  // Sends each range's pairs to its owner and receives this rank's range's from every rank.
  // Returns the all-to-all's buffer: 8 bytes a pair this rank held.
  int64_t split();
  // Sums the pairs received by split() into this rank's range. Returns the bytes the sum read and
  // wrote (models::sparse_range_merge_bytes).
  int64_t merge();
  // All-gathers every range's sum. Returns the bytes of the gathered sums: 8 a pair, 4 an element
  // of a dense range.
  int64_t gather();
  // The sum: `out` (n elements) written whole, after gather().
  void write(float* out) const;
  // The decode's bytes of write() with `grad_bytes` a gradient element: the gradients written
  // once, each sparse range's pairs read and added, each dense range copied.
  int64_t decode_bytes(int64_t grad_bytes) const;

  // Pairs in this rank's range's sum, and whether it went dense (after merge()).
  int64_t range_pairs() const { return static_cast<int64_t>(sums_[mine()].index.size()); }
  bool range_dense() const { return sums_[mine()].dense; }

 private:
  using Range = SparsePairs;  // dense: the range's elements
  size_t mine() const { return static_cast<size_t>(group_->rank()); }
  int64_t begin(int64_t range) const;

  Communicator* group_;
  int64_t n_;
  std::vector<uint32_t> index_;  // this rank's pairs
  std::vector<float> value_;
  std::vector<float> received_;         // split(): every rank's pairs in this rank's range
  std::vector<int64_t> received_from_;  // words received from each rank
  std::vector<Range> sums_;             // per range: its sum (this rank's after merge(), all after
                                        // gather())
};

}  // namespace sextant::exec
