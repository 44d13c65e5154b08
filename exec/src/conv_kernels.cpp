// CNN kernels on host fp32 tensors: im2col + Eigen GEMMs, plain loops for the rest; sums in double
// so that a layout's summation order barely moves them.
#include "sextant/exec/conv_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "eigen_maps.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec::conv {

namespace {

using namespace eigen;  // NOLINT(google-build-using-namespace): eigen_maps.hpp

struct Dims {
  int64_t b, c, h, w;
};
Dims dims(const Tensor& t) {
  SEXTANT_CHECK(t.shape().size() == 4, "a feature map is [B, C, H, W], got {} dimensions",
                t.shape().size());
  return {t.dim(0), t.dim(1), t.dim(2), t.dim(3)};
}

// The window geometry of a convolution or pooling, checked against the tensors' shapes.
struct Window {
  Dims in, out;
  int64_t k, s;
};
Window window(const Tensor& x, const Tensor& y, int64_t k, int64_t s, int64_t out_channels) {
  Window g{dims(x), dims(y), k, s};
  SEXTANT_CHECK(g.out.b == g.in.b && g.out.c == out_channels &&
                    g.out.h == valid_output(g.in.h, k, s) && g.out.w == valid_output(g.in.w, k, s),
                "window {}/{} over [{}, {}, {}, {}] cannot make [{}, {}, {}, {}]", k, s, g.in.b,
                g.in.c, g.in.h, g.in.w, g.out.b, g.out.c, g.out.h, g.out.w);
  return g;
}

// col[(c k + i) k + j, oh Wo + ow] = x[c, oh s + i, ow s + j] for one sample.
void im2col(const float* x, const Window& g, float* col) {
  const int64_t pixels = g.out.h * g.out.w;
  for (int64_t c = 0; c < g.in.c; ++c)
    for (int64_t i = 0; i < g.k; ++i)
      for (int64_t j = 0; j < g.k; ++j) {
        float* row = col + ((c * g.k + i) * g.k + j) * pixels;
        for (int64_t oh = 0; oh < g.out.h; ++oh) {
          const float* src = x + (c * g.in.h + oh * g.s + i) * g.in.w + j;
          for (int64_t ow = 0; ow < g.out.w; ++ow) row[oh * g.out.w + ow] = src[ow * g.s];
        }
      }
}

// The adjoint of im2col: adds each column entry back into its input element.
void col2im_add(const float* col, const Window& g, float* x) {
  const int64_t pixels = g.out.h * g.out.w;
  for (int64_t c = 0; c < g.in.c; ++c)
    for (int64_t i = 0; i < g.k; ++i)
      for (int64_t j = 0; j < g.k; ++j) {
        const float* row = col + ((c * g.k + i) * g.k + j) * pixels;
        for (int64_t oh = 0; oh < g.out.h; ++oh) {
          float* dst = x + (c * g.in.h + oh * g.s + i) * g.in.w + j;
          for (int64_t ow = 0; ow < g.out.w; ++ow) dst[ow * g.s] += row[oh * g.out.w + ow];
        }
      }
}

// A 1x1 window of stride 1 reads its input as it lies: the column matrix is the sample itself.
bool pointwise(const Window& g) {
  return g.k == 1 && g.s == 1;
}

// The bins of adaptive average pooling along one axis (PyTorch's start_index / end_index).
spec::Rows bin(int64_t i, int64_t extent, int64_t out) {
  return {i * extent / out, ((i + 1) * extent + out - 1) / out};
}

}  // namespace

int64_t valid_output(int64_t extent, int64_t kernel, int64_t stride) {
  return (extent - kernel) / stride + 1;
}

void conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, int64_t stride, Tensor& y) {
  const int64_t k = w.dim(2);
  const Window g = window(x, y, k, stride, w.dim(0));
  SEXTANT_CHECK(w.dim(1) == g.in.c && w.dim(3) == k, "convolution weight does not match its input");
  const int64_t rows = g.in.c * k * k, pixels = g.out.h * g.out.w;
  std::vector<float> col(pointwise(g) ? 0 : static_cast<size_t>(rows * pixels));
  ConstMap wm(w.data(), g.out.c, rows);
  for (int64_t b = 0; b < g.in.b; ++b) {
    const float* xb = x.data() + b * g.in.c * g.in.h * g.in.w;
    if (!pointwise(g)) im2col(xb, g, col.data());
    ConstMap cm(pointwise(g) ? xb : col.data(), rows, pixels);
    Map yb(y.data() + b * g.out.c * pixels, g.out.c, pixels);
    yb.noalias() = wm * cm;
    if (bias != nullptr)
      for (int64_t o = 0; o < g.out.c; ++o) yb.row(o).array() += bias->data()[o];
  }
}

