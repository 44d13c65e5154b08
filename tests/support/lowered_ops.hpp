// Looking up a lowered op by name, for tests that count a layer's ops by hand.
#pragma once

#include <string>
#include <vector>

#include "sextant/models/lowering.hpp"

namespace sextant::test {

// The first op named `name` in `ops`, or null.
inline const models::Op* find_op(const std::vector<models::Op>& ops, const std::string& name) {
  for (const models::Op& op : ops)
    if (op.name == name) return &op;
  return nullptr;
}

}  // namespace sextant::test
