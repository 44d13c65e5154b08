// How unevenly a dropless mixture of experts loads its expert-parallel ranks: the routed copies
// the most loaded of the ep ranks receives in a micro-batch, over the mean. The slowest rank
// gates the dispatch and combine all-to-alls and computes the most rows, so the lowering prices
// those ops at this factor (models::Op::load_factor). One home for the lowering's rule.
//
// Without a measured skew (spec::MoeSpec::load_imbalance) it is the floor that routing at random
// gives: each rank sends its c = tokens x top_k copies, each to a uniformly chosen ep rank, so the
// n ranks' receipts are multinomial with mean c, and their deviations are sqrt(c) (Z_i - mean Z)
// for iid standard normals Z (to the normal approximation), whose largest is expected at
// c + sqrt(c) e_n, e_n the expected maximum of n standard normals (order statistics: David and
// Nagaraja, "Order Statistics", 3rd ed., 2003, §4.2; e_2 = 1/sqrt(pi), e_3 = 3/(2 sqrt(pi))).
// A trained router is skewed beyond that floor: the floor is a lower bound, not a prediction.
#pragma once

#include <cstdint>

#include "sextant/spec/model_spec.hpp"

namespace sextant::models {

// E[max of n iid standard normals], by quadrature of n x phi(x) Phi(x)^(n-1); 0 for n = 1.
double expected_max_standard_normal(int64_t n);

// The most loaded ep rank's routed copies over the mean when each of `ep` ranks routes `copies`
// copies (tokens x top_k): the model's load_imbalance, or the random-routing floor
// 1 + e_ep / sqrt(copies); 1 without expert parallelism or with a capacity (the experts' inputs
// are padded to it: every rank computes and exchanges the same rows).
double moe_load_factor(const spec::MoeSpec& moe, int64_t copies, int64_t ep);

}  // namespace sextant::models
