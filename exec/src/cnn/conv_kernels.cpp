// CNN kernels on host fp32 tensors: im2col + Eigen GEMMs, plain loops for the rest; sums in double
// so that a layout's summation order barely moves them.
#include "sextant/exec/conv_kernels.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "conv_geometry.hpp"
#include "core/eigen_maps.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec::conv {

namespace {

using namespace eigen;  // NOLINT(google-build-using-namespace): eigen_maps.hpp

// col[((c kd + a) kh + i) kw + j, (od Ho + oh) Wo + ow] = x[c, od sd + a, oh sh + i, ow sw + j] for
// one sample.
void im2col(const float* x, const WindowDims& g, float* col) {
  const int64_t outputs = g.out.voxels();
  int64_t row = 0;
  for (int64_t c = 0; c < g.in.c; ++c)
    for (int64_t a = 0; a < g.kd; ++a)
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t j = 0; j < g.kw; ++j, ++row) {
          float* dst = col + row * outputs;
          for (int64_t od = 0; od < g.out.d; ++od)
            for (int64_t oh = 0; oh < g.out.h; ++oh) {
              const float* src =
                  x + ((c * g.in.d + od * g.sd + a) * g.in.h + oh * g.sh + i) * g.in.w + j;
              float* out = dst + (od * g.out.h + oh) * g.out.w;
              for (int64_t ow = 0; ow < g.out.w; ++ow) out[ow] = src[ow * g.sw];
            }
        }
}

// The adjoint of im2col: adds each column entry back into its input element.
void col2im_add(const float* col, const WindowDims& g, float* x) {
  const int64_t outputs = g.out.voxels();
  int64_t row = 0;
  for (int64_t c = 0; c < g.in.c; ++c)
    for (int64_t a = 0; a < g.kd; ++a)
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t j = 0; j < g.kw; ++j, ++row) {
          const float* src = col + row * outputs;
          for (int64_t od = 0; od < g.out.d; ++od)
            for (int64_t oh = 0; oh < g.out.h; ++oh) {
              float* dst = x + ((c * g.in.d + od * g.sd + a) * g.in.h + oh * g.sh + i) * g.in.w + j;
              const float* in = src + (od * g.out.h + oh) * g.out.w;
              for (int64_t ow = 0; ow < g.out.w; ++ow) dst[ow * g.sw] += in[ow];
            }
        }
}

// A 1x1 window of stride 1 reads its input as it lies: the column matrix is the sample itself.
bool pointwise(const WindowDims& g) {
  return g.taps() == 1 && g.sd == 1 && g.sh == 1 && g.sw == 1;
}

// The bins of adaptive average pooling along one axis (PyTorch's start_index / end_index).
spec::Rows bin(int64_t i, int64_t extent, int64_t out) {
  return {i * extent / out, ((i + 1) * extent + out - 1) / out};
}

}  // namespace

int64_t valid_output(int64_t extent, int64_t kernel, int64_t stride) {
  return (extent - kernel) / stride + 1;
}

MapDims map_dims(const Tensor& t) {
  const size_t n = t.shape().size();
  SEXTANT_CHECK(n == 4 || n == 5,
                "a feature map is [B, C, H, W] or [B, C, D, H, W], got {} dimensions", n);
  if (n == 4) return {t.dim(0), t.dim(1), 1, t.dim(2), t.dim(3), false};
  return {t.dim(0), t.dim(1), t.dim(2), t.dim(3), t.dim(4), true};
}
std::string describe(const MapDims& d) {
  return d.volume ? fmt::format("[{}, {}, {}, {}, {}]", d.b, d.c, d.d, d.h, d.w)
                  : fmt::format("[{}, {}, {}, {}]", d.b, d.c, d.h, d.w);
}

namespace {

WindowDims checked_window(const Tensor& x, const Tensor& y, int64_t kd, int64_t kh, int64_t kw,
                          int64_t sd, int64_t sh, int64_t sw, int64_t out_channels) {
  const MapDims in = map_dims(x), out = map_dims(y);
  WindowDims g{in, out, kd, kh, kw, sd, sh, sw};
  SEXTANT_CHECK(
      kd > 0 && kh > 0 && kw > 0 && sd > 0 && sh > 0 && sw > 0 && in.volume == out.volume &&
          out.b == in.b && out.c == out_channels && out.d == valid_output(in.d, kd, sd) &&
          out.h == valid_output(in.h, kh, sh) && out.w == valid_output(in.w, kw, sw),
      "window {}x{}/{}x{} over {} cannot make {}", kh, kw, sh, sw, describe(in), describe(out));
  return g;
}

}  // namespace

