// Ranks that reach a collective at different times: the first wait for the last.
#pragma once

#include <cstdint>

namespace sextant::sim {

// Expected maximum of p independent standard normal variables, E[max] (order statistics; Harter
// 1961 tables: 0.5642 for 2, 0.8463 for 3, 1.0294 for 4, 1.4236 for 8), so that p ranks whose
// compute segments of mean S vary with standard deviation j*S arrive at a collective, on average,
// j * S * e(p) after their mean. Beyond the table, Blom's (1958) approximation (within 0.5%).
double expected_max_of_normals(int64_t p);

}  // namespace sextant::sim
