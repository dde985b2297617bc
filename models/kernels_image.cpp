// Interpreter kernels for convolution (im2col + GEMM loops), pooling and normalisation.
// Transposed convolution is the input gradient of a convolution, so it shares that kernel.
#include <algorithm>
#include <cmath>
#include <limits>

#include "models/kernels.hpp"

namespace ipupod::models::kernels {
namespace {

// The dimensions of one convolution, read from the buffers (x: input, y: output).
struct ConvDims {
  std::size_t n, ci, h, w, co, kh, kw, oh, ow, groups, cig, cog, k, p;
  Conv2dGeometry g;
};

ConvDims dims_of(const Op& op, const Shape& x, const Shape& y, const Shape& w) {
  ConvDims d{};
  d.g = Conv2dGeometry::read(op);
  d.n = x[0], d.ci = x[1], d.h = x[2], d.w = x[3];
  d.co = y[1], d.oh = y[2], d.ow = y[3];
  d.kh = w[2], d.kw = w[3];
  d.groups = d.g.groups;
  d.cig = d.ci / d.groups, d.cog = d.co / d.groups;
  d.k = d.cig * d.kh * d.kw;
  d.p = d.oh * d.ow;
  return d;
}

// col[k][p] for sample b, group gr: the input pixel under kernel tap k at output position p.
void im2col(const ConvDims& d, const float* x, std::size_t b, std::size_t gr, float* col) {
  for (std::size_t c = 0; c < d.cig; ++c) {
    const float* plane = x + ((b * d.ci) + gr * d.cig + c) * d.h * d.w;
    for (std::size_t i = 0; i < d.kh; ++i)
      for (std::size_t j = 0; j < d.kw; ++j) {
        float* row = col + ((c * d.kh + i) * d.kw + j) * d.p;
        for (std::size_t oy = 0; oy < d.oh; ++oy) {
          const long iy = static_cast<long>(oy * d.g.stride_h + i * d.g.dilation_h) -
                          static_cast<long>(d.g.pad_top);
          for (std::size_t ox = 0; ox < d.ow; ++ox) {
            const long ix = static_cast<long>(ox * d.g.stride_w + j * d.g.dilation_w) -
                            static_cast<long>(d.g.pad_left);
            const bool inside =
                iy >= 0 && ix >= 0 && iy < static_cast<long>(d.h) && ix < static_cast<long>(d.w);
            row[oy * d.ow + ox] =
                inside ? plane[static_cast<std::size_t>(iy) * d.w + static_cast<std::size_t>(ix)]
                       : 0.f;
          }
        }
      }
  }
}

// The adjoint of im2col: adds col back into the input-shaped gradient.
void col2im(const ConvDims& d, const float* col, std::size_t b, std::size_t gr, float* dx) {
  for (std::size_t c = 0; c < d.cig; ++c) {
    float* plane = dx + ((b * d.ci) + gr * d.cig + c) * d.h * d.w;
    for (std::size_t i = 0; i < d.kh; ++i)
      for (std::size_t j = 0; j < d.kw; ++j) {
        const float* row = col + ((c * d.kh + i) * d.kw + j) * d.p;
        for (std::size_t oy = 0; oy < d.oh; ++oy) {
          const long iy = static_cast<long>(oy * d.g.stride_h + i * d.g.dilation_h) -
                          static_cast<long>(d.g.pad_top);
          if (iy < 0 || iy >= static_cast<long>(d.h)) continue;
          for (std::size_t ox = 0; ox < d.ow; ++ox) {
            const long ix = static_cast<long>(ox * d.g.stride_w + j * d.g.dilation_w) -
                            static_cast<long>(d.g.pad_left);
            if (ix < 0 || ix >= static_cast<long>(d.w)) continue;
            plane[static_cast<std::size_t>(iy) * d.w + static_cast<std::size_t>(ix)] +=
                row[oy * d.ow + ox];
          }
        }
      }
  }
}

}  // namespace

void conv2d(const Op& op, const Buffer& x, const Buffer& w, Buffer& out) {
  const ConvDims d = dims_of(op, x.info.shape, out.info.shape, w.info.shape);
  std::vector<float> col(d.k * d.p);
  for (std::size_t b = 0; b < d.n; ++b)
    for (std::size_t gr = 0; gr < d.groups; ++gr) {
      im2col(d, x.f.data(), b, gr, col.data());
      for (std::size_t o = 0; o < d.cog; ++o) {
        const std::size_t oc = gr * d.cog + o;
        float* y = out.f.data() + (b * d.co + oc) * d.p;
        const float* wrow = w.f.data() + oc * d.k;
        for (std::size_t k = 0; k < d.k; ++k) {
          const float wv = wrow[k];
          const float* c = col.data() + k * d.p;
          for (std::size_t p = 0; p < d.p; ++p) y[p] += wv * c[p];
        }
      }
    }
}

void conv2d_grad_input(const Op& op, const Buffer& dy, const Buffer& w, Buffer& out) {
  const ConvDims d = dims_of(op, out.info.shape, dy.info.shape, w.info.shape);
  std::vector<float> col(d.k * d.p);
  for (std::size_t b = 0; b < d.n; ++b)
    for (std::size_t gr = 0; gr < d.groups; ++gr) {
      std::fill(col.begin(), col.end(), 0.f);
      for (std::size_t o = 0; o < d.cog; ++o) {
        const std::size_t oc = gr * d.cog + o;
        const float* g = dy.f.data() + (b * d.co + oc) * d.p;
        const float* wrow = w.f.data() + oc * d.k;
        for (std::size_t k = 0; k < d.k; ++k) {
          const float wv = wrow[k];
          float* c = col.data() + k * d.p;
          for (std::size_t p = 0; p < d.p; ++p) c[p] += wv * g[p];
        }
      }
      col2im(d, col.data(), b, gr, out.f.data());
    }
}

void conv2d_grad_weight(const Op& op, const Buffer& dy, const Buffer& x, Buffer& out) {
  const ConvDims d = dims_of(op, x.info.shape, dy.info.shape, out.info.shape);
  std::vector<float> col(d.k * d.p);
  std::vector<double> acc(out.f.size(), 0.0);
  for (std::size_t b = 0; b < d.n; ++b)
    for (std::size_t gr = 0; gr < d.groups; ++gr) {
      im2col(d, x.f.data(), b, gr, col.data());
      for (std::size_t o = 0; o < d.cog; ++o) {
        const std::size_t oc = gr * d.cog + o;
        const float* g = dy.f.data() + (b * d.co + oc) * d.p;
        for (std::size_t k = 0; k < d.k; ++k) {
          const float* c = col.data() + k * d.p;
          float s[8] = {};  // independent partial sums: vectorisable, still deterministic
          std::size_t p = 0;
          for (; p + 8 <= d.p; p += 8)
            for (std::size_t j = 0; j < 8; ++j) s[j] += g[p + j] * c[p + j];
          for (; p < d.p; ++p) s[0] += g[p] * c[p];
          acc[oc * d.k + k] += ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
        }
      }
    }
  for (std::size_t i = 0; i < acc.size(); ++i) out.f[i] = static_cast<float>(acc[i]);
}

namespace {

// The input range [begin, end) of output index o along one axis, and the average's divisor.
struct Window {
  std::size_t begin, end, divisor;
};

Window window(std::size_t o, std::size_t in, std::size_t out, std::size_t k, std::size_t s,
              std::size_t pad, bool adaptive, bool include_pad) {
  if (adaptive) {
    const std::size_t b = (o * in) / out, e = ((o + 1) * in + out - 1) / out;
    return {b, e, e - b};
  }
  const long start = static_cast<long>(o * s) - static_cast<long>(pad);
  const long stop = std::min(start + static_cast<long>(k), static_cast<long>(in + pad));
  const std::size_t b = static_cast<std::size_t>(std::max(start, 0L));
  const std::size_t e = static_cast<std::size_t>(std::min(stop, static_cast<long>(in)));
  return {b, e, include_pad ? static_cast<std::size_t>(stop - start) : e - b};
}

template <class F>
void for_each_window(const Op& op, const Shape& in, const Shape& out, F&& f) {
  const Pool2dGeometry g = Pool2dGeometry::read(op);
  const std::size_t planes = in[0] * in[1], h = in[2], w = in[3], oh = out[2], ow = out[3];
  for (std::size_t pl = 0; pl < planes; ++pl)
    for (std::size_t oy = 0; oy < oh; ++oy) {
      const Window wy =
          window(oy, h, oh, g.kernel_h, g.stride_h, g.pad_h, g.adaptive, g.count_include_pad);
      for (std::size_t ox = 0; ox < ow; ++ox) {
        const Window wx =
            window(ox, w, ow, g.kernel_w, g.stride_w, g.pad_w, g.adaptive, g.count_include_pad);
        f(pl * h * w, (pl * oh + oy) * ow + ox, wy, wx);
      }
    }
}

}  // namespace

void max_pool2d(const Op& op, const Buffer& x, Buffer& out) {
  const std::size_t w = x.info.shape[3];
  for_each_window(op, x.info.shape, out.info.shape,
                  [&](std::size_t plane, std::size_t o, const Window& wy, const Window& wx) {
                    float best = -std::numeric_limits<float>::infinity();
                    for (std::size_t y = wy.begin; y < wy.end; ++y)
                      for (std::size_t xx = wx.begin; xx < wx.end; ++xx)
                        best = std::max(best, x.f[plane + y * w + xx]);
                    out.f[o] = best;
                  });
}

void max_pool2d_grad(const Op& op, const Buffer& dy, const Buffer& x, Buffer& out) {
  const std::size_t w = x.info.shape[3];
  for_each_window(op, x.info.shape, dy.info.shape,
                  [&](std::size_t plane, std::size_t o, const Window& wy, const Window& wx) {
                    float best = -std::numeric_limits<float>::infinity();
                    std::size_t at = plane + wy.begin * w + wx.begin;
                    for (std::size_t y = wy.begin; y < wy.end; ++y)
                      for (std::size_t xx = wx.begin; xx < wx.end; ++xx)
                        if (x.f[plane + y * w + xx] > best) {  // the first maximum, like PyTorch
                          best = x.f[plane + y * w + xx];
                          at = plane + y * w + xx;
                        }
                    out.f[at] += dy.f[o];
                  });
}

void avg_pool2d(const Op& op, const Buffer& x, Buffer& out) {
  const std::size_t w = x.info.shape[3];
  for_each_window(op, x.info.shape, out.info.shape,
                  [&](std::size_t plane, std::size_t o, const Window& wy, const Window& wx) {
                    double s = 0;
                    for (std::size_t y = wy.begin; y < wy.end; ++y)
                      for (std::size_t xx = wx.begin; xx < wx.end; ++xx)
                        s += x.f[plane + y * w + xx];
                    out.f[o] = static_cast<float>(s / static_cast<double>(wy.divisor * wx.divisor));
                  });
}

void avg_pool2d_grad(const Op& op, const Buffer& dy, Buffer& out) {
  const std::size_t w = out.info.shape[3];
  for_each_window(op, out.info.shape, dy.info.shape,
                  [&](std::size_t plane, std::size_t o, const Window& wy, const Window& wx) {
                    const float g = dy.f[o] / static_cast<float>(wy.divisor * wx.divisor);
                    for (std::size_t y = wy.begin; y < wy.end; ++y)
                      for (std::size_t xx = wx.begin; xx < wx.end; ++xx)
                        out.f[plane + y * w + xx] += g;
                  });
}

namespace {

// The normalisation sets of a NormKind: `stats` sets of `count` elements each; element e of
// set s is at offset(s, e).
struct NormLayout {
  std::size_t stats = 1, count = 1;
  bool per_channel = false;  // batch norm: set = channel, strided over (n, spatial)
  std::size_t n = 1, c = 1, spatial = 1;
  std::size_t offset(std::size_t s, std::size_t e) const {
    if (!per_channel) return s * count + e;
    return ((e / spatial) * c + s) * spatial + e % spatial;
  }
};

NormLayout layout_of(const Op& op, const Shape& shape) {
  NormLayout l;
  std::size_t total = 1;
  for (std::size_t d : shape) total *= d;
  switch (static_cast<NormKind>(op.i("norm"))) {
    case NormKind::layer:
      l.count = shape.back();
      l.stats = l.count ? total / l.count : 0;
      break;
    case NormKind::group: {
      const auto groups = static_cast<std::size_t>(op.i("groups"));
      l.stats = shape[0] * groups;
      l.count = l.stats ? total / l.stats : 0;
      break;
    }
    case NormKind::batch:
      l.per_channel = true;
      l.n = shape[0], l.c = shape[1];
      l.spatial = total / (l.n * l.c);
      l.stats = l.c;
      l.count = l.n * l.spatial;
      break;
  }
  return l;
}

// Mean and biased variance of one set.
std::pair<double, double> moments(const NormLayout& l, const float* x, std::size_t s) {
  double mean = 0, var = 0;
  for (std::size_t e = 0; e < l.count; ++e) mean += x[l.offset(s, e)];
  mean /= static_cast<double>(l.count);
  for (std::size_t e = 0; e < l.count; ++e) {
    const double d = x[l.offset(s, e)] - mean;
    var += d * d;
  }
  return {mean, var / static_cast<double>(l.count)};
}

}  // namespace

void normalize(const Op& op, const Buffer& x, Buffer& out) {
  const NormLayout l = layout_of(op, x.info.shape);
  const double eps = op.r("eps");
  for (std::size_t s = 0; s < l.stats; ++s) {
    const auto [mean, var] = moments(l, x.f.data(), s);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (std::size_t e = 0; e < l.count; ++e) {
      const std::size_t at = l.offset(s, e);
      out.f[at] = static_cast<float>((x.f[at] - mean) * inv);
    }
  }
}

void normalize_grad(const Op& op, const Buffer& dy, const Buffer& x, Buffer& out) {
  const NormLayout l = layout_of(op, x.info.shape);
  const double eps = op.r("eps");
  for (std::size_t s = 0; s < l.stats; ++s) {
    const auto [mean, var] = moments(l, x.f.data(), s);
    const double inv = 1.0 / std::sqrt(var + eps);
    double mean_dy = 0, mean_dy_xhat = 0;
    for (std::size_t e = 0; e < l.count; ++e) {
      const std::size_t at = l.offset(s, e);
      mean_dy += dy.f[at];
      mean_dy_xhat += dy.f[at] * (x.f[at] - mean) * inv;
    }
    mean_dy /= static_cast<double>(l.count);
    mean_dy_xhat /= static_cast<double>(l.count);
    for (std::size_t e = 0; e < l.count; ++e) {
      const std::size_t at = l.offset(s, e);
      const double xhat = (x.f[at] - mean) * inv;
      out.f[at] = static_cast<float>(inv * (dy.f[at] - mean_dy - xhat * mean_dy_xhat));
    }
  }
}

void batch_norm_inference(const Op& op, const Buffer& x, const Buffer& mean, const Buffer& var,
                          Buffer& out) {
  const std::size_t c = x.info.shape[1], spatial = x.f.size() / (x.info.shape[0] * c);
  const double eps = op.r("eps");
  for (std::size_t i = 0; i < x.f.size(); ++i) {
    const std::size_t ch = (i / spatial) % c;
    out.f[i] = static_cast<float>((x.f[i] - mean.f[ch]) / std::sqrt(var.f[ch] + eps));
  }
}

void batch_norm_stats_update(const Op& op, const Buffer& x, Buffer& mean, Buffer& var) {
  Op as_norm = op;
  as_norm.attrs.ints["norm"] = static_cast<std::int64_t>(NormKind::batch);
  const NormLayout l = layout_of(as_norm, x.info.shape);
  const double m = op.r("momentum");
  for (std::size_t s = 0; s < l.stats; ++s) {
    const auto [mu, v] = moments(l, x.f.data(), s);
    const double unbiased =
        l.count > 1 ? v * static_cast<double>(l.count) / static_cast<double>(l.count - 1) : v;
    mean.f[s] = static_cast<float>((1 - m) * mean.f[s] + m * mu);
    var.f[s] = static_cast<float>((1 - m) * var.f[s] + m * unbiased);
  }
}

}  // namespace ipupod::models::kernels