WindowDims window_dims(const Tensor& x, const Tensor& y, int64_t k, int64_t s,
                       int64_t out_channels) {
  const bool volume = map_dims(x).volume;
  return checked_window(x, y, volume ? k : 1, k, k, volume ? s : 1, s, s, out_channels);
}

WindowDims window_dims(const Tensor& x, const Tensor& y, int64_t kh, int64_t kw, int64_t sh,
                       int64_t sw, int64_t out_channels) {
  SEXTANT_CHECK(!map_dims(x).volume, "a {} x {} window over a volume {}", kh, kw,
                describe(map_dims(x)));
  return checked_window(x, y, 1, kh, kw, 1, sh, sw, out_channels);
}

void check_weight(const Tensor& w, const WindowDims& g, int64_t outer, int64_t inner) {
  const std::vector<int64_t> window =
      g.in.volume ? std::vector<int64_t>{g.kd, g.kh, g.kw} : std::vector<int64_t>{g.kh, g.kw};
  bool ok = w.shape().size() == 2 + window.size() && w.dim(0) == outer && w.dim(1) == inner;
  for (size_t i = 0; ok && i < window.size(); ++i) ok = w.dim(2 + i) == window[i];
  SEXTANT_CHECK(ok,
                "a weight of shape {} does not match {} x {} channels and a window of {} over {}",
                fmt::join(w.shape(), "x"), outer, inner, fmt::join(window, "x"), describe(g.in));
}

namespace {

// The window of a convolution weight [O, I, kh, kw] (or a volume's [O, I, k, k, k]) at `stride`.
WindowDims weight_window(const Tensor& x, const Tensor& y, const Tensor& w, Strides stride) {
  SEXTANT_CHECK(w.shape().size() >= 4, "a convolution weight of {} dimensions", w.shape().size());
  if (map_dims(x).volume) {
    SEXTANT_CHECK(stride.rows == stride.cols, "a volume's window takes one stride, not {} x {}",
                  stride.rows, stride.cols);
    return window_dims(x, y, w.dim(2), stride.rows, w.dim(0));
  }
  return window_dims(x, y, w.dim(2), w.dim(3), stride.rows, stride.cols, w.dim(0));
}

}  // namespace

void convolution(const Tensor& x, const Tensor& w, const Tensor* bias, int64_t stride, Tensor& y) {
  convolution(x, w, bias, Strides{stride, stride}, y);
}

void convolution(const Tensor& x, const Tensor& w, const Tensor* bias, Strides stride, Tensor& y) {
  const WindowDims g = weight_window(x, y, w, stride);
  check_weight(w, g, g.out.c, g.in.c);
  const int64_t rows = g.in.c * g.taps(), outputs = g.out.voxels();
  std::vector<float> col(pointwise(g) ? 0 : static_cast<size_t>(rows * outputs));
  ConstMap wm(w.data(), g.out.c, rows);
  for (int64_t b = 0; b < g.in.b; ++b) {
    const float* xb = x.data() + b * g.in.c * g.in.voxels();
    if (!pointwise(g)) im2col(xb, g, col.data());
    ConstMap cm(pointwise(g) ? xb : col.data(), rows, outputs);
    Map yb(y.data() + b * g.out.c * outputs, g.out.c, outputs);
    yb.noalias() = wm * cm;
    if (bias != nullptr)
      for (int64_t o = 0; o < g.out.c; ++o) yb.row(o).array() += bias->data()[o];
  }
}

void convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy, int64_t stride,
                          Tensor* dx, Tensor& dw, Tensor* db) {
  convolution_backward(x, w, dy, Strides{stride, stride}, dx, dw, db);
}

void convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Strides stride,
                          Tensor* dx, Tensor& dw, Tensor* db) {
  const WindowDims g = weight_window(x, dy, w, stride);
  check_weight(w, g, g.out.c, g.in.c);
  const int64_t rows = g.in.c * g.taps(), outputs = g.out.voxels();
  std::vector<float> col(pointwise(g) ? 0 : static_cast<size_t>(rows * outputs));
  std::vector<float> dcol(static_cast<size_t>(rows * outputs));
  ConstMap wm(w.data(), g.out.c, rows);
  Map dwm(dw.data(), g.out.c, rows);
  if (dx != nullptr) std::fill(dx->data(), dx->data() + dx->numel(), 0.0f);
  for (int64_t b = 0; b < g.in.b; ++b) {
    const float* xb = x.data() + b * g.in.c * g.in.voxels();
    if (!pointwise(g)) im2col(xb, g, col.data());
    ConstMap cm(pointwise(g) ? xb : col.data(), rows, outputs);
    ConstMap dyb(dy.data() + b * g.out.c * outputs, g.out.c, outputs);
    dwm.noalias() += dyb * cm.transpose();
    if (db != nullptr)
      for (int64_t o = 0; o < g.out.c; ++o) db->data()[o] += dyb.row(o).sum();
    if (dx != nullptr) {
      Map dcm(dcol.data(), rows, outputs);
      dcm.noalias() = wm.transpose() * dyb;
      float* dxb = dx->data() + b * g.in.c * g.in.voxels();
      if (pointwise(g)) {
        std::copy(dcol.begin(), dcol.end(), dxb);
      } else {
        col2im_add(dcol.data(), g, dxb);
      }
    }
  }
}

void transposed_convolution(const Tensor& x, const Tensor& w, int64_t stride, Tensor& y) {
  // The window slides over y, the map the adjoint convolution would read, making x.
  const WindowDims g = window_dims(y, x, w.dim(2), stride, w.dim(0));
  check_weight(w, g, g.out.c, g.in.c);
  const int64_t rows = g.in.c * g.taps(), outputs = g.out.voxels();
  std::vector<float> col(static_cast<size_t>(rows * outputs));
  ConstMap wm(w.data(), g.out.c, rows);
  std::fill(y.data(), y.data() + y.numel(), 0.0f);
  for (int64_t b = 0; b < g.in.b; ++b) {
    ConstMap xb(x.data() + b * g.out.c * outputs, g.out.c, outputs);
    Map cm(col.data(), rows, outputs);
    cm.noalias() = wm.transpose() * xb;
    float* yb = y.data() + b * g.in.c * g.in.voxels();
    if (pointwise(g)) {
      std::copy(col.begin(), col.end(), yb);
    } else {
      col2im_add(col.data(), g, yb);
    }
  }
}

void transposed_convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                     int64_t stride, Tensor* dx, Tensor& dw) {
  const WindowDims g = window_dims(dy, x, w.dim(2), stride, w.dim(0));
  check_weight(w, g, g.out.c, g.in.c);
  const int64_t rows = g.in.c * g.taps(), outputs = g.out.voxels();
  std::vector<float> col(pointwise(g) ? 0 : static_cast<size_t>(rows * outputs));
  ConstMap wm(w.data(), g.out.c, rows);
  Map dwm(dw.data(), g.out.c, rows);
  for (int64_t b = 0; b < g.in.b; ++b) {
    const float* dyb = dy.data() + b * g.in.c * g.in.voxels();
    if (!pointwise(g)) im2col(dyb, g, col.data());
    ConstMap cm(pointwise(g) ? dyb : col.data(), rows, outputs);
    ConstMap xb(x.data() + b * g.out.c * outputs, g.out.c, outputs);
    dwm.noalias() += xb * cm.transpose();
    if (dx != nullptr) {
      Map dxb(dx->data() + b * g.out.c * outputs, g.out.c, outputs);
      dxb.noalias() = wm * cm;
    }
  }
}

namespace {

// The kept map's centre crop to `to`'s extent: its first plane, row and column.
struct Origin {
  int64_t d, h, w;
};
Origin crop_origin(const MapDims& kept, const MapDims& to) {
  SEXTANT_CHECK(kept.volume == to.volume && kept.b == to.b && kept.d >= to.d && kept.h >= to.h &&
                    kept.w >= to.w,
                "a kept map {} cannot be cropped to {}", describe(kept), describe(to));
  return {spec::centre_crop_offset(kept.d, to.d), spec::centre_crop_offset(kept.h, to.h),
          spec::centre_crop_offset(kept.w, to.w)};
}
void check_concat(const MapDims& k, const MapDims& d, const MapDims& o) {
  SEXTANT_CHECK(o.volume == d.volume && o.b == d.b && o.c == k.c + d.c && o.d == d.d &&
                    o.h == d.h && o.w == d.w,
                "a concat of {} kept and {} channels of {} does not make {}", k.c, d.c, describe(d),
                describe(o));
}
// Calls f(kept offset, joined offset) for every row of the kept map's crop: the first element of
// the row in `kept` and in the concat's first k.c channels.
template <typename F>
void for_each_cropped_row(const MapDims& k, const MapDims& d, const MapDims& o, F f) {
  const Origin at = crop_origin(k, d);
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t c = 0; c < k.c; ++c)
      for (int64_t z = 0; z < d.d; ++z)
        for (int64_t h = 0; h < d.h; ++h)
          f((((b * k.c + c) * k.d + at.d + z) * k.h + at.h + h) * k.w + at.w,
            (((b * o.c + c) * d.d + z) * d.h + h) * d.w);
}

}  // namespace

