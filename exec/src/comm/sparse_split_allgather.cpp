// SparCML's split all-gather: pairs to their range's owner, summed there, the sums all-gathered.
#include <algorithm>
#include <bit>

#include "sextant/exec/sparse_all_reduce.hpp"
#include "sextant/models/gradient_compression.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {

SparseSplitAllGather::SparseSplitAllGather(Communicator& group, int64_t n, const uint32_t* encoded,
                                           int64_t k)
    : group_(&group), n_(n), sums_(static_cast<size_t>(group.size())) {
  SEXTANT_CHECK(n < int64_t{kSparseDenseMark},
                "sparse all-reduce of {} elements: indices are 32-bit", n);
  index_.assign(encoded, encoded + k);
  value_.resize(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j)
    value_[static_cast<size_t>(j)] = std::bit_cast<float>(encoded[k + j]);
}

int64_t SparseSplitAllGather::begin(int64_t range) const {
  return models::sparse_range_begin(n_, group_->size(), range);
}

int64_t SparseSplitAllGather::split() {
  const int p = group_->size();
  // The pairs are sorted by index, so each range's are a run: [cut[r], cut[r + 1]).
  std::vector<size_t> cut(static_cast<size_t>(p) + 1, index_.size());
  for (int r = 0; r < p; ++r)
    cut[static_cast<size_t>(r)] = static_cast<size_t>(
        std::lower_bound(index_.begin(), index_.end(), static_cast<uint32_t>(begin(r))) -
        index_.begin());
  std::vector<int64_t> send(static_cast<size_t>(p));
  std::vector<float> out;
  out.reserve(2 * index_.size());
  for (size_t r = 0; r < static_cast<size_t>(p); ++r) {
    send[r] = 2 * static_cast<int64_t>(cut[r + 1] - cut[r]);
    for (size_t j = cut[r]; j < cut[r + 1]; ++j) out.push_back(std::bit_cast<float>(index_[j]));
    out.insert(out.end(), value_.begin() + static_cast<std::ptrdiff_t>(cut[r]),
               value_.begin() + static_cast<std::ptrdiff_t>(cut[r + 1]));
  }
  received_from_.assign(static_cast<size_t>(p), 0);
  group_->all_to_all_host(send.data(), received_from_.data(), 1);
  int64_t words = 0;
  for (int64_t w : received_from_) words += w;
  received_.resize(static_cast<size_t>(words));
  group_->all_to_all_v(out.data(), send, received_.data(), received_from_);
  return 8 * static_cast<int64_t>(index_.size());
}

int64_t SparseSplitAllGather::merge() {
  const int64_t first = begin(group_->rank()), extent = begin(group_->rank() + 1) - first;
  std::vector<float> sum(static_cast<size_t>(extent), 0.0f);
  std::vector<uint8_t> touched(static_cast<size_t>(extent), 0);
  // Rank by rank, as top-k's decode adds the ranks' pairs to zeroed gradients.
  int64_t received = 0;
  size_t at = 0;
  for (int64_t words : received_from_) {
    const size_t pairs = static_cast<size_t>(words / 2);
    for (size_t j = 0; j < pairs; ++j) {
      const auto i = static_cast<size_t>(std::bit_cast<uint32_t>(received_[at + j]) - first);
      SEXTANT_CHECK(i < sum.size(), "a pair at {} outside range [{}, {})",
                    std::bit_cast<uint32_t>(received_[at + j]), first, first + extent);
      sum[i] += received_[at + pairs + j];
      touched[i] = 1;
    }
    received += static_cast<int64_t>(pairs);
    at += 2 * pairs;
  }
  Range& mine_sum = sums_[mine()];
  const auto held = static_cast<int64_t>(std::count(touched.begin(), touched.end(), 1));
  mine_sum.dense = models::sparse_goes_dense(held, extent);
  if (mine_sum.dense) {
    mine_sum.value = std::move(sum);
  } else {
    for (size_t i = 0; i < touched.size(); ++i) {
      if (!touched[i]) continue;
      mine_sum.index.push_back(static_cast<uint32_t>(first + static_cast<int64_t>(i)));
      mine_sum.value.push_back(sum[i]);
    }
  }
  return models::sparse_range_merge_bytes(extent, received, held, mine_sum.dense);
}

int64_t SparseSplitAllGather::gather() {
  const int p = group_->size();
  // Every range's header first, so that each rank knows the payloads' sizes.
  const float header = sums_[mine()].header();
  std::vector<float> headers(static_cast<size_t>(p));
  group_->all_gather(&header, headers.data(), 1);
  std::vector<int64_t> counts(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r)
    counts[static_cast<size_t>(r)] =
        SparsePairs::payload_words(headers[static_cast<size_t>(r)], begin(r + 1) - begin(r));
  const std::vector<float> out = sums_[mine()].payload();
  int64_t words = 0;
  for (int64_t c : counts) words += c;
  std::vector<float> all(static_cast<size_t>(words));
  group_->all_gather_v(out.data(), all.data(), counts);
  int64_t at = 0;
  for (size_t r = 0; r < static_cast<size_t>(p); ++r) {
    sums_[r].read(headers[r], all.data() + at, counts[r]);
    at += counts[r];
  }
  return 4 * words;
}

void SparseSplitAllGather::write(float* out) const {
  for (size_t r = 0; r < sums_.size(); ++r) {
    const Range& range = sums_[r];
    float* first = out + begin(static_cast<int64_t>(r));
    if (range.dense) {
      std::copy(range.value.begin(), range.value.end(), first);
      continue;
    }
    std::fill(first, out + begin(static_cast<int64_t>(r) + 1), 0.0f);
    for (size_t j = 0; j < range.index.size(); ++j) out[range.index[j]] = range.value[j];
  }
}

int64_t SparseSplitAllGather::decode_bytes(int64_t grad_bytes) const {
  int64_t bytes = n_ * grad_bytes;
  for (size_t r = 0; r < sums_.size(); ++r) {
    const Range& range = sums_[r];
    bytes += range.dense ? 4 * (begin(static_cast<int64_t>(r) + 1) - begin(static_cast<int64_t>(r)))
                         : static_cast<int64_t>(range.index.size()) * (8 + 2 * grad_bytes);
  }
  return bytes;
}

}  // namespace sextant::exec
