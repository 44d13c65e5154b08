// The kernels of convolutional networks on CPU ranks: convolution (im2col + an Eigen GEMM), batch
// normalisation in training mode, max and average pooling, adaptive average pooling. Host fp32
// tensors in NCHW order, or NCDHW for volumes (3D U-Net): every kernel takes either, a 2D map being
// a volume of depth 1. A window is k x k (k x k x k over a volume: the
// zoo's windows are cubic) with one stride on every axis; a convolution weight is
// [out_channels, in_channels, k, k] or [.., k, k, k] (PyTorch's Conv2d and Conv3d).
//
// A window's input arrives whole: the caller has grown the rank's block by its halo and by the
// padding (SpatialExchange::gather), so convolution and pooling here slide over every position of
// their input ("valid"): output rows = (rows - k) / stride + 1. Batch normalisation is split in
// its sums and their use, so that ranks holding blocks of one map can all-reduce the sums between
// the two (Dryden et al., IPDPS'19, §III-B). Backward kernels accumulate (+=) into weight, bias,
// gamma and beta gradients and overwrite input gradients, as the Backend's do.
#pragma once

#include <cstdint>
#include <vector>

#include "sextant/exec/kernels/convolution.hpp"
#include "sextant/exec/tensor.hpp"
#include "sextant/spec/spatial_split.hpp"

namespace sextant::exec::conv {

// Rows (or columns) a window of `kernel` and `stride` makes from `extent` rows already padded.
int64_t valid_output(int64_t extent, int64_t kernel, int64_t stride);

// A window's strides along the rows and the columns (AmoebaNet's 1x7 convolution of stride
// (1, 2)); a volume's window takes one stride on every axis.
struct Strides {
  int64_t rows = 1, cols = 1;
};

// y[B, Co, Ho, Wo] = w * x (+ bias) over x[B, C, H, W] (or over a volume [B, C, D, H, W]).
void convolution(const Tensor& x, const Tensor& w, const Tensor* bias, int64_t stride, Tensor& y);
// dx = the transposed convolution of dy (when dx is given); dw += dy (x) x; db += sums of dy.
void convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy, int64_t stride,
                          Tensor* dx, Tensor& dw, Tensor* db);
// The same with a rectangular window on a 2D map (PyTorch's Conv2d with kernel_size=(kh, kw) and
// stride=(sh, sw)): the window is the weight's [O, I, kh, kw]. The backends' convolutions take
// square windows; AmoebaNet's cells, which need these, run on CPU ranks.
void convolution(const Tensor& x, const Tensor& w, const Tensor* bias, Strides stride, Tensor& y);
void convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Strides stride,
                          Tensor* dx, Tensor& dw, Tensor* db);

// y[b, c, h, w] = x[b, c, h + top, w + left] where that lies in x, else `fill`, for y of any
// extent over a 2D map: padding (top = -pad rows, left = -pad columns, y larger by twice the
// padding) and the factorized reduction's shifted map (torchgpipe's pad(x[:, :, 1:, 1:]): top =
// left = 1, y as large as x). The backward adds each dy element back where it was read (dx
// overwritten).
void shift_map(const Tensor& x, int64_t top, int64_t left, float fill, Tensor& y);
void shift_map_backward(const Tensor& dy, int64_t top, int64_t left, Tensor& dx);

// Average pooling of a 2D map x (not padded) by a k x k window of stride s over the map padded by
// p, each window's sum divided by the elements it covers inside the map (PyTorch's AvgPool2d with
// count_include_pad=False, AmoebaNet's avg_pool_3x3).
void avg_pool_excluding_padding(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding,
                                Tensor& y);
void avg_pool_excluding_padding_backward(const Tensor& dy, int64_t kernel, int64_t stride,
                                         int64_t padding, Tensor& dx);

// y[B, C1 + C2 + ..., H, W] joins the parts along the channels in order (torch.cat(dim=1)); the
// backward splits dy back into the parts (overwritten).
void concat_channels(const std::vector<Tensor>& parts, Tensor& y);
void split_channels(const Tensor& dy, std::vector<Tensor>& parts);

// The transposed convolution (PyTorch's ConvTranspose2d and 3d, no padding; U-Net's
// up-convolution): y[B, Co, (H - 1) s + k, (W - 1) s + k] gets x[b, ci, i, j] w[ci, co, a, c] added
// at (i s + a, j s + c) over x[B, Ci, H, W] and w[Ci, Co, k, k] (and so along a volume's depth). It
// is the input gradient of a convolution of y's shape into x's with that weight read as
// [Ci filters, Co channels, k, k], and is computed so (col2im of W^T x).
void transposed_convolution(const Tensor& x, const Tensor& w, int64_t stride, Tensor& y);
// dx (when given) = the convolution of dy by w; dw += x (x) the windows of dy.
void transposed_convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                     int64_t stride, Tensor* dx, Tensor& dw);