ConcatDims concat_dims(const Tensor& kept, const Tensor& x, const Tensor& y) {
  const MapDims k = map_dims(kept), d = map_dims(x), o = map_dims(y);
  check_concat(k, d, o);
  const Origin at = crop_origin(k, d);
  return {k, d, o, at.d, at.h, at.w};
}

void crop_concat(const Tensor& kept, const Tensor& x, Tensor& y) {
  const MapDims k = map_dims(kept), d = map_dims(x), o = map_dims(y);
  check_concat(k, d, o);
  for_each_cropped_row(k, d, o, [&](int64_t from, int64_t to) {
    std::copy_n(kept.data() + from, d.w, y.data() + to);
  });
  const int64_t block = d.c * d.voxels();
  for (int64_t b = 0; b < d.b; ++b)
    std::copy_n(x.data() + b * block, block, y.data() + (b * o.c + k.c) * d.voxels());
}

void crop_concat_backward(const Tensor& dy, Tensor& dkept, Tensor& dx) {
  const MapDims k = map_dims(dkept), d = map_dims(dx), o = map_dims(dy);
  check_concat(k, d, o);
  for_each_cropped_row(k, d, o, [&](int64_t to, int64_t from) {
    for (int64_t w = 0; w < d.w; ++w) dkept.data()[to + w] += dy.data()[from + w];
  });
  const int64_t block = d.c * d.voxels();
  for (int64_t b = 0; b < d.b; ++b)
    std::copy_n(dy.data() + (b * o.c + k.c) * d.voxels(), block, dx.data() + b * block);
}

double pixel_cross_entropy(const Tensor& logits, const std::vector<int32_t>& labels, float scale,
                           Tensor* dlogits, int64_t map_pixels) {
  const MapDims d = map_dims(logits);
  const int64_t voxels = d.voxels();
  SEXTANT_CHECK(static_cast<int64_t>(labels.size()) == d.b * voxels,
                "{} pixel labels for logits {}", labels.size(), describe(d));
  SEXTANT_CHECK(map_pixels == 0 || map_pixels >= voxels,
                "a block of {} pixels of a map of {} pixels", voxels, map_pixels);
  const double mean_over = static_cast<double>(map_pixels == 0 ? voxels : map_pixels);
  double total = 0;
  std::vector<double> p(static_cast<size_t>(d.c));
  for (int64_t b = 0; b < d.b; ++b) {
    const float* z = logits.data() + b * d.c * voxels;
    double sample = 0;
    for (int64_t i = 0; i < voxels; ++i) {
      // Log-sum-exp over the channels, shifted by their maximum.
      double top = z[i];
      for (int64_t c = 1; c < d.c; ++c) top = std::max(top, static_cast<double>(z[c * voxels + i]));
      double sum = 0;
      for (int64_t c = 0; c < d.c; ++c) {
        p[static_cast<size_t>(c)] = std::exp(z[c * voxels + i] - top);
        sum += p[static_cast<size_t>(c)];
      }
      const int32_t label = labels[static_cast<size_t>(b * voxels + i)];
      SEXTANT_CHECK(label >= 0 && label < d.c, "pixel label {} of {} classes", label, d.c);
      sample += std::log(sum) + top - z[label * voxels + i];
      if (dlogits == nullptr) continue;
      float* g = dlogits->data() + b * d.c * voxels;
      const double per_pixel = static_cast<double>(scale) / mean_over;
      for (int64_t c = 0; c < d.c; ++c)
        g[c * voxels + i] = static_cast<float>(
            per_pixel * (p[static_cast<size_t>(c)] / sum - (c == label ? 1.0 : 0.0)));
    }
    total += sample / mean_over;
  }
  return total;
}

void add_channel_bias(Tensor& y, const Tensor& bias) {
  const MapDims d = map_dims(y);
  const int64_t voxels = d.voxels();
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t c = 0; c < d.c; ++c) {
      float* p = y.data() + (b * d.c + c) * voxels;
      for (int64_t i = 0; i < voxels; ++i) p[i] += bias.data()[c];
    }
}

