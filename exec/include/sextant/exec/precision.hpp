// How an executor backend stores tensors and multiplies matrices: spec::ExecutorPrecision, whose
// rules (what each backend runs in which precision) are spec/executor_support.hpp's.
#pragma once

#include "sextant/spec/executor_kind.hpp"

namespace sextant::exec {

using Precision = spec::ExecutorPrecision;

inline const char* precision_name(Precision p) {
  return spec::executor_precision_name(p);
}

}  // namespace sextant::exec
