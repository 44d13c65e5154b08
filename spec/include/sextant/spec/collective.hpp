// Names shared by the simulator, the executor and the traces: collective operations and the
// algorithms that implement them (the enums: collective_kinds.hpp).
#pragma once

#include "sextant/spec/collective_kinds.hpp"
#include "sextant/spec/json_reader.hpp"

namespace sextant::spec {

EnumNames<CollectiveKind> collective_kind_names();
EnumNames<CollectiveAlgorithm> collective_algorithm_names();

}  // namespace sextant::spec