void channel_bias_backward(const Tensor& dy, Tensor& db) {
  const MapDims d = map_dims(dy);
  const int64_t voxels = d.voxels();
  for (int64_t c = 0; c < d.c; ++c) {
    double s = 0;
    for (int64_t b = 0; b < d.b; ++b) {
      const float* p = dy.data() + (b * d.c + c) * voxels;
      for (int64_t i = 0; i < voxels; ++i) s += p[i];
    }
    db.data()[c] += static_cast<float>(s);
  }
}

void channel_sums(const Tensor& x, std::vector<double>& sums) {
  const MapDims d = map_dims(x);
  sums.assign(static_cast<size_t>(2 * d.c), 0.0);
  const int64_t voxels = d.voxels();
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t c = 0; c < d.c; ++c) {
      const float* p = x.data() + (b * d.c + c) * voxels;
      double s = 0, q = 0;
      for (int64_t i = 0; i < voxels; ++i) {
        s += p[i];
        q += static_cast<double>(p[i]) * p[i];
      }
      sums[static_cast<size_t>(c)] += s;
      sums[static_cast<size_t>(d.c + c)] += q;
    }
}

void batch_statistics(const std::vector<double>& sums, int64_t count, std::vector<double>& mean,
                      std::vector<double>& rstd) {
  const size_t channels = sums.size() / 2;
  mean.resize(channels);
  rstd.resize(channels);
  for (size_t c = 0; c < channels; ++c) {
    mean[c] = sums[c] / static_cast<double>(count);
    const double var =
        std::max(0.0, sums[channels + c] / static_cast<double>(count) - mean[c] * mean[c]);
    rstd[c] = 1.0 / std::sqrt(var + kBatchNormEps);
  }
}

void batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                const std::vector<double>& mean, const std::vector<double>& rstd, Tensor& y) {
  const MapDims d = map_dims(x);
  const int64_t voxels = d.voxels();
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t c = 0; c < d.c; ++c) {
      const size_t ci = static_cast<size_t>(c);
      const float scale = static_cast<float>(rstd[ci]) * gamma.data()[c];
      const float shift = beta.data()[c] - static_cast<float>(mean[ci]) * scale;
      const float* p = x.data() + (b * d.c + c) * voxels;
      float* q = y.data() + (b * d.c + c) * voxels;
      for (int64_t i = 0; i < voxels; ++i) q[i] = p[i] * scale + shift;
    }
}

void batch_norm_backward_sums(const Tensor& x, const Tensor& dy, const std::vector<double>& mean,
                              const std::vector<double>& rstd, std::vector<double>& sums) {
  const MapDims d = map_dims(x);
  sums.assign(static_cast<size_t>(2 * d.c), 0.0);
  const int64_t voxels = d.voxels();
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t c = 0; c < d.c; ++c) {
      const size_t ci = static_cast<size_t>(c);
      const float* p = x.data() + (b * d.c + c) * voxels;
      const float* g = dy.data() + (b * d.c + c) * voxels;
      double s = 0, q = 0;
      for (int64_t i = 0; i < voxels; ++i) {
        s += g[i];
        q += static_cast<double>(g[i]) * ((p[i] - mean[ci]) * rstd[ci]);
      }
      sums[ci] += s;
      sums[static_cast<size_t>(d.c) + ci] += q;
    }
}

void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                         const std::vector<double>& mean, const std::vector<double>& rstd,
                         const std::vector<double>& sums, int64_t count, Tensor& dx) {
  const MapDims d = map_dims(x);
  const int64_t voxels = d.voxels();
  const double n = static_cast<double>(count);
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t c = 0; c < d.c; ++c) {
      const size_t ci = static_cast<size_t>(c);
      const double dbeta = sums[ci] / n, dgamma = sums[static_cast<size_t>(d.c) + ci] / n;
      const double scale = gamma.data()[c] * rstd[ci];
      const float* p = x.data() + (b * d.c + c) * voxels;
      const float* g = dy.data() + (b * d.c + c) * voxels;
      float* q = dx.data() + (b * d.c + c) * voxels;
      for (int64_t i = 0; i < voxels; ++i) {
        const double xhat = (p[i] - mean[ci]) * rstd[ci];
        q[i] = static_cast<float>(scale * (g[i] - dbeta - xhat * dgamma));
      }
    }
}

