// Numeric formats of tensors and the bytes each element takes.
#pragma once

#include <cstdint>

#include "sextant/spec/json_reader.hpp"

namespace sextant::spec {

enum class Dtype { kFp32, kTf32, kBf16, kFp16, kFp8 };
EnumNames<Dtype> dtype_names();

// Bytes per element as stored in memory (tf32 is stored as fp32).
int64_t dtype_bytes(Dtype dtype);

}  // namespace sextant::spec
