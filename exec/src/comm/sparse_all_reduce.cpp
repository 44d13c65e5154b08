// SparCML's sparse all-reduce by recursive doubling with the switch to dense.
#include "sextant/exec/sparse_all_reduce.hpp"

#include <algorithm>
#include <bit>
#include <limits>

#include "sextant/models/gradient_compression.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {

namespace {

// A message is a header word (kSparseDenseMark or the pairs' count), then the indices and the
// values, or the dense values.
// Tags of the exchange on the replicas' communicator (its other traffic is collective).
constexpr int kHeaderTag = 0x5c00;
constexpr int kPayloadTag = 0x5c01;

}  // namespace

float SparsePairs::header() const {
  return std::bit_cast<float>(dense ? kSparseDenseMark : static_cast<uint32_t>(index.size()));
}

std::vector<float> SparsePairs::payload() const {
  if (dense) return value;
  std::vector<float> out;
  out.reserve(2 * index.size());
  for (uint32_t i : index) out.push_back(std::bit_cast<float>(i));
  out.insert(out.end(), value.begin(), value.end());
  return out;
}

int64_t SparsePairs::payload_words(float header, int64_t dense_elements) {
  const uint32_t h = std::bit_cast<uint32_t>(header);
  return h == kSparseDenseMark ? dense_elements : 2 * int64_t{h};
}

void SparsePairs::read(float header, const float* words, int64_t count) {
  dense = std::bit_cast<uint32_t>(header) == kSparseDenseMark;
  index.clear();
  if (dense) {
    value.assign(words, words + count);
    return;
  }
  const int64_t pairs = count / 2;
  for (int64_t j = 0; j < pairs; ++j) index.push_back(std::bit_cast<uint32_t>(words[j]));
  value.assign(words + pairs, words + count);
}

SparseAllReduce::SparseAllReduce(Communicator& group, int64_t n, const uint32_t* encoded, int64_t k)
    : group_(&group), n_(n) {
  SEXTANT_CHECK(std::has_single_bit(static_cast<unsigned>(group.size())),
                "SparCML's recursive doubling over {} ranks: needs a power of two", group.size());
  SEXTANT_CHECK(n < int64_t{kSparseDenseMark},
                "sparse all-reduce of {} elements: indices are 32-bit", n);
  mine_.index.assign(encoded, encoded + k);
  mine_.value.resize(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j)
    mine_.value[static_cast<size_t>(j)] = std::bit_cast<float>(encoded[k + j]);
  if (models::sparse_goes_dense(k, n)) go_dense(mine_);
}

int SparseAllReduce::rounds() const {
  return std::countr_zero(static_cast<unsigned>(group_->size()));
}

void SparseAllReduce::go_dense(Union& u) const {
  if (u.dense) return;
  std::vector<float> values(static_cast<size_t>(n_), 0.0f);
  for (size_t j = 0; j < u.index.size(); ++j) values[u.index[j]] = u.value[j];
  u.value = std::move(values);
  u.index.clear();
  u.dense = true;
}

int64_t SparseAllReduce::exchange(int round) {
  const int partner = group_->rank() ^ (1 << round);
  const std::vector<float> out = mine_.payload();
  const float header = mine_.header();
  auto sent_header = group_->send(&header, 1, partner, kHeaderTag);
  auto sent_payload =
      group_->send(out.data(), static_cast<int64_t>(out.size()), partner, kPayloadTag);
  float their_header = 0;
  group_->recv(&their_header, 1, partner, kHeaderTag);
  const int64_t words = SparsePairs::payload_words(their_header, n_);
  std::vector<float> in(static_cast<size_t>(words));
  group_->recv(in.data(), words, partner, kPayloadTag);
  sent_header->wait();
  sent_payload->wait();
  theirs_.read(their_header, in.data(), words);
  return 4 * static_cast<int64_t>(out.size());
}

int64_t SparseAllReduce::merge() {
  if (mine_.dense || theirs_.dense) {
    // Dense: both as vectors (absent indices 0), summed elementwise -- the same sum on both
    // partners, whichever was dense.
    go_dense(mine_);
    go_dense(theirs_);
    for (int64_t i = 0; i < n_; ++i)
      mine_.value[static_cast<size_t>(i)] += theirs_.value[static_cast<size_t>(i)];
    return 3 * 4 * n_;
  }
  // Sparse: the sorted indices merged, the values of shared ones summed.
  const size_t a = mine_.index.size(), b = theirs_.index.size();
  Union merged;
  merged.index.reserve(a + b);
  merged.value.reserve(a + b);
  size_t i = 0, j = 0;
  while (i < a || j < b) {
    if (j == b || (i < a && mine_.index[i] < theirs_.index[j])) {
      merged.index.push_back(mine_.index[i]);
      merged.value.push_back(mine_.value[i++]);
    } else if (i == a || theirs_.index[j] < mine_.index[i]) {
      merged.index.push_back(theirs_.index[j]);
      merged.value.push_back(theirs_.value[j++]);
    } else {
      merged.index.push_back(mine_.index[i]);
      merged.value.push_back(mine_.value[i++] + theirs_.value[j++]);
    }
  }
  const int64_t bytes = 8 * static_cast<int64_t>(a + b + merged.index.size());
  mine_ = std::move(merged);
  if (models::sparse_goes_dense(pairs(), n_)) go_dense(mine_);
  return bytes;
}

void SparseAllReduce::write(float* out) const {
  if (mine_.dense) {
    std::copy(mine_.value.begin(), mine_.value.end(), out);
    return;
  }
  std::fill(out, out + n_, 0.0f);
  for (size_t j = 0; j < mine_.index.size(); ++j) out[mine_.index[j]] = mine_.value[j];
}

}  // namespace sextant::exec