namespace {

// Calls f(output index, first input element of its window) for every output of a pooling layer
// (f walks the window with for_each_tap).
template <typename F>
void for_each_window(const WindowDims& g, F f) {
  int64_t o = 0;
  for (int64_t bc = 0; bc < g.in.b * g.in.c; ++bc)
    for (int64_t od = 0; od < g.out.d; ++od)
      for (int64_t oh = 0; oh < g.out.h; ++oh)
        for (int64_t ow = 0; ow < g.out.w; ++ow, ++o)
          f(o, ((bc * g.in.d + od * g.sd) * g.in.h + oh * g.sh) * g.in.w + ow * g.sw);
}
// Calls f(input element) for every tap of the window starting at `first`.
template <typename F>
void for_each_tap(const WindowDims& g, int64_t first, F f) {
  for (int64_t a = 0; a < g.kd; ++a)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) f(first + (a * g.in.h + i) * g.in.w + j);
}

}  // namespace

void max_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y) {
  const WindowDims g = window_dims(x, y, kernel, stride, x.dim(1));
  for_each_window(g, [&](int64_t o, int64_t first) {
    float best = -std::numeric_limits<float>::infinity();
    bool any = false;
    for_each_tap(g, first, [&](int64_t e) {
      if (!any || x.data()[e] > best) best = x.data()[e];
      any = true;
    });
    y.data()[o] = best;
  });
}

void max_pool_backward(const Tensor& x, const Tensor& y, const Tensor& dy, int64_t kernel,
                       int64_t stride, Tensor& dx) {
  const WindowDims g = window_dims(x, y, kernel, stride, x.dim(1));
  SEXTANT_CHECK(dy.numel() == y.numel() && dx.numel() == x.numel(),
                "max pooling's gradients of {} and {} elements for {} and {}", dy.numel(),
                dx.numel(), y.numel(), x.numel());
  std::fill(dx.data(), dx.data() + dx.numel(), 0.0f);
  for_each_window(g, [&](int64_t o, int64_t first) {
    int64_t at = -1;
    for_each_tap(g, first, [&](int64_t e) {
      if (at < 0 && x.data()[e] == y.data()[o]) at = e;
    });
    if (at >= 0) dx.data()[at] += dy.data()[o];
  });
}

void avg_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y) {
  const WindowDims g = window_dims(x, y, kernel, stride, x.dim(1));
  const float inv = 1.0f / static_cast<float>(g.taps());
  for_each_window(g, [&](int64_t o, int64_t first) {
    double s = 0;
    for_each_tap(g, first, [&](int64_t e) { s += x.data()[e]; });
    y.data()[o] = static_cast<float>(s) * inv;
  });
}

void avg_pool_backward(const Tensor& dy, int64_t kernel, int64_t stride, Tensor& dx) {
  const WindowDims g = window_dims(dx, dy, kernel, stride, dx.dim(1));
  const float inv = 1.0f / static_cast<float>(g.taps());
  std::fill(dx.data(), dx.data() + dx.numel(), 0.0f);
  for_each_window(g, [&](int64_t o, int64_t first) {
    const float share = dy.data()[o] * inv;
    for_each_tap(g, first, [&](int64_t e) { dx.data()[e] += share; });
  });
}

void shift_map(const Tensor& x, int64_t top, int64_t left, float fill, Tensor& y) {
  const MapDims d = map_dims(x), o = map_dims(y);
  SEXTANT_CHECK(!d.volume && !o.volume && o.b == d.b && o.c == d.c, "a shift of {} into {}",
                describe(d), describe(o));
  for (int64_t bc = 0; bc < d.b * d.c; ++bc)
    for (int64_t h = 0; h < o.h; ++h)
      for (int64_t w = 0; w < o.w; ++w) {
        const int64_t i = h + top, j = w + left;
        const bool inside = i >= 0 && i < d.h && j >= 0 && j < d.w;
        y.data()[(bc * o.h + h) * o.w + w] = inside ? x.data()[(bc * d.h + i) * d.w + j] : fill;
      }
}

void shift_map_backward(const Tensor& dy, int64_t top, int64_t left, Tensor& dx) {
  const MapDims d = map_dims(dx), o = map_dims(dy);
  SEXTANT_CHECK(!d.volume && !o.volume && o.b == d.b && o.c == d.c,
                "a shift's gradient of {} into {}", describe(o), describe(d));
  std::fill(dx.data(), dx.data() + dx.numel(), 0.0f);
  for (int64_t bc = 0; bc < d.b * d.c; ++bc)
    for (int64_t h = 0; h < o.h; ++h)
      for (int64_t w = 0; w < o.w; ++w) {
        const int64_t i = h + top, j = w + left;
        if (i >= 0 && i < d.h && j >= 0 && j < d.w)
          dx.data()[(bc * d.h + i) * d.w + j] += dy.data()[(bc * o.h + h) * o.w + w];
      }
}