void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, int64_t stride, Tensor* dx,
                     Tensor& dw, Tensor* db) {
  const int64_t k = w.dim(2);
  const Window g = window(x, dy, k, stride, w.dim(0));
  const int64_t rows = g.in.c * k * k, pixels = g.out.h * g.out.w;
  std::vector<float> col(pointwise(g) ? 0 : static_cast<size_t>(rows * pixels));
  std::vector<float> dcol(static_cast<size_t>(rows * pixels));
  ConstMap wm(w.data(), g.out.c, rows);
  Map dwm(dw.data(), g.out.c, rows);
  if (dx != nullptr) std::fill(dx->data(), dx->data() + dx->numel(), 0.0f);
  for (int64_t b = 0; b < g.in.b; ++b) {
    const float* xb = x.data() + b * g.in.c * g.in.h * g.in.w;
    if (!pointwise(g)) im2col(xb, g, col.data());
    ConstMap cm(pointwise(g) ? xb : col.data(), rows, pixels);
    ConstMap dyb(dy.data() + b * g.out.c * pixels, g.out.c, pixels);
    dwm.noalias() += dyb * cm.transpose();
    if (db != nullptr)
      for (int64_t o = 0; o < g.out.c; ++o) db->data()[o] += dyb.row(o).sum();
    if (dx != nullptr) {
      Map dcm(dcol.data(), rows, pixels);
      dcm.noalias() = wm.transpose() * dyb;
      float* dxb = dx->data() + b * g.in.c * g.in.h * g.in.w;
      if (pointwise(g)) {
        std::copy(dcol.begin(), dcol.end(), dxb);
      } else {
        col2im_add(dcol.data(), g, dxb);
      }
    }
  }
}

void conv_transpose2d(const Tensor& x, const Tensor& w, int64_t stride, Tensor& y) {
  const int64_t k = w.dim(2);
  // The window slides over y, the map the adjoint convolution would read, making x.
  const Window g = window(y, x, k, stride, w.dim(0));
  SEXTANT_CHECK(w.dim(1) == g.in.c && w.dim(3) == k,
                "transposed convolution weight [{}, {}, {}, {}] does not match [{}, {}] channels",
                w.dim(0), w.dim(1), w.dim(2), w.dim(3), g.out.c, g.in.c);
  const int64_t rows = g.in.c * k * k, pixels = g.out.h * g.out.w;
  std::vector<float> col(static_cast<size_t>(rows * pixels));
  ConstMap wm(w.data(), g.out.c, rows);
  std::fill(y.data(), y.data() + y.numel(), 0.0f);
  for (int64_t b = 0; b < g.in.b; ++b) {
    ConstMap xb(x.data() + b * g.out.c * pixels, g.out.c, pixels);
    Map cm(col.data(), rows, pixels);
    cm.noalias() = wm.transpose() * xb;
    float* yb = y.data() + b * g.in.c * g.in.h * g.in.w;
    if (pointwise(g)) {
      std::copy(col.begin(), col.end(), yb);
    } else {
      col2im_add(col.data(), g, yb);
    }
  }
}

void conv_transpose2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, int64_t stride,
                               Tensor* dx, Tensor& dw) {
  const int64_t k = w.dim(2);
  const Window g = window(dy, x, k, stride, w.dim(0));
  const int64_t rows = g.in.c * k * k, pixels = g.out.h * g.out.w;
  std::vector<float> col(pointwise(g) ? 0 : static_cast<size_t>(rows * pixels));
  ConstMap wm(w.data(), g.out.c, rows);
  Map dwm(dw.data(), g.out.c, rows);
  for (int64_t b = 0; b < g.in.b; ++b) {
    const float* dyb = dy.data() + b * g.in.c * g.in.h * g.in.w;
    if (!pointwise(g)) im2col(dyb, g, col.data());
    ConstMap cm(pointwise(g) ? dyb : col.data(), rows, pixels);
    ConstMap xb(x.data() + b * g.out.c * pixels, g.out.c, pixels);
    dwm.noalias() += xb * cm.transpose();
    if (dx != nullptr) {
      Map dxb(dx->data() + b * g.out.c * pixels, g.out.c, pixels);
      dxb.noalias() = wm * cm;
    }
  }
}