// U-Net's skip connection: y[B, Ck + Cx, H, W] (or [.., D, H, W]) holds the kept map's centre
// crop (spec::centre_crop_offset on each axis) in channels [0, Ck), then x. Backward adds the
// first Ck channels of dy into dkept at the crop (the kept map's gradient from its other use is
// there already) and writes the rest to dx.
void crop_concat(const Tensor& kept, const Tensor& x, Tensor& y);
void crop_concat_backward(const Tensor& dy, Tensor& dkept, Tensor& dx);

// A per-pixel classifier's loss (segmentation; PyTorch's cross_entropy over [B, C, H, W] logits
// and [B, H, W] labels, or per voxel over [B, C, D, H, W] and [B, D, H, W]): the softmax over the C
// channels of each pixel against its label. Returns the sum over the samples of each sample's mean
// loss over its pixels; `dlogits` (when given) gets `scale` x the gradient of that sum (softmax -
// one-hot, over each sample's pixels). A rank holding a block of a spatially split map passes the
// whole map's pixels per sample (`map_pixels`; 0: the logits' own), so that the ranks' sums add
// up to the whole map's.
double pixel_cross_entropy(const Tensor& logits, const std::vector<int32_t>& labels, float scale,
                           Tensor* dlogits, int64_t map_pixels = 0);

// y[b, c, ...] += bias[c], and its backward db[c] += sums of dy[., c, ...] (a convolution whose
// bias is added after its partial sums are reduced).
void add_channel_bias(Tensor& y, const Tensor& bias);
void channel_bias_backward(const Tensor& dy, Tensor& db);

// Batch normalisation, training mode (batch statistics, biased variance, eps 1e-5, as PyTorch's
// BatchNorm2d and 3d normalise in training).
using exec::kBatchNormEps;  // kernels/convolution.hpp
// Per channel over [B, C, H, W]: sums[c] = sum of x, sums[C + c] = sum of x^2.
void channel_sums(const Tensor& x, std::vector<double>& sums);
// Mean and 1 / sqrt(var + eps) per channel from the sums of `count` elements per channel.
void batch_statistics(const std::vector<double>& sums, int64_t count, std::vector<double>& mean,
                      std::vector<double>& rstd);
// y = (x - mean) * rstd * gamma + beta.
void batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                const std::vector<double>& mean, const std::vector<double>& rstd, Tensor& y);
// Per channel: sums[c] = sum of dy (dbeta), sums[C + c] = sum of dy * xhat (dgamma).
void batch_norm_backward_sums(const Tensor& x, const Tensor& dy, const std::vector<double>& mean,
                              const std::vector<double>& rstd, std::vector<double>& sums);
// dx = gamma * rstd * (dy - (dbeta + xhat * dgamma) / count), from the sums over the whole maps
// (`count` elements per channel).
void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                         const std::vector<double>& mean, const std::vector<double>& rstd,
                         const std::vector<double>& sums, int64_t count, Tensor& dx);

// Max pooling over a padded input (padding filled with -infinity). The backward routes each
// output's gradient to its window's first maximum (as PyTorch's CPU kernel), found again in x: the
// first input element equal to y.
void max_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y);
void max_pool_backward(const Tensor& x, const Tensor& y, const Tensor& dy, int64_t kernel,
                       int64_t stride, Tensor& dx);
// Average pooling over a zero-padded input, dividing by the window's size, kernel^2 or kernel^3
// (PyTorch's count_include_pad).
void avg_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y);
void avg_pool_backward(const Tensor& dy, int64_t kernel, int64_t stride, Tensor& dx);

// Adaptive average pooling of a map (`map`: rows, columns and a volume's planes) to out x out (x
// out) (PyTorch's bins on each axis: output i averages input rows [floor(i H / out),
// ceil((i + 1) H / out))). x is the block `block` of the map; y[B, C, (out,) out, out] gets the
// block's share of every bin (the whole bin when unsplit): the sum of its elements in the bin
// over the bin's size. Summed over the blocks, the pooled map.
void adaptive_avg_pool(const Tensor& x, const spec::MapBlock& block, const spec::MapExtent& map,
                       Tensor& y);
// dx (the block) from the whole dy.
void adaptive_avg_pool_backward(const Tensor& dy, const spec::MapBlock& block,
                                const spec::MapExtent& map, Tensor& dx);
// The same over the rows `rows` and columns `cols` of a 2D height x width map.
void adaptive_avg_pool(const Tensor& x, spec::Rows rows, spec::Rows cols, int64_t height,
                       int64_t width, Tensor& y);
void adaptive_avg_pool_backward(const Tensor& dy, spec::Rows rows, spec::Rows cols, int64_t height,
                                int64_t width, Tensor& dx);

}  // namespace sextant::exec::conv
