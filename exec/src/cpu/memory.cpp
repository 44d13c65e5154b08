// Host memory for the CPU backend: blocks from a caching pool, fills, copies and fp32/bf16
// conversions.
#include <algorithm>
#include <cstring>
#include <new>

#include "cpu_backend.hpp"
#include "sextant/spec/error.hpp"
#include "tensor_maps.hpp"

namespace sextant::exec::cpu {

// From the caching pool (the constructor, cpu_backend.cpp, says why).
void* CpuBackend::allocate(int64_t bytes) {
  void* block = pool_.allocate(bytes);
  if (block == nullptr) throw std::bad_alloc();
  return block;
}

void CpuBackend::release(void* data) {
  pool_.release(data);
}

void CpuBackend::fill(Tensor& t, float value) {
  if (t.dtype() == DType::kF32) {
    std::fill(t.data(), t.data() + t.numel(), value);
  } else {
    auto* b = static_cast<uint16_t*>(t.raw());
    std::fill(b, b + t.numel(), to_bf16(value));
  }
}

void CpuBackend::copy_box(const Tensor& from, const Box& held_from, Tensor& to, const Box& held_to,
                          const Box& r, int64_t maps, bool add) {
  if (r.elements() <= 0) return;
  const int64_t from_map = held_from.elements(), to_map = held_to.elements();
  SEXTANT_CHECK(from.numel() >= maps * from_map && to.numel() >= maps * to_map,
                "a box copy over {} maps of {} and {} elements between tensors of {} and {}", maps,
                from_map, to_map, from.numel(), to.numel());
  for (int64_t o = 0; o < maps; ++o)
    for (int64_t d = r.plane_begin; d < r.plane_end; ++d)
      for (int64_t h = r.row_begin; h < r.row_end; ++h) {
        const float* s =
            from.data() + o * from_map +
            ((d - held_from.plane_begin) * held_from.rows() + h - held_from.row_begin) *
                held_from.cols() +
            (r.col_begin - held_from.col_begin);
        float* t =
            to.data() + o * to_map +
            ((d - held_to.plane_begin) * held_to.rows() + h - held_to.row_begin) * held_to.cols() +
            (r.col_begin - held_to.col_begin);
        if (add) {
          for (int64_t w = 0; w < r.cols(); ++w) t[w] += s[w];
        } else {
          std::copy(s, s + r.cols(), t);
        }
      }
}

void CpuBackend::copy(const Tensor& from, Tensor& to) {
  SEXTANT_CHECK(from.numel() == to.numel(), "copy of {} into {} elements", from.numel(),
                to.numel());
  if (from.dtype() == to.dtype()) {
    std::memcpy(to.raw(), from.raw(), static_cast<size_t>(from.bytes()));
  } else if (from.dtype() == DType::kF32) {
    auto* b = static_cast<uint16_t*>(to.raw());
    const float* f = from.data();
    for (int64_t i = 0; i < from.numel(); ++i) b[i] = to_bf16(f[i]);
  } else {
    const auto* b = static_cast<const uint16_t*>(from.raw());
    float* f = to.data();
    for (int64_t i = 0; i < from.numel(); ++i) f[i] = from_bf16(b[i]);
  }
}

void CpuBackend::to_host(const Tensor& t, std::vector<float>& out) {
  if (t.dtype() == DType::kF32) {
    out.assign(t.data(), t.data() + t.numel());
  } else {
    const auto* b = static_cast<const uint16_t*>(t.raw());
    out.resize(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<size_t>(i)] = from_bf16(b[i]);
  }
}

void CpuBackend::from_host(const std::vector<float>& in, Tensor& t) {
  SEXTANT_CHECK(static_cast<int64_t>(in.size()) == t.numel(), "from_host size mismatch");
  if (t.dtype() == DType::kF32) {
    std::copy(in.begin(), in.end(), t.data());
  } else {
    auto* b = static_cast<uint16_t*>(t.raw());
    for (size_t i = 0; i < in.size(); ++i) b[i] = to_bf16(in[i]);
  }
}

void CpuBackend::synchronize() {}

}  // namespace sextant::exec::cpu