namespace {

// The kept map's centre crop to `to`'s rows and columns: its first row and column.
std::pair<int64_t, int64_t> crop_origin(const Dims& kept, const Dims& to) {
  SEXTANT_CHECK(kept.b == to.b && kept.h >= to.h && kept.w >= to.w,
                "a kept map [{}, {}, {}, {}] cannot be cropped to {}x{}", kept.b, kept.c, kept.h,
                kept.w, to.h, to.w);
  return {spec::centre_crop_offset(kept.h, to.h), spec::centre_crop_offset(kept.w, to.w)};
}

}  // namespace

void crop_concat(const Tensor& kept, const Tensor& x, Tensor& y) {
  const Dims k = dims(kept), d = dims(x), o = dims(y);
  SEXTANT_CHECK(o.b == d.b && o.c == k.c + d.c && o.h == d.h && o.w == d.w,
                "a concat of {} kept and {} channels cannot make [{}, {}, {}, {}]", k.c, d.c, o.b,
                o.c, o.h, o.w);
  const auto [top, left] = crop_origin(k, d);
  const int64_t plane = d.h * d.w;
  for (int64_t b = 0; b < d.b; ++b) {
    for (int64_t c = 0; c < k.c; ++c)
      for (int64_t h = 0; h < d.h; ++h) {
        const float* src = kept.data() + ((b * k.c + c) * k.h + top + h) * k.w + left;
        std::copy(src, src + d.w, y.data() + ((b * o.c + c) * d.h + h) * d.w);
      }
    const float* xb = x.data() + b * d.c * plane;
    std::copy(xb, xb + d.c * plane, y.data() + (b * o.c + k.c) * plane);
  }
}

void crop_concat_backward(const Tensor& dy, Tensor& dkept, Tensor& dx) {
  const Dims k = dims(dkept), d = dims(dx), o = dims(dy);
  SEXTANT_CHECK(o.b == d.b && o.c == k.c + d.c && o.h == d.h && o.w == d.w,
                "a concat's gradient [{}, {}, {}, {}] does not split into {} kept and {} channels",
                o.b, o.c, o.h, o.w, k.c, d.c);
  const auto [top, left] = crop_origin(k, d);
  const int64_t plane = d.h * d.w;
  for (int64_t b = 0; b < d.b; ++b) {
    for (int64_t c = 0; c < k.c; ++c)
      for (int64_t h = 0; h < d.h; ++h) {
        const float* src = dy.data() + ((b * o.c + c) * d.h + h) * d.w;
        float* dst = dkept.data() + ((b * k.c + c) * k.h + top + h) * k.w + left;
        for (int64_t w = 0; w < d.w; ++w) dst[w] += src[w];
      }
    const float* src = dy.data() + (b * o.c + k.c) * plane;
    std::copy(src, src + d.c * plane, dx.data() + b * d.c * plane);
  }
}

double pixel_cross_entropy(const Tensor& logits, const std::vector<int32_t>& labels, float scale,
                           Tensor* dlogits) {
  const Dims d = dims(logits);
  const int64_t plane = d.h * d.w;
  SEXTANT_CHECK(static_cast<int64_t>(labels.size()) == d.b * plane,
                "{} pixel labels for logits [{}, {}, {}, {}]", labels.size(), d.b, d.c, d.h, d.w);
  double total = 0;
  std::vector<double> p(static_cast<size_t>(d.c));
  for (int64_t b = 0; b < d.b; ++b) {
    const float* z = logits.data() + b * d.c * plane;
    double sample = 0;
    for (int64_t i = 0; i < plane; ++i) {
      // Log-sum-exp over the channels, shifted by their maximum.
      double top = z[i];
      for (int64_t c = 1; c < d.c; ++c) top = std::max(top, static_cast<double>(z[c * plane + i]));
      double sum = 0;
      for (int64_t c = 0; c < d.c; ++c) {
        p[static_cast<size_t>(c)] = std::exp(z[c * plane + i] - top);
        sum += p[static_cast<size_t>(c)];
      }
      const int32_t label = labels[static_cast<size_t>(b * plane + i)];
      SEXTANT_CHECK(label >= 0 && label < d.c, "pixel label {} of {} classes", label, d.c);
      sample += std::log(sum) + top - z[label * plane + i];
      if (dlogits == nullptr) continue;
      float* g = dlogits->data() + b * d.c * plane;
      const double per_pixel = static_cast<double>(scale) / static_cast<double>(plane);
      for (int64_t c = 0; c < d.c; ++c)
        g[c * plane + i] = static_cast<float>(
            per_pixel * (p[static_cast<size_t>(c)] / sum - (c == label ? 1.0 : 0.0)));
    }
    total += sample / static_cast<double>(plane);
  }
  return total;
}