namespace {

// Calls f(output index, input element, the window's elements inside the map) for every element
// of every window of a k x k pool of stride s over a 2D map padded by p.
template <typename F>
void for_each_unpadded_tap(const MapDims& d, const MapDims& o, int64_t k, int64_t s, int64_t p,
                           F f) {
  SEXTANT_CHECK(
      !d.volume && !o.volume && o.b == d.b && o.c == d.c &&
          o.h == valid_output(d.h + 2 * p, k, s) && o.w == valid_output(d.w + 2 * p, k, s),
      "a {}/{} pool padded by {} over {} cannot make {}", k, s, p, describe(d), describe(o));
  int64_t out = 0;
  for (int64_t bc = 0; bc < d.b * d.c; ++bc)
    for (int64_t oh = 0; oh < o.h; ++oh)
      for (int64_t ow = 0; ow < o.w; ++ow, ++out) {
        const int64_t h0 = std::max<int64_t>(oh * s - p, 0), h1 = std::min(oh * s - p + k, d.h);
        const int64_t w0 = std::max<int64_t>(ow * s - p, 0), w1 = std::min(ow * s - p + k, d.w);
        const int64_t count = (h1 - h0) * (w1 - w0);
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t w = w0; w < w1; ++w) f(out, (bc * d.h + h) * d.w + w, count);
      }
}

}  // namespace

void avg_pool_excluding_padding(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding,
                                Tensor& y) {
  std::vector<double> sums(static_cast<size_t>(y.numel()), 0.0);
  std::vector<int64_t> counts(static_cast<size_t>(y.numel()), 1);
  for_each_unpadded_tap(map_dims(x), map_dims(y), kernel, stride, padding,
                        [&](int64_t o, int64_t e, int64_t count) {
                          sums[static_cast<size_t>(o)] += x.data()[e];
                          counts[static_cast<size_t>(o)] = count;
                        });
  for (int64_t o = 0; o < y.numel(); ++o)
    y.data()[o] = static_cast<float>(sums[static_cast<size_t>(o)] /
                                     static_cast<double>(counts[static_cast<size_t>(o)]));
}

void avg_pool_excluding_padding_backward(const Tensor& dy, int64_t kernel, int64_t stride,
                                         int64_t padding, Tensor& dx) {
  std::fill(dx.data(), dx.data() + dx.numel(), 0.0f);
  for_each_unpadded_tap(map_dims(dx), map_dims(dy), kernel, stride, padding,
                        [&](int64_t o, int64_t e, int64_t count) {
                          dx.data()[e] += dy.data()[o] / static_cast<float>(count);
                        });
}

void concat_channels(const std::vector<Tensor>& parts, Tensor& y) {
  const MapDims o = map_dims(y);
  int64_t channels = 0;
  for (const Tensor& t : parts) {
    const MapDims d = map_dims(t);
    SEXTANT_CHECK(d.b == o.b && d.voxels() == o.voxels() && d.volume == o.volume,
                  "a concat of {} into {}", describe(d), describe(o));
    channels += d.c;
  }
  SEXTANT_CHECK(channels == o.c, "a concat of {} channels into {}", channels, describe(o));
  const int64_t per = o.voxels();
  for (int64_t b = 0; b < o.b; ++b) {
    float* to = y.data() + b * o.c * per;
    for (const Tensor& t : parts) {
      const int64_t n = t.dim(1) * per;
      std::copy_n(t.data() + b * n, n, to);
      to += n;
    }
  }
}

void split_channels(const Tensor& dy, std::vector<Tensor>& parts) {
  const MapDims o = map_dims(dy);
  int64_t channels = 0;
  for (const Tensor& t : parts) {
    const MapDims d = map_dims(t);
    SEXTANT_CHECK(d.b == o.b && d.voxels() == o.voxels() && d.volume == o.volume,
                  "a split of {} into {}", describe(o), describe(d));
    channels += d.c;
  }
  SEXTANT_CHECK(channels == o.c, "a split of {} into {} channels", describe(o), channels);
  const int64_t per = o.voxels();
  for (int64_t b = 0; b < o.b; ++b) {
    const float* from = dy.data() + b * o.c * per;
    for (Tensor& t : parts) {
      const int64_t n = t.dim(1) * per;
      std::copy_n(from, n, t.data() + b * n);
      from += n;
    }
  }
}

