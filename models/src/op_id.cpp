// The op name table.
#include "sextant/models/op_id.hpp"

#include <array>

#include "sextant/spec/error.hpp"

namespace sextant::models {

namespace {

constexpr size_t kFixedCount = [] {
  size_t n = 0;
#define SEXTANT_OP_COUNT(id, text) ++n;
  SEXTANT_FIXED_OPS(SEXTANT_OP_COUNT)
#undef SEXTANT_OP_COUNT
  return n;
}();

constexpr std::array<std::string_view, static_cast<size_t>(OpId::kCount)> kTexts = {
#define SEXTANT_OP_TEXT(id, text) std::string_view(text),
    SEXTANT_FIXED_OPS(SEXTANT_OP_TEXT) SEXTANT_SCOPED_OPS(SEXTANT_OP_TEXT)
#undef SEXTANT_OP_TEXT
};

size_t index_of(OpId id) {
  const auto i = static_cast<size_t>(id);
  SEXTANT_CHECK(i < kTexts.size(), "op id {} out of range", i);
  return i;
}

}  // namespace

bool op_is_scoped(OpId id) {
  return index_of(id) >= kFixedCount;
}

std::string_view op_text(OpId id) {
  return kTexts[index_of(id)];
}

const std::string& op_name(OpId id) {
  // Built once: call sites compare and copy these names on every micro-batch.
  static const std::array<std::string, kFixedCount> names = [] {
    std::array<std::string, kFixedCount> out;
    for (size_t i = 0; i < kFixedCount; ++i) out[i] = std::string(kTexts[i]);
    return out;
  }();
  SEXTANT_CHECK(!op_is_scoped(id), "op {} is scoped: it needs its unit's name",
                kTexts[index_of(id)]);
  return names[index_of(id)];
}

spec::Stream offload_stream(OpId id) {
  switch (id) {
    case OpId::kOffloadParamsToDevice:
    case OpId::kOffloadActivationsToDevice:
      return spec::Stream::kOffloadIn;
    case OpId::kOffloadGradToHost:
    case OpId::kOffloadAdamw:
    case OpId::kOffloadParamsToNvme:
    case OpId::kOffloadActivationsToHost:
      return spec::Stream::kOffload;
    default:
      SEXTANT_CHECK(false, "op {} is not an offload op", op_text(id));
  }
  return spec::Stream::kOffload;  // (unreachable)
}

const GridLinearOps& grid_linear_ops(OpId product) {
  for (const GridLinearOps* ops : {&kGridQkv, &kGridProj, &kGridFc1, &kGridFc2})
    if (ops->product == product) return *ops;
  SEXTANT_CHECK(false, "op {} is not a linear layer of a tensor grid", op_text(product));
  return kGridQkv;
}

OpName::OpName(OpId id) : id_(id), name_(op_name(id)) {}

OpName::OpName(std::string_view scope, OpId id) : id_(id) {
  SEXTANT_CHECK(op_is_scoped(id), "op {} is fixed: it takes no scope (\"{}\")", op_text(id), scope);
  SEXTANT_CHECK(!scope.empty(), "scoped op .{} needs its unit's name", op_text(id));
  name_ = std::string(scope);
  if (!op_text(id).empty()) {
    name_ += '.';
    name_ += op_text(id);
  }
}

}  // namespace sextant::models