void add_channel_bias(Tensor& y, const Tensor& bias) {
  const Dims d = dims(y);
  const int64_t plane = d.h * d.w;
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t c = 0; c < d.c; ++c) {
      float* p = y.data() + (b * d.c + c) * plane;
      for (int64_t i = 0; i < plane; ++i) p[i] += bias.data()[c];
    }
}

void channel_bias_backward(const Tensor& dy, Tensor& db) {
  const Dims d = dims(dy);
  const int64_t plane = d.h * d.w;
  for (int64_t c = 0; c < d.c; ++c) {
    double s = 0;
    for (int64_t b = 0; b < d.b; ++b) {
      const float* p = dy.data() + (b * d.c + c) * plane;
      for (int64_t i = 0; i < plane; ++i) s += p[i];
    }
    db.data()[c] += static_cast<float>(s);
  }
}

void channel_sums(const Tensor& x, std::vector<double>& sums) {
  const Dims d = dims(x);
  sums.assign(static_cast<size_t>(2 * d.c), 0.0);
  const int64_t plane = d.h * d.w;
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t c = 0; c < d.c; ++c) {
      const float* p = x.data() + (b * d.c + c) * plane;
      double s = 0, q = 0;
      for (int64_t i = 0; i < plane; ++i) {
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
  const Dims d = dims(x);
  const int64_t plane = d.h * d.w;
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t c = 0; c < d.c; ++c) {
      const size_t ci = static_cast<size_t>(c);
      const float scale = static_cast<float>(rstd[ci]) * gamma.data()[c];
      const float shift = beta.data()[c] - static_cast<float>(mean[ci]) * scale;
      const float* p = x.data() + (b * d.c + c) * plane;
      float* q = y.data() + (b * d.c + c) * plane;
      for (int64_t i = 0; i < plane; ++i) q[i] = p[i] * scale + shift;
    }
}

void batch_norm_backward_sums(const Tensor& x, const Tensor& dy, const std::vector<double>& mean,
                              const std::vector<double>& rstd, std::vector<double>& sums) {
  const Dims d = dims(x);
  sums.assign(static_cast<size_t>(2 * d.c), 0.0);
  const int64_t plane = d.h * d.w;
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t c = 0; c < d.c; ++c) {
      const size_t ci = static_cast<size_t>(c);
      const float* p = x.data() + (b * d.c + c) * plane;
      const float* g = dy.data() + (b * d.c + c) * plane;
      double s = 0, q = 0;
      for (int64_t i = 0; i < plane; ++i) {
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
  const Dims d = dims(x);
  const int64_t plane = d.h * d.w;
  const double n = static_cast<double>(count);
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t c = 0; c < d.c; ++c) {
      const size_t ci = static_cast<size_t>(c);
      const double dbeta = sums[ci] / n, dgamma = sums[static_cast<size_t>(d.c) + ci] / n;
      const double scale = gamma.data()[c] * rstd[ci];
      const float* p = x.data() + (b * d.c + c) * plane;
      const float* g = dy.data() + (b * d.c + c) * plane;
      float* q = dx.data() + (b * d.c + c) * plane;
      for (int64_t i = 0; i < plane; ++i) {
        const double xhat = (p[i] - mean[ci]) * rstd[ci];
        q[i] = static_cast<float>(scale * (g[i] - dbeta - xhat * dgamma));
      }
    }
}

void max_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y,
              std::vector<int64_t>& argmax) {
  const Window g = window(x, y, kernel, stride, x.dim(1));
  argmax.resize(static_cast<size_t>(y.numel()));
  int64_t o = 0;
  for (int64_t bc = 0; bc < g.in.b * g.in.c; ++bc)
    for (int64_t oh = 0; oh < g.out.h; ++oh)
      for (int64_t ow = 0; ow < g.out.w; ++ow, ++o) {
        float best = -std::numeric_limits<float>::infinity();
        int64_t at = -1;
        for (int64_t i = 0; i < kernel; ++i)
          for (int64_t j = 0; j < kernel; ++j) {
            const int64_t e = (bc * g.in.h + oh * stride + i) * g.in.w + ow * stride + j;
            if (at < 0 || x.data()[e] > best) {
              best = x.data()[e];
              at = e;
            }
          }
        y.data()[o] = best;
        argmax[static_cast<size_t>(o)] = at;
      }
}

