// What every backend shares: typed allocation, the host-clock timing marks and the span-by-span
// optimizer kernels a backend may run in one launch instead.
#include "sextant/exec/backend.hpp"

#include <chrono>

#include "sextant/spec/error.hpp"

namespace sextant::exec {

void QkvLayout::check(const Tensor& qkv) const {
  const int64_t cols = qkv.shape().back(), rows = qkv.numel() / cols;
  SEXTANT_CHECK(cols == width() && rows == batch * seq && kv_heads > 0 && heads % kv_heads == 0,
                "qkv [{} x {}] does not match {} x {} rows of ({} + 2 x {}) heads of {}", rows,
                cols, batch, seq, heads, kv_heads, head_dim);
}

Tensor DeviceMemory::empty(std::vector<int64_t> shape, DType dtype) {
  int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  const int64_t bytes = std::max<int64_t>(n, 1) * element_size(dtype);
  auto buffer = std::make_shared<Buffer>(this, allocate(bytes), bytes);
  return Tensor(std::move(buffer), std::move(shape), dtype);
}

Tensor DeviceMemory::zeros(std::vector<int64_t> shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  fill(t, 0.0f);
  return t;
}

double OptimizerKernels::sum_squares_spans(const Tensor& flat,
                                           const std::vector<std::pair<int64_t, int64_t>>& spans) {
  double s = 0;
  for (auto [offset, count] : spans) s += sum_squares(flat.rows(offset, count));
  return s;
}

void OptimizerKernels::adamw_spans(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v,
                                   const std::vector<AdamwSpan>& spans, int64_t step, float lr,
                                   float beta1, float beta2, float eps, float grad_scale) {
  for (const AdamwSpan& s : spans) {
    Tensor p = params.rows(s.offset, s.count), g = grads.rows(s.offset, s.count);
    Tensor ms = m.rows(s.offset, s.count), vs = v.rows(s.offset, s.count);
    adamw(p, g, ms, vs, step, lr, beta1, beta2, eps, s.weight_decay, grad_scale);
  }
}

namespace {

struct HostMark : DeviceMemory::TimeMark {
  std::chrono::steady_clock::time_point at;
};

}  // namespace

std::unique_ptr<DeviceMemory::TimeMark> DeviceMemory::mark() {
  auto m = std::make_unique<HostMark>();
  m->at = std::chrono::steady_clock::now();
  return m;
}

double DeviceMemory::seconds_between(const TimeMark& from, const TimeMark& to) {
  return std::chrono::duration<double>(static_cast<const HostMark&>(to).at -
                                       static_cast<const HostMark&>(from).at)
      .count();
}

}  // namespace sextant::exec
