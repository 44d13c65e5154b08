// Dtype names and sizes.
#include "sextant/spec/dtype.hpp"

#include <array>

namespace sextant::spec {

namespace {
constexpr std::array<std::pair<std::string_view, Dtype>, 5> kDtypes{{{"fp32", Dtype::kFp32},
                                                                     {"tf32", Dtype::kTf32},
                                                                     {"bf16", Dtype::kBf16},
                                                                     {"fp16", Dtype::kFp16},
                                                                     {"fp8", Dtype::kFp8}}};
}  // namespace

EnumNames<Dtype> dtype_names() {
  return kDtypes;
}

int64_t dtype_bytes(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFp32:
    case Dtype::kTf32:
      return 4;
    case Dtype::kBf16:
    case Dtype::kFp16:
      return 2;
    case Dtype::kFp8:
      return 1;
  }
  return 4;
}

}  // namespace sextant::spec