namespace {

// The bins of adaptive pooling a block of a map meets: calls f(output index, input element, 1 /
// the bin's size) for every element of the block in every bin (PyTorch's bins on each axis).
template <typename F>
void for_each_bin_element(const MapDims& d, const MapDims& o, const spec::MapBlock& block,
                          const spec::MapExtent& map, F f) {
  SEXTANT_CHECK(d.volume == map.volume() && o.volume == d.volume && d.d == block.planes.size() &&
                    d.h == block.rows.size() && d.w == block.cols.size() && o.b == d.b &&
                    o.c == d.c,
                "adaptive pooling of a block {} into {}", describe(d), describe(o));
  const int64_t depth = map.volume() ? map.d : 1;
  auto overlap = [](spec::Rows bin_rows, spec::Rows held) {
    return spec::Rows{std::max(bin_rows.begin, held.begin), std::min(bin_rows.end, held.end)};
  };
  int64_t out = 0;
  for (int64_t bc = 0; bc < d.b * d.c; ++bc)
    for (int64_t k = 0; k < o.d; ++k)
      for (int64_t i = 0; i < o.h; ++i)
        for (int64_t j = 0; j < o.w; ++j, ++out) {
          const spec::Rows pd = bin(k, depth, o.d), r = bin(i, map.h, o.h), c = bin(j, map.w, o.w);
          const int64_t size = pd.size() * r.size() * c.size();
          const spec::Rows zs = overlap(pd, block.planes), hs = overlap(r, block.rows),
                           ws = overlap(c, block.cols);
          for (int64_t z = zs.begin; z < zs.end; ++z)
            for (int64_t h = hs.begin; h < hs.end; ++h)
              for (int64_t w = ws.begin; w < ws.end; ++w)
                f(out,
                  ((bc * d.d + z - block.planes.begin) * d.h + h - block.rows.begin) * d.w + w -
                      block.cols.begin,
                  size);
        }
}

}  // namespace

AdaptiveDims adaptive_dims(const Tensor& x, const Tensor& y, const spec::MapBlock& block,
                           const spec::MapExtent& map) {
  const MapDims d = map_dims(x), o = map_dims(y);
  SEXTANT_CHECK(d.volume == map.volume() && o.volume == d.volume && d.d == block.planes.size() &&
                    d.h == block.rows.size() && d.w == block.cols.size() && o.b == d.b &&
                    o.c == d.c,
                "adaptive pooling of a block {} into {}", describe(d), describe(o));
  return {
      d,     o,    block.planes.begin, block.rows.begin, block.cols.begin, map.volume() ? map.d : 1,
      map.h, map.w};
}

void adaptive_avg_pool(const Tensor& x, const spec::MapBlock& block, const spec::MapExtent& map,
                       Tensor& y) {
  const MapDims d = map_dims(x), o = map_dims(y);
  std::vector<double> sums(static_cast<size_t>(y.numel()), 0.0);
  std::vector<int64_t> sizes(static_cast<size_t>(y.numel()), 1);
  for_each_bin_element(d, o, block, map, [&](int64_t out, int64_t in, int64_t size) {
    sums[static_cast<size_t>(out)] += x.data()[in];
    sizes[static_cast<size_t>(out)] = size;
  });
  // A bin the block does not meet still has its size (its share is 0).
  for (int64_t out = 0; out < y.numel(); ++out)
    y.data()[out] = static_cast<float>(sums[static_cast<size_t>(out)] /
                                       static_cast<double>(sizes[static_cast<size_t>(out)]));
}

void adaptive_avg_pool_backward(const Tensor& dy, const spec::MapBlock& block,
                                const spec::MapExtent& map, Tensor& dx) {
  const MapDims d = map_dims(dx), o = map_dims(dy);
  std::fill(dx.data(), dx.data() + dx.numel(), 0.0f);
  for_each_bin_element(d, o, block, map, [&](int64_t out, int64_t in, int64_t size) {
    dx.data()[in] += dy.data()[out] / static_cast<float>(size);
  });
}

void adaptive_avg_pool(const Tensor& x, spec::Rows rows, spec::Rows cols, int64_t height,
                       int64_t width, Tensor& y) {
  adaptive_avg_pool(x, spec::MapBlock{rows, cols}, spec::MapExtent{height, width}, y);
}

void adaptive_avg_pool_backward(const Tensor& dy, spec::Rows rows, spec::Rows cols, int64_t height,
                                int64_t width, Tensor& dx) {
  adaptive_avg_pool_backward(dy, spec::MapBlock{rows, cols}, spec::MapExtent{height, width}, dx);
}

}  // namespace sextant::exec::conv