void max_pool_backward(const std::vector<int64_t>& argmax, const Tensor& dy, Tensor& dx) {
  std::fill(dx.data(), dx.data() + dx.numel(), 0.0f);
  for (int64_t o = 0; o < dy.numel(); ++o)
    dx.data()[argmax[static_cast<size_t>(o)]] += dy.data()[o];
}

void avg_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y) {
  const Window g = window(x, y, kernel, stride, x.dim(1));
  const float inv = 1.0f / static_cast<float>(kernel * kernel);
  int64_t o = 0;
  for (int64_t bc = 0; bc < g.in.b * g.in.c; ++bc)
    for (int64_t oh = 0; oh < g.out.h; ++oh)
      for (int64_t ow = 0; ow < g.out.w; ++ow, ++o) {
        double s = 0;
        for (int64_t i = 0; i < kernel; ++i)
          for (int64_t j = 0; j < kernel; ++j)
            s += x.data()[(bc * g.in.h + oh * stride + i) * g.in.w + ow * stride + j];
        y.data()[o] = static_cast<float>(s) * inv;
      }
}

void avg_pool_backward(const Tensor& dy, int64_t kernel, int64_t stride, Tensor& dx) {
  const Window g = window(dx, dy, kernel, stride, dx.dim(1));
  const float inv = 1.0f / static_cast<float>(kernel * kernel);
  std::fill(dx.data(), dx.data() + dx.numel(), 0.0f);
  int64_t o = 0;
  for (int64_t bc = 0; bc < g.in.b * g.in.c; ++bc)
    for (int64_t oh = 0; oh < g.out.h; ++oh)
      for (int64_t ow = 0; ow < g.out.w; ++ow, ++o)
        for (int64_t i = 0; i < kernel; ++i)
          for (int64_t j = 0; j < kernel; ++j)
            dx.data()[(bc * g.in.h + oh * stride + i) * g.in.w + ow * stride + j] +=
                dy.data()[o] * inv;
}

void adaptive_avg_pool(const Tensor& x, spec::Rows rows, spec::Rows cols, int64_t height,
                       int64_t width, Tensor& y) {
  const Dims d = dims(x), o = dims(y);
  SEXTANT_CHECK(d.h == rows.size() && d.w == cols.size() && o.b == d.b && o.c == d.c,
                "adaptive pooling shapes");
  for (int64_t bc = 0; bc < d.b * d.c; ++bc)
    for (int64_t i = 0; i < o.h; ++i)
      for (int64_t j = 0; j < o.w; ++j) {
        const spec::Rows r = bin(i, height, o.h), c = bin(j, width, o.w);
        double s = 0;
        for (int64_t h = std::max(r.begin, rows.begin); h < std::min(r.end, rows.end); ++h)
          for (int64_t w = std::max(c.begin, cols.begin); w < std::min(c.end, cols.end); ++w)
            s += x.data()[(bc * d.h + h - rows.begin) * d.w + w - cols.begin];
        y.data()[(bc * o.h + i) * o.w + j] =
            static_cast<float>(s / static_cast<double>(r.size() * c.size()));
      }
}

void adaptive_avg_pool_backward(const Tensor& dy, spec::Rows rows, spec::Rows cols, int64_t height,
                                int64_t width, Tensor& dx) {
  const Dims d = dims(dx), o = dims(dy);
  std::fill(dx.data(), dx.data() + dx.numel(), 0.0f);
  for (int64_t bc = 0; bc < d.b * d.c; ++bc)
    for (int64_t i = 0; i < o.h; ++i)
      for (int64_t j = 0; j < o.w; ++j) {
        const spec::Rows r = bin(i, height, o.h), c = bin(j, width, o.w);
        const float g =
            dy.data()[(bc * o.h + i) * o.w + j] / static_cast<float>(r.size() * c.size());
        for (int64_t h = std::max(r.begin, rows.begin); h < std::min(r.end, rows.end); ++h)
          for (int64_t w = std::max(c.begin, cols.begin); w < std::min(c.end, cols.end); ++w)
            dx.data()[(bc * d.h + h - rows.begin) * d.w + w - cols.begin] += g;
      }
}

}  // namespace sextant::exec::conv
