// Convolutions on tiles: the planner, the lowering of each op (one exchange brings every
// tile its input rows with their halo and its weight slice, vertices compute on the tile) and
// the codelets. Each output element sums its taps in the order the reference interpreter does.
#include "ipu_process/ops/conv.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "ipu_process/codelets.hpp"
#include "ipu_process/ops/matmul.hpp"

namespace ipupod::ipu {
namespace {

using Index = std::ptrdiff_t;

Index signed_of(std::size_t v) {
  return static_cast<Index>(v);
}

// The geometry every convolution codelet reads from its first parameters.
struct ConvGeometry {
  std::size_t h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl;
  static constexpr std::size_t kParams = 12;
  static ConvGeometry read(const VertexContext& c) {
    ConvGeometry g{};
    std::size_t* f[] = {&g.h,  &g.w,  &g.oh, &g.ow, &g.kh, &g.kw,
                        &g.sh, &g.sw, &g.dh, &g.dw, &g.pt, &g.pl};
    for (std::size_t i = 0; i < kParams; ++i) *f[i] = c.size_param(i);
    return g;
  }
  void append(std::vector<double>& p) const {
    for (std::size_t v : {h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl})
      p.push_back(static_cast<double>(v));
  }
};

// For kernel column j: the output columns [lo, hi) whose input column ox*sw + j*dw - pl lies
// inside the image, and the input column of lo.
struct ColumnRange {
  std::size_t lo, hi, first_input;
};

std::vector<ColumnRange> column_ranges(const ConvGeometry& g) {
  std::vector<ColumnRange> out(g.kw);
  for (std::size_t j = 0; j < g.kw; ++j) {
    const Index off = signed_of(j * g.dw) - signed_of(g.pl);
    const Index sw = signed_of(g.sw);
    const Index lo = off >= 0 ? 0 : (-off + sw - 1) / sw;
    const Index last = signed_of(g.w) - 1 - off;  // largest ox*sw allowed
    Index hi = last < 0 ? 0 : std::min(signed_of(g.ow), last / sw + 1);
    hi = std::max(hi, lo);
    out[j] = {static_cast<std::size_t>(lo), static_cast<std::size_t>(hi),
              static_cast<std::size_t>(std::max<Index>(lo * sw + off, 0))};
  }
  return out;
}

// y[i] += a * x[i * stride] for i in [0, n): the inner loop of every convolution vertex.
inline void axpy(float* __restrict y, const float* __restrict x, float a, std::size_t n,
                 std::size_t stride) {
  if (stride == 1)
    for (std::size_t i = 0; i < n; ++i) y[i] += a * x[i];
  else
    for (std::size_t i = 0; i < n; ++i) y[i] += a * x[i * stride];
}

// Four floats in one SIMD register (GCC's vector extension): the chunked loops below use it so
// that their accumulators stay in registers whatever the auto-vectoriser decides.
using Vec4 = float __attribute__((vector_size(16)));

inline Vec4 load4(const float* p) {
  Vec4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline Vec4 load4(const float* p, std::size_t stride) {
  return stride == 1 ? load4(p) : Vec4{p[0], p[stride], p[2 * stride], p[3 * stride]};
}

inline void store4(float* p, Vec4 v) {
  std::memcpy(p, &v, sizeof v);
}

// Multiply-accumulates of a vertex with `outputs` output elements of `taps` taps each.
std::uint64_t mac_cycles(const ArchPreset& arch, double outputs, double taps, DType dtype) {
  return amp_cycles(arch, 2.0 * outputs * taps, dtype);
}

// One input row a convolution output row reads: channel c's row under kernel row i (pointing
// at input column 0) and the kw weights of that kernel row.
struct RowTap {
  const float* x;
  const float* w;
};

// Output columns [lo, hi) for which every kernel column lands inside the image.
std::pair<std::size_t, std::size_t> interior(const std::vector<ColumnRange>& cols, std::size_t ow) {
  const std::size_t lo = std::min(cols.front().lo, ow), hi = std::min(cols.back().hi, ow);
  return {lo, std::max(lo, hi)};
}

// out[ox] for ox in [ox, end) (interior columns), N at a time in registers: the sum over row
// taps, then kernel columns, in that order. Stride is the column stride (1 when Unit).
template <std::size_t N, bool Unit>
std::size_t forward_chunks(float* orow, const std::vector<RowTap>& taps, std::size_t ox,
                           std::size_t end, const ConvGeometry& g) {
  static_assert(N % 4 == 0);
  const std::size_t stride = Unit ? 1 : g.sw;
  for (; ox + N <= end; ox += N) {
    Vec4 acc[N / 4] = {};
    const std::size_t base = ox * stride - g.pl;  // >= 0 for interior columns
    for (const RowTap& t : taps) {
      const float* xr = t.x + base;
      for (std::size_t j = 0; j < g.kw; ++j) {
        const Vec4 wv = Vec4{} + t.w[j];
        const float* xs = xr + j * g.dw;
        for (std::size_t v = 0; v < N / 4; ++v) acc[v] += wv * load4(xs + 4 * v * stride, stride);
      }
    }
    for (std::size_t v = 0; v < N / 4; ++v) store4(orow + ox + 4 * v, acc[v]);
  }
  return ox;
}

template <bool Unit>
std::size_t forward_interior(float* orow, const std::vector<RowTap>& taps, std::size_t ox,
                             std::size_t end, const ConvGeometry& g) {
  ox = forward_chunks<8, Unit>(orow, taps, ox, end, g);
  return forward_chunks<4, Unit>(orow, taps, ox, end, g);
}

// Kernel columns [first, end) that land inside the image for output column ox.
std::pair<std::size_t, std::size_t> kernel_columns(std::size_t ox, const ConvGeometry& g) {
  const Index at = signed_of(ox * g.sw) - signed_of(g.pl), dw = signed_of(g.dw);
  const Index first = at >= 0 ? 0 : (-at + dw - 1) / dw;
  const Index end = std::min(signed_of(g.kw), (signed_of(g.w) - at + dw - 1) / dw);
  return {static_cast<std::size_t>(first), static_cast<std::size_t>(std::max(first, end))};
}

// One output column at the image's border, only over the kernel columns inside the image.
float forward_column(const std::vector<RowTap>& taps, std::size_t ox, const ConvGeometry& g) {
  const auto [j0, j1] = kernel_columns(ox, g);
  const std::size_t at = ox * g.sw + j0 * g.dw - g.pl;
  float acc = 0.f;
  for (const RowTap& t : taps)
    for (std::size_t j = j0; j < j1; ++j) acc += t.w[j] * t.x[at + (j - j0) * g.dw];
  return acc;
}

// ConvForward: out rows [rr0, rr1) of planes (b, o); x local [nb, cc, hr, w] from input row
// ir0; w local [ob, cig, kh, kw]. Per region: b, weight offset, first input channel in x.
void conv_forward(const VertexContext& c) {
  const ConvGeometry g = ConvGeometry::read(c);
  const std::size_t k = ConvGeometry::kParams;
  const std::size_t cc = c.size_param(k), hr = c.size_param(k + 1), ir0 = c.size_param(k + 2);
  const std::size_t cig = c.size_param(k + 3), rr0 = c.size_param(k + 4), rr1 = c.size_param(k + 5);
  const float* x = c.region<const float>(0).data();
  const float* w = c.region<const float>(1).data();
  const auto [lo, hi] = interior(column_ranges(g), g.ow);
  std::vector<RowTap> taps;
  taps.reserve(cig * g.kh);
  for (std::size_t r = 0; r < c.regions(2); ++r) {
    auto out = c.region<float>(2, r);
    const std::size_t b = c.size_param(k + 6 + 3 * r), woff = c.size_param(k + 7 + 3 * r),
                      xoff = c.size_param(k + 8 + 3 * r);
    for (std::size_t oy = rr0; oy < rr1; ++oy) {
      taps.clear();
      for (std::size_t ch = 0; ch < cig; ++ch)
        for (std::size_t i = 0; i < g.kh; ++i) {
          const Index iy = signed_of(oy * g.sh + i * g.dh) - signed_of(g.pt);
          if (iy < 0 || iy >= signed_of(g.h)) continue;
          taps.push_back(
              {x + ((b * cc + xoff + ch) * hr + static_cast<std::size_t>(iy) - ir0) * g.w,
               w + woff + (ch * g.kh + i) * g.kw});
        }
      float* orow = out.data() + (oy - rr0) * g.ow;
      std::size_t ox = 0;
      for (; ox < std::min(lo, g.ow); ++ox) orow[ox] = forward_column(taps, ox, g);
      ox = g.sw == 1 ? forward_interior<true>(orow, taps, ox, hi, g)
                     : forward_interior<false>(orow, taps, ox, hi, g);
      for (; ox < g.ow; ++ox) orow[ox] = forward_column(taps, ox, g);
    }
  }
}

// Unit strides, interior input columns [ix, end) of one dx row and kernel row, N at a time:
// for each kernel column, the sum over output channels, then added to dx (the reference's order).
template <std::size_t N>
std::size_t grad_input_chunks(float* dxrow, const float* dyrow, const float* wi,
                              std::size_t wstride, std::size_t cog, std::size_t plane,
                              std::size_t ix, std::size_t end, const ConvGeometry& g) {
  static_assert(N % 4 == 0);
  for (; ix + N <= end; ix += N)
    for (std::size_t j = 0; j < g.kw; ++j) {
      Vec4 s[N / 4] = {};
      const float* d = dyrow + ix + g.pl - j * g.dw;
      for (std::size_t co = 0; co < cog; ++co) {
        const Vec4 wv = Vec4{} + wi[co * wstride + j];
        const float* dc = d + co * plane;
        for (std::size_t v = 0; v < N / 4; ++v) s[v] += wv * load4(dc + 4 * v);
      }
      for (std::size_t v = 0; v < N / 4; ++v)
        store4(dxrow + ix + 4 * v, load4(dxrow + ix + 4 * v) + s[v]);
    }
  return ix;
}

// ConvGradInput: dx rows [rr0, rr1) of planes (b, c); dy local [nb, cd, oyr, ow] from output
// row oy0; per region: b, first dy channel of c's group, offset of w[co=0, c, 0, 0] in the
// local weights and their stride from one output channel to the next. Each tap's sum over the
// output channels is added to dx in tap order, as the reference's col2im does.
void conv_grad_input(const VertexContext& c) {
  const ConvGeometry g = ConvGeometry::read(c);
  const std::size_t k = ConvGeometry::kParams;
  const std::size_t cd = c.size_param(k), oyr = c.size_param(k + 1), oy0 = c.size_param(k + 2);
  const std::size_t cog = c.size_param(k + 3), rr0 = c.size_param(k + 4), rr1 = c.size_param(k + 5);
  const float* dy = c.region<const float>(0).data();
  const float* w = c.region<const float>(1).data();
  const auto cols = column_ranges(g);
  const std::size_t plane = oyr * g.ow;
  // With unit strides every input column of [ix_lo, ix_hi) is reached by every kernel column.
  const bool unit = g.sh == 1 && g.sw == 1;
  const Index ix_lo_s = std::max<Index>(0, signed_of((g.kw - 1) * g.dw) - signed_of(g.pl));
  const Index ix_hi_s = std::min<Index>(signed_of(g.w), signed_of(g.ow) - signed_of(g.pl));
  const std::size_t ix_lo = unit ? static_cast<std::size_t>(ix_lo_s) : 0;
  const std::size_t ix_hi = unit && ix_hi_s > ix_lo_s ? static_cast<std::size_t>(ix_hi_s) : ix_lo;
  std::vector<float> sum(g.ow);  // the tap's contribution of every output column
  for (std::size_t r = 0; r < c.regions(2); ++r) {
    auto out = c.region<float>(2, r);
    std::fill(out.begin(), out.end(), 0.f);
    const std::size_t b = c.size_param(k + 6 + 4 * r), dyoff = c.size_param(k + 7 + 4 * r),
                      woff = c.size_param(k + 8 + 4 * r), wstride = c.size_param(k + 9 + 4 * r);
    const float* dyb = dy + (b * cd + dyoff) * plane;
    for (std::size_t iy = rr0; iy < rr1; ++iy) {
      float* dxrow = out.data() + (iy - rr0) * g.w;
      for (std::size_t i = 0; i < g.kh; ++i) {
        const Index t = signed_of(iy + g.pt) - signed_of(i * g.dh);
        if (t < 0 || t % signed_of(g.sh) != 0) continue;
        const std::size_t oy = static_cast<std::size_t>(t) / g.sh;
        if (oy >= g.oh) continue;
        const float* dyrow = dyb + (oy - oy0) * g.ow;
        const float* wi = w + woff + i * g.kw;
        // Interior columns, 8 then 4 at a time: each tap's sum over output channels in registers.
        std::size_t ix =
            grad_input_chunks<8>(dxrow, dyrow, wi, wstride, cog, plane, ix_lo, ix_hi, g);
        ix = grad_input_chunks<4>(dxrow, dyrow, wi, wstride, cog, plane, ix, ix_hi, g);
        if (unit) {  // the border columns, each bounds checked
          for (std::size_t col = 0; col < g.w; ++col) {
            if (col == ix_lo && ix_lo < ix) col = ix;
            if (col >= g.w) break;
            for (std::size_t j = 0; j < g.kw; ++j) {
              const Index ox = signed_of(col + g.pl) - signed_of(j * g.dw);
              if (ox < 0 || ox >= signed_of(g.ow)) continue;
              float s1 = 0.f;
              for (std::size_t co = 0; co < cog; ++co)
                s1 += wi[co * wstride + j] * dyrow[co * plane + static_cast<std::size_t>(ox)];
              dxrow[col] += s1;
            }
          }
          continue;
        }
        for (std::size_t j = 0; j < g.kw; ++j) {
          const ColumnRange& cr = cols[j];
          if (cr.lo >= cr.hi) continue;
          const std::size_t n = cr.hi - cr.lo;
          std::fill_n(sum.data(), n, 0.f);
          for (std::size_t co = 0; co < cog; ++co)
            axpy(sum.data(), dyrow + co * plane + cr.lo, wi[co * wstride + j], n, 1);
          for (std::size_t q = 0; q < n; ++q) dxrow[cr.first_input + q * g.sw] += sum[q];
        }
      }
    }
  }
}

// Interior output columns [ox, end) of one dy row, 4 at a time: acc[tap * 4 + q] gathers the
// products of columns q mod 4. Returns the first column not done.
// Interior output columns [ox, end) of one dy row against the same kernel row of C input
// channels (xr[c]: the input row under it), 4 columns at a time: acc[c * cstride + j * 4 + q]
// gathers the products of kernel column j at columns q mod 4. KW is the kernel width when
// known at compile time (the accumulators then stay in registers), 0 for any width (C = 1).
// Returns the first column not done.
template <std::size_t C, std::size_t KW, bool Unit>
std::size_t weight_row_chunks(float* acc, std::size_t cstride, const float* const* xr,
                              const float* d, std::size_t ox, std::size_t end,
                              const ConvGeometry& g) {
  const std::size_t stride = Unit ? 1 : g.sw;
  if constexpr (KW > 0) {
    Vec4 a[C][KW];
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t j = 0; j < KW; ++j) a[c][j] = load4(acc + c * cstride + j * 4);
    for (; ox + 4 <= end; ox += 4) {
      const Vec4 dv = load4(d + ox);
      for (std::size_t c = 0; c < C; ++c) {
        const float* xs = xr[c] + ox * stride - g.pl;
        for (std::size_t j = 0; j < KW; ++j) a[c][j] += dv * load4(xs + j * g.dw, stride);
      }
    }
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t j = 0; j < KW; ++j) store4(acc + c * cstride + j * 4, a[c][j]);
  } else {
    static_assert(C == 1);
    for (; ox + 4 <= end; ox += 4) {
      const Vec4 dv = load4(d + ox);
      const float* xs = xr[0] + ox * stride - g.pl;
      for (std::size_t j = 0; j < g.kw; ++j)
        store4(acc + j * 4, load4(acc + j * 4) + dv * load4(xs + j * g.dw, stride));
    }
  }
  return ox;
}

// Dispatches on the kernel width: four channels at once for the common widths, else one.
template <bool Unit>
std::size_t weight_chunks(float* acc, std::size_t cstride, std::size_t channels,
                          const float* const* xr, const float* d, std::size_t ox, std::size_t end,
                          const ConvGeometry& g) {
  if (channels == 4) switch (g.kw) {
      case 1:
        return weight_row_chunks<4, 1, Unit>(acc, cstride, xr, d, ox, end, g);
      case 3:
        return weight_row_chunks<4, 3, Unit>(acc, cstride, xr, d, ox, end, g);
      case 5:
        return weight_row_chunks<4, 5, Unit>(acc, cstride, xr, d, ox, end, g);
      default:
        break;
    }
  std::size_t done = ox;
  for (std::size_t c = 0; c < channels; ++c) {
    float* ac = acc + c * cstride;
    switch (g.kw) {
      case 1:
        done = weight_row_chunks<1, 1, Unit>(ac, cstride, xr + c, d, ox, end, g);
        break;
      case 3:
        done = weight_row_chunks<1, 3, Unit>(ac, cstride, xr + c, d, ox, end, g);
        break;
      default:
        done = weight_row_chunks<1, 0, Unit>(ac, cstride, xr + c, d, ox, end, g);
        break;
    }
  }
  return done;
}

// ConvGradWeight: dw[o, c0:c1] summed over the tile's batch and output rows; x local
// [nb, cc, hr, w] from input row ir0, dy local [nb, ob, oyr, ow] of output rows
// [oy0, oy0 + oyr). Per region: o, first input channel of o's group in x, c0, c1. Each weight
// accumulates four interleaved partial sums (output columns mod 4), added at the end.
void conv_grad_weight(const VertexContext& c) {
  const ConvGeometry g = ConvGeometry::read(c);
  const std::size_t k = ConvGeometry::kParams;
  const std::size_t nb = c.size_param(k), cc = c.size_param(k + 1), hr = c.size_param(k + 2),
                    ir0 = c.size_param(k + 3), ob = c.size_param(k + 4), oyr = c.size_param(k + 5),
                    oy0 = c.size_param(k + 6);
  const float* x = c.region<const float>(0).data();
  const float* dy = c.region<const float>(1).data();
  const auto [lo, hi] = interior(column_ranges(g), g.ow);
  const std::size_t taps = g.kh * g.kw, cstride = taps * 4;
  constexpr std::size_t kGroup = 4;  // input channels accumulated together
  std::vector<float> acc(kGroup * cstride);
  // The columns the 4-wide chunks leave (borders and the interior's tail), with their kernel
  // columns inside the image and the input column of the first.
  struct BorderColumn {
    std::size_t col, j0, j1, at;
  };
  std::vector<BorderColumn> borders;
  const std::size_t done = lo + (hi - lo) / 4 * 4;
  for (std::size_t col = 0; col < g.ow; ++col) {
    if (col >= lo && col < done) continue;
    const auto [j0, j1] = kernel_columns(col, g);
    if (j0 < j1) borders.push_back({col, j0, j1, col * g.sw + j0 * g.dw - g.pl});
  }
  for (std::size_t r = 0; r < c.regions(2); ++r) {
    auto out = c.region<float>(2, r);
    const std::size_t o = c.size_param(k + 7 + 4 * r), xoff = c.size_param(k + 8 + 4 * r),
                      c0 = c.size_param(k + 9 + 4 * r), c1 = c.size_param(k + 10 + 4 * r);
    for (std::size_t cg = c0; cg < c1; cg += kGroup) {
      const std::size_t channels = std::min(kGroup, c1 - cg);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (std::size_t b = 0; b < nb; ++b) {
        const float* dyplane = dy + (b * ob + o) * oyr * g.ow;
        for (std::size_t oy = oy0; oy < oy0 + oyr; ++oy) {
          const float* d = dyplane + (oy - oy0) * g.ow;
          for (std::size_t i = 0; i < g.kh; ++i) {
            const Index iy = signed_of(oy * g.sh + i * g.dh) - signed_of(g.pt);
            if (iy < 0 || iy >= signed_of(g.h)) continue;
            const float* xr[kGroup];
            for (std::size_t q = 0; q < channels; ++q)
              xr[q] =
                  x + ((b * cc + xoff + cg + q) * hr + static_cast<std::size_t>(iy) - ir0) * g.w;
            float* ai = acc.data() + i * g.kw * 4;
            if (g.sw == 1)
              weight_chunks<true>(ai, cstride, channels, xr, d, lo, hi, g);
            else
              weight_chunks<false>(ai, cstride, channels, xr, d, lo, hi, g);
            for (const BorderColumn& bc : borders) {
              const float dv = d[bc.col];
              for (std::size_t q = 0; q < channels; ++q) {
                float* a = ai + q * cstride + bc.col % 4;
                const float* xs = xr[q] + bc.at;
                for (std::size_t j = bc.j0; j < bc.j1; ++j) a[j * 4] += dv * xs[(j - bc.j0) * g.dw];
              }
            }
          }
        }
      }
      for (std::size_t q = 0; q < channels; ++q)
        for (std::size_t t = 0; t < taps; ++t) {
          const float* a = acc.data() + q * cstride + t * 4;
          out[(cg + q - c0) * taps + t] = (a[0] + a[1]) + (a[2] + a[3]);
        }
    }
  }
}

std::size_t region_elements(const Vertex& v, std::size_t field) {
  std::size_t n = 0;
  for (const auto& t : v.fields[field]) n += t.elements();
  return n;
}

}  // namespace

void register_conv_codelets(CodeletRegistry& r) {
  const std::size_t k = ConvGeometry::kParams;
  r.add({"ConvForward",
         "rows of output planes of a 2-D convolution from the tile's input rows (with halo) "
         "and weight slice; params: geometry (h w oh ow kh kw sh sw dh dw pad_top pad_left), "
         "local channels, local rows, first row, channels per group, output rows, then per "
         "output region: batch, weight offset, first input channel",
         {"x", "w", "out"},
         conv_forward,
         [k](const Vertex& v, const ArchPreset& a) {
           const double taps = v.params[k + 3] * v.params[4] * v.params[5];
           return mac_cycles(a, static_cast<double>(region_elements(v, 2)), taps,
                             v.fields[0][0].dtype());
         },
         {"out"}});
  r.add({"ConvGradInput",
         "rows of input-gradient planes of a 2-D convolution: each tap's sum over the group's "
         "output channels, added where the tap lands; params: geometry, local dy channels, "
         "local dy rows, first dy row, output channels per group, input rows, then per region: "
         "batch, first dy channel, weight offset, weight stride between output channels",
         {"dy", "w", "dx"},
         conv_grad_input,
         [k](const Vertex& v, const ArchPreset& a) {
           // Only one tap in stride_h x stride_w lands on a given input pixel.
           const double taps =
               v.params[k + 3] * v.params[4] * v.params[5] / (v.params[6] * v.params[7]);
           return mac_cycles(a, static_cast<double>(region_elements(v, 2)), taps,
                             v.fields[0][0].dtype());
         },
         {"dx"}});
  r.add({"ConvGradWeight",
         "weight gradients of a 2-D convolution summed over the tile's batch and output rows; "
         "params: geometry, batch, local x channels, rows, first row, local dy channels, "
         "rows, first row, then per region: output channel, first input channel, c0, c1",
         {"x", "dy", "dw"},
         conv_grad_weight,
         [k](const Vertex& v, const ArchPreset& a) {
           const double per_weight = v.params[k] * v.params[k + 5] * v.params[3];
           return mac_cycles(a, static_cast<double>(region_elements(v, 2)), per_weight,
                             v.fields[0][0].dtype());
         },
         {"dw"}});
  r.add({"ConvPartialsSum",
         "out = the sum of the partial regions, in order (the reduction over tiles of weight "
         "gradients)",
         {"partials", "out"},
         [](const VertexContext& c) {
           auto out = c.region<float>(1);
           std::fill(out.begin(), out.end(), 0.f);
           for (std::size_t p = 0; p < c.regions(0); ++p) {
             auto in = c.region<const float>(0, p);
             for (std::size_t i = 0; i < out.size(); ++i) out[i] += in[i];
           }
         },
         [](const Vertex& v, const ArchPreset& a) {
           return vector_cycles(a, region_elements(v, 0), 1);
         },
         {"out"}});
}

namespace ops {
namespace {

std::string shape_str(const std::vector<std::size_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

std::size_t ceil_div(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

// Everything about one convolution in the forward direction's terms (x -> y).
struct Dims {
  std::size_t n, ci, h, w, co, kh, kw, oh, ow, groups, cig, cog, taps;
  ConvParams p;
  ConvGeometry geometry() const {
    return {h,          w,          oh,           ow,           kh,        kw,
            p.stride_h, p.stride_w, p.dilation_h, p.dilation_w, p.pad_top, p.pad_left};
  }
  // Input rows [first, end) that output rows [r0, r1) read, clipped to the image.
  std::pair<std::size_t, std::size_t> input_rows(std::size_t r0, std::size_t r1) const {
    const Index lo = signed_of(r0 * p.stride_h) - signed_of(p.pad_top);
    const Index hi =
        signed_of((r1 - 1) * p.stride_h + (kh - 1) * p.dilation_h + 1) - signed_of(p.pad_top);
    const Index b = std::clamp<Index>(lo, 0, signed_of(h)),
                e = std::clamp<Index>(hi, 0, signed_of(h));
    if (b >= e) return {0, std::min<std::size_t>(h, 1)};  // all padding: never read
    return {static_cast<std::size_t>(b), static_cast<std::size_t>(e)};
  }
  // Output rows [first, end) whose taps land in input rows [r0, r1).
  std::pair<std::size_t, std::size_t> output_rows(std::size_t r0, std::size_t r1) const {
    const Index s = signed_of(p.stride_h);
    const Index lo_num = signed_of(r0 + p.pad_top) - signed_of((kh - 1) * p.dilation_h);
    const Index lo = lo_num <= 0 ? 0 : (lo_num + s - 1) / s;
    const Index hi = (signed_of(r1 - 1 + p.pad_top)) / s + 1;
    const Index b = std::clamp<Index>(lo, 0, signed_of(oh)),
                e = std::clamp<Index>(hi, 0, signed_of(oh));
    if (b >= e) return {0, std::min<std::size_t>(oh, 1)};  // no tap lands here
    return {static_cast<std::size_t>(b), static_cast<std::size_t>(e)};
  }
  // Input channels of the groups that output channels [o0, o1) belong to.
  std::pair<std::size_t, std::size_t> input_channels(std::size_t o0, std::size_t o1) const {
    return {o0 / cog * cig, ((o1 - 1) / cog + 1) * cig};
  }
  std::pair<std::size_t, std::size_t> output_channels(std::size_t c0, std::size_t c1) const {
    return {c0 / cig * cog, ((c1 - 1) / cig + 1) * cog};
  }
  // Upper bounds over blocks of bc channels: input channels for an output block, and back.
  std::size_t input_channels_bound(std::size_t bc) const {
    const std::size_t g = (bc - 1) / cog + 1 + (cog > 1 && bc % cog != 0 ? 1 : 0);
    return std::min(groups, g) * cig;
  }
  std::size_t output_channels_bound(std::size_t bc) const {
    const std::size_t g = (bc - 1) / cig + 1 + (cig > 1 && bc % cig != 0 ? 1 : 0);
    return std::min(groups, g) * cog;
  }
};

void expect(bool ok, const std::string& name, const std::string& what) {
  if (!ok) throw std::invalid_argument(name + ": " + what);
}

Dims make_dims(const std::vector<std::size_t>& x, const std::vector<std::size_t>& wt,
               const ConvParams& p, const std::string& name) {
  expect(x.size() == 4, name, "input must be [n, channels, height, width], got " + shape_str(x));
  expect(wt.size() == 4, name,
         "weight must be [out_channels, in_channels/groups, kh, kw], got " + shape_str(wt));
  expect(
      p.groups >= 1 && p.stride_h >= 1 && p.stride_w >= 1 && p.dilation_h >= 1 && p.dilation_w >= 1,
      name, "groups, strides and dilations must be at least 1");
  expect(wt[2] >= 1 && wt[3] >= 1, name, "kernel " + shape_str(wt) + " is empty");
  expect(x[1] % p.groups == 0 && wt[0] % p.groups == 0, name,
         "in_channels " + std::to_string(x[1]) + " and out_channels " + std::to_string(wt[0]) +
             " must be divisible by groups " + std::to_string(p.groups));
  expect(wt[1] * p.groups == x[1], name,
         "weight " + shape_str(wt) + " expects " + std::to_string(wt[1] * p.groups) +
             " input channels with groups " + std::to_string(p.groups) + ", input " + shape_str(x) +
             " has " + std::to_string(x[1]));
  Dims d{};
  d.p = p;
  d.n = x[0], d.ci = x[1], d.h = x[2], d.w = x[3];
  d.co = wt[0], d.kh = wt[2], d.kw = wt[3];
  d.groups = p.groups, d.cig = d.ci / p.groups, d.cog = d.co / p.groups;
  d.taps = d.kh * d.kw;
  d.oh = conv_output_size(d.h, p.pad_top + p.pad_bottom, d.kh, p.dilation_h, p.stride_h);
  d.ow = conv_output_size(d.w, p.pad_left + p.pad_right, d.kw, p.dilation_w, p.stride_w);
  expect(d.oh > 0 && d.ow > 0, name,
         "kernel " + shape_str(wt) + " with dilation " + std::to_string(p.dilation_h) + "x" +
             std::to_string(p.dilation_w) + " does not fit input " + shape_str(x) + " padded by " +
             std::to_string(p.pad_top) + "," + std::to_string(p.pad_bottom) + "," +
             std::to_string(p.pad_left) + "," + std::to_string(p.pad_right) +
             "; use a smaller kernel or more padding");
  expect(d.n > 0 && d.ci > 0 && d.co > 0, name,
         "empty batch or channels: input " + shape_str(x) + ", weight " + shape_str(wt));
  return d;
}

// float16 operands are computed on in float32 (see Codelet::reads_float16_storage); the two
// operands of one convolution share a type.
void expect_f32(const Tensor& t, const std::string& name, const char* what) {
  expect(t.dtype() == DType::f32 || t.dtype() == DType::f16, name,
         std::string(what) + " must be float32 or float16, got " + dtype_name(t.dtype()));
}
void expect_same_type(const Tensor& a, const Tensor& b, const std::string& name) {
  expect(a.dtype() == b.dtype(), name,
         std::string("operands of one type expected, got ") + dtype_name(a.dtype()) + " and " +
             dtype_name(b.dtype()) + "; cast one of them");
}

// Distinct block sizes ceil(n / k) for k = 1..n, largest first.
std::vector<std::size_t> block_sizes(std::size_t n) {
  std::vector<std::size_t> out;
  for (std::size_t k = 1; k <= n; ++k) {
    const std::size_t b = ceil_div(n, k);
    if (out.empty() || out.back() != b) out.push_back(b);
  }
  return out;
}

struct Estimate {
  double bytes, cycles;
};

// Tries every batch x channel x row blocking that fits the IPU's tiles and keeps the fastest
// whose busiest tile stays within the available memory proportion (or, if none does, the
// smallest, which the engine will then report as out of memory).
template <class F>
ConvPlan search_plan(const ArchPreset& arch, double proportion, std::size_t batch,
                     std::size_t channels, std::size_t rows, F&& estimate) {
  const double budget = proportion * static_cast<double>(arch.bytes_per_tile);
  ConvPlan best;
  double best_cycles = std::numeric_limits<double>::infinity();
  double best_bytes = std::numeric_limits<double>::infinity();
  bool have = false;
  for (std::size_t bn : block_sizes(batch)) {
    const std::size_t nbb = ceil_div(batch, bn);
    if (nbb > arch.tiles) continue;
    for (std::size_t bc : block_sizes(channels)) {
      const std::size_t ncb = ceil_div(channels, bc);
      if (nbb * ncb > arch.tiles) continue;
      for (std::size_t br : block_sizes(rows)) {
        const std::size_t nrb = ceil_div(rows, br);
        if (nbb * ncb * nrb > arch.tiles) continue;
        const Estimate e = estimate(bn, bc, br, nbb * nrb);
        const bool fits = e.bytes <= budget, best_fits = best_bytes <= budget;
        const bool better = !have || (fits && !best_fits) ||
                            (fits && best_fits &&
                             (e.cycles < best_cycles ||
                              (e.cycles == best_cycles && nbb * ncb * nrb < best.tiles()))) ||
                            (!fits && !best_fits && e.bytes < best_bytes);
        if (!better) continue;
        have = true;
        best = {bn,
                bc,
                br,
                nbb,
                ncb,
                nrb,
                static_cast<std::size_t>(e.bytes),
                static_cast<std::uint64_t>(e.cycles),
                fits};
        best_cycles = e.cycles;
        best_bytes = e.bytes;
      }
    }
  }
  return best;
}

double exchange_cycles(const ArchPreset& arch, double bytes) {
  return static_cast<double>(arch.exchange_latency_cycles) +
         bytes / arch.exchange_bytes_per_cycle_per_tile;
}

double compute_cycles(const ArchPreset& arch, double macs) {
  return static_cast<double>(arch.vertex_overhead_cycles) +
         2.0 * macs / arch.fp32_flops_per_cycle_per_tile;
}

ConvPlan plan_forward(const ArchPreset& arch, double proportion, const Dims& d) {
  return search_plan(
      arch, proportion, d.n, d.co, d.oh, [&](double bn, std::size_t bc, std::size_t br, auto) {
        const double hr = static_cast<double>(
            std::min(d.h, (br - 1) * d.p.stride_h + (d.kh - 1) * d.p.dilation_h + 1));
        const double in = 4.0 * bn * static_cast<double>(d.input_channels_bound(bc)) * hr * d.w;
        const double wt = 4.0 * static_cast<double>(bc * d.cig * d.taps);
        const double out = 4.0 * bn * static_cast<double>(bc * br * d.ow);
        const double macs = bn * static_cast<double>(bc * br * d.ow * d.cig * d.taps);
        return Estimate{in + wt + out, compute_cycles(arch, macs) + exchange_cycles(arch, in + wt)};
      });
}

ConvPlan plan_grad_input(const ArchPreset& arch, double proportion, const Dims& d) {
  return search_plan(
      arch, proportion, d.n, d.ci, d.h, [&](double bn, std::size_t bc, std::size_t br, auto) {
        const double oyr = static_cast<double>(
            std::min(d.oh, (br + (d.kh - 1) * d.p.dilation_h) / d.p.stride_h + 1));
        const double in = 4.0 * bn * static_cast<double>(d.output_channels_bound(bc)) * oyr * d.ow;
        const double wt = 4.0 * static_cast<double>(bc * d.cog * d.taps);
        const double out = 4.0 * bn * static_cast<double>(bc * br * d.w);
        const double macs = bn * static_cast<double>(bc * br * d.w * d.cog * d.taps) /
                            static_cast<double>(d.p.stride_h * d.p.stride_w);
        return Estimate{in + wt + out, compute_cycles(arch, macs) + exchange_cycles(arch, in + wt)};
      });
}

// Blocks over output channels; batch and output rows are the reduction, split into parts.
ConvPlan plan_grad_weight(const ArchPreset& arch, double proportion, const Dims& d) {
  return search_plan(
      arch, proportion, d.n, d.co, d.oh,
      [&](double bn, std::size_t bc, std::size_t br, std::size_t parts) {
        const double hr = static_cast<double>(
            std::min(d.h, (br - 1) * d.p.stride_h + (d.kh - 1) * d.p.dilation_h + 1));
        const double in = 4.0 * bn * static_cast<double>(d.input_channels_bound(bc)) * hr * d.w;
        const double dy = 4.0 * bn * static_cast<double>(bc * br * d.ow);
        const double partial = 4.0 * static_cast<double>(bc * d.cig * d.taps);
        const double macs = bn * static_cast<double>(bc * br * d.ow * d.cig * d.taps);
        double cycles = compute_cycles(arch, macs) + exchange_cycles(arch, in + dy);
        double bytes = in + dy + partial;
        if (parts > 1) {  // gather the other parts' slices, sum them
          const double gathered = partial * static_cast<double>(parts - 1) / parts;
          bytes += gathered + partial / parts;
          cycles += exchange_cycles(arch, gathered) +
                    static_cast<double>(arch.sync_cycles_internal) +
                    static_cast<double>(
                        vector_cycles(arch, static_cast<std::size_t>(partial / 4.0 / parts), 1) *
                        parts / arch.workers_per_tile);
        }
        return Estimate{bytes, cycles};
      });
}

// Adds the copies of channels [c0, c1), rows [r0, r1) of batch element b of src (NCHW) into
// dst's local block [channels, rows, width]: one pair when the rows are whole planes (the
// channels are then contiguous in both), else one per channel.
void add_plane_copies(std::vector<std::pair<Tensor, Tensor>>& copies, const Tensor& src,
                      std::size_t b, std::size_t c0, std::size_t c1, std::size_t r0, std::size_t r1,
                      const Tensor& dst_block) {
  if (r0 == 0 && r1 == src.dim(2)) {
    copies.emplace_back(src.row(b).rows(c0, c1).flatten(), dst_block.flatten());
    return;
  }
  for (std::size_t ch = c0; ch < c1; ++ch)
    copies.emplace_back(src.row(b).row(ch).rows(r0, r1).flatten(),
                        dst_block.row(ch - c0).flatten());
}

// Tiles of one op start at a place that depends on its name, so that layers spread their
// activations over the IPU instead of piling them onto the first tiles.
unsigned first_tile(const Graph& graph, const std::string& name) {
  std::uint32_t h = 2166136261u;  // FNV-1a
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 16777619u;
  return h % graph.tiles();
}

}  // namespace

void for_each_work_split(
    std::size_t items, std::size_t rows, std::size_t workers,
    const std::function<void(std::size_t, std::size_t, std::size_t, std::size_t)>& fn) {
  if (items == 0 || rows == 0) return;
  if (items >= workers) {
    const std::size_t per = ceil_div(items, workers);
    for (std::size_t i = 0; i < items; i += per) fn(i, std::min(items, i + per), 0, rows);
    return;
  }
  const std::size_t chunks = std::min(rows, ceil_div(workers, items));
  const std::size_t per = ceil_div(rows, chunks);
  for (std::size_t i = 0; i < items; ++i)
    for (std::size_t r = 0; r < rows; r += per) fn(i, i + 1, r, std::min(rows, r + per));
}

std::size_t conv_output_size(std::size_t in, std::size_t pad_sum, std::size_t kernel,
                             std::size_t dilation, std::size_t stride) {
  if (kernel == 0 || stride == 0 || dilation == 0) return 0;
  const std::size_t span = dilation * (kernel - 1) + 1;
  if (in + pad_sum < span) return 0;
  return (in + pad_sum - span) / stride + 1;
}

std::vector<std::size_t> conv2d_output_shape(const std::vector<std::size_t>& x_shape,
                                             const std::vector<std::size_t>& w_shape,
                                             const ConvParams& params, const std::string& name) {
  const Dims d = make_dims(x_shape, w_shape, params, name);
  return {d.n, d.co, d.oh, d.ow};
}

std::vector<std::size_t> conv_transpose2d_output_shape(const std::vector<std::size_t>& x,
                                                       const std::vector<std::size_t>& wt,
                                                       const ConvParams& p,
                                                       const std::string& name) {
  expect(x.size() == 4, name, "input must be [n, channels, height, width], got " + shape_str(x));
  expect(
      p.groups >= 1 && p.stride_h >= 1 && p.stride_w >= 1 && p.dilation_h >= 1 && p.dilation_w >= 1,
      name, "groups, strides and dilations must be at least 1");
  expect(wt.size() == 4 && wt[0] == x[1] && x[1] % p.groups == 0 && wt[2] >= 1 && wt[3] >= 1, name,
         "weight must be [" + std::to_string(x[1]) +
             ", out_channels/groups, kh, kw] with in_channels divisible by groups " +
             std::to_string(p.groups) + ", got " + shape_str(wt));
  expect(p.output_padding_h < std::max(p.stride_h, p.dilation_h) &&
             p.output_padding_w < std::max(p.stride_w, p.dilation_w),
         name,
         "output_padding " + std::to_string(p.output_padding_h) + "x" +
             std::to_string(p.output_padding_w) + " must be smaller than stride or dilation");
  const Index oh = signed_of((x[2] - 1) * p.stride_h) - signed_of(p.pad_top + p.pad_bottom) +
                   signed_of(p.dilation_h * (wt[2] - 1) + p.output_padding_h + 1);
  const Index ow = signed_of((x[3] - 1) * p.stride_w) - signed_of(p.pad_left + p.pad_right) +
                   signed_of(p.dilation_w * (wt[3] - 1) + p.output_padding_w + 1);
  expect(x[2] > 0 && x[3] > 0 && oh > 0 && ow > 0, name,
         "padding leaves no output for input " + shape_str(x) + " and weight " + shape_str(wt));
  return {x[0], wt[1] * p.groups, static_cast<std::size_t>(oh), static_cast<std::size_t>(ow)};
}

ConvPlan plan_conv2d(const ArchPreset& arch, const std::vector<std::size_t>& x_shape,
                     const std::vector<std::size_t>& w_shape, const ConvParams& params,
                     double proportion) {
  return plan_forward(arch, proportion, make_dims(x_shape, w_shape, params, "conv2d"));
}

Tensor conv2d(Graph& graph, Program& prog, const Tensor& x, const Tensor& w,
              const ConvParams& params, const std::string& name) {
  expect_f32(x, name, "input");
  expect_f32(w, name, "weight");
  expect_same_type(x, w, name);
  const Dims d = make_dims(x.shape(), w.shape(), params, name);
  const ConvPlan plan = plan_forward(graph.arch(), graph.available_memory_proportion(), d);
  const unsigned first = first_tile(graph, name);
  const auto tile_of = [&](std::size_t bb, std::size_t cb, std::size_t rb) {
    return static_cast<unsigned>((first + (bb * plan.channel_blocks + cb) * plan.row_blocks + rb) %
                                 graph.tiles());
  };
  Tensor y = graph.add_variable(x.dtype(), {d.n, d.co, d.oh, d.ow}, name);
  for (std::size_t b = 0; b < d.n; ++b)
    for (std::size_t o = 0; o < d.co; ++o)
      for (std::size_t rb = 0; rb < plan.row_blocks; ++rb) {
        const std::size_t r0 = rb * plan.row_block, r1 = std::min(d.oh, r0 + plan.row_block);
        graph.set_tile_mapping(y.row(b).row(o).rows(r0, r1),
                               tile_of(b / plan.batch_block, o / plan.channel_block, rb));
      }
  std::vector<std::pair<Tensor, Tensor>> copies;
  const ComputeSetId cs = graph.add_compute_set(name);
  const ConvGeometry geo = d.geometry();
  for (std::size_t bb = 0; bb < plan.batch_blocks; ++bb)
    for (std::size_t cb = 0; cb < plan.channel_blocks; ++cb)
      for (std::size_t rb = 0; rb < plan.row_blocks; ++rb) {
        const std::size_t b0 = bb * plan.batch_block, b1 = std::min(d.n, b0 + plan.batch_block);
        const std::size_t o0 = cb * plan.channel_block,
                          o1 = std::min(d.co, o0 + plan.channel_block);
        const std::size_t r0 = rb * plan.row_block, r1 = std::min(d.oh, r0 + plan.row_block);
        if (b0 >= b1 || o0 >= o1 || r0 >= r1) continue;
        const unsigned tile = tile_of(bb, cb, rb);
        const auto [c0, c1] = d.input_channels(o0, o1);
        const auto [ir0, ir1] = d.input_rows(r0, r1);
        const std::string at = "@" + std::to_string(tile);
        Tensor xl = graph.add_variable(x.dtype(), {b1 - b0, c1 - c0, ir1 - ir0, d.w},
                                       name + "/x" + at, MemoryCategory::temporary);
        Tensor wl = graph.add_variable(w.dtype(), {o1 - o0, d.cig, d.kh, d.kw}, name + "/w" + at,
                                       MemoryCategory::temporary);
        graph.set_tile_mapping(xl, tile);
        graph.set_tile_mapping(wl, tile);
        for (std::size_t b = b0; b < b1; ++b)
          add_plane_copies(copies, x, b, c0, c1, ir0, ir1, xl.row(b - b0));
        copies.emplace_back(w.rows(o0, o1).flatten(), wl.flatten());
        const std::size_t ob = o1 - o0;
        for_each_work_split(
            (b1 - b0) * ob, r1 - r0, graph.arch().workers_per_tile,
            [&](std::size_t i0, std::size_t i1, std::size_t q0, std::size_t q1) {
              Vertex v{"ConvForward", tile, {{xl.flatten()}, {wl.flatten()}, {}}, {}};
              geo.append(v.params);
              for (double p : {double(c1 - c0), double(ir1 - ir0), double(ir0), double(d.cig),
                               double(r0 + q0), double(r0 + q1)})
                v.params.push_back(p);
              for (std::size_t i = i0; i < i1; ++i) {
                const std::size_t b = b0 + i / ob, o = o0 + i % ob;
                v.fields[2].push_back(y.row(b).row(o).rows(r0 + q0, r0 + q1).flatten());
                v.params.push_back(double(b - b0));
                v.params.push_back(double((o - o0) * d.cig * d.taps));
                v.params.push_back(double(o / d.cog * d.cig - c0));
              }
              graph.add_vertex(cs, std::move(v));
            });
      }
  prog.add(Program::copy(std::move(copies)));
  prog.add(Program::execute(cs));
  return y;
}

namespace {

// dx from dy and w for the dimensions d (whose output size may be smaller than the forward
// formula's when a transposed convolution's output padding exceeds its stride).
Tensor grad_input(Graph& graph, Program& prog, const Tensor& dy, const Tensor& w, const Dims& d,
                  const std::string& name) {
  const std::vector<std::size_t> input_shape = {d.n, d.ci, d.h, d.w};
  const ConvPlan plan = plan_grad_input(graph.arch(), graph.available_memory_proportion(), d);
  const unsigned first = first_tile(graph, name);
  const auto tile_of = [&](std::size_t bb, std::size_t cb, std::size_t rb) {
    return static_cast<unsigned>((first + (bb * plan.channel_blocks + cb) * plan.row_blocks + rb) %
                                 graph.tiles());
  };
  Tensor dx = graph.add_variable(dy.dtype(), input_shape, name);
  for (std::size_t b = 0; b < d.n; ++b)
    for (std::size_t c = 0; c < d.ci; ++c)
      for (std::size_t rb = 0; rb < plan.row_blocks; ++rb) {
        const std::size_t r0 = rb * plan.row_block, r1 = std::min(d.h, r0 + plan.row_block);
        graph.set_tile_mapping(dx.row(b).row(c).rows(r0, r1),
                               tile_of(b / plan.batch_block, c / plan.channel_block, rb));
      }
  std::vector<std::pair<Tensor, Tensor>> copies;
  const ComputeSetId cs = graph.add_compute_set(name);
  const ConvGeometry geo = d.geometry();
  for (std::size_t bb = 0; bb < plan.batch_blocks; ++bb)
    for (std::size_t cb = 0; cb < plan.channel_blocks; ++cb)
      for (std::size_t rb = 0; rb < plan.row_blocks; ++rb) {
        const std::size_t b0 = bb * plan.batch_block, b1 = std::min(d.n, b0 + plan.batch_block);
        const std::size_t c0 = cb * plan.channel_block,
                          c1 = std::min(d.ci, c0 + plan.channel_block);
        const std::size_t r0 = rb * plan.row_block, r1 = std::min(d.h, r0 + plan.row_block);
        if (b0 >= b1 || c0 >= c1 || r0 >= r1) continue;
        const unsigned tile = tile_of(bb, cb, rb);
        const auto [q0, q1] = d.output_channels(c0, c1);
        const auto [oy0, oy1] = d.output_rows(r0, r1);
        const std::string at = "@" + std::to_string(tile);
        Tensor dyl = graph.add_variable(dy.dtype(), {b1 - b0, q1 - q0, oy1 - oy0, d.ow},
                                        name + "/dy" + at, MemoryCategory::temporary);
        // Weights grouped by group: for each group the block touches, [cog, its channels, taps].
        const std::size_t g0 = c0 / d.cig, g1 = (c1 - 1) / d.cig + 1;
        std::vector<std::size_t> group_offset(g1 - g0 + 1, 0);
        for (std::size_t gr = g0; gr < g1; ++gr) {
          const std::size_t l0 = std::max(c0, gr * d.cig), l1 = std::min(c1, (gr + 1) * d.cig);
          group_offset[gr - g0 + 1] = group_offset[gr - g0] + d.cog * (l1 - l0) * d.taps;
        }
        Tensor wl = graph.add_variable(w.dtype(), {group_offset.back()}, name + "/w" + at,
                                       MemoryCategory::temporary);
        graph.set_tile_mapping(dyl, tile);
        graph.set_tile_mapping(wl, tile);
        for (std::size_t b = b0; b < b1; ++b)
          add_plane_copies(copies, dy, b, q0, q1, oy0, oy1, dyl.row(b - b0));
        for (std::size_t gr = g0; gr < g1; ++gr) {
          const std::size_t l0 = std::max(c0, gr * d.cig) - gr * d.cig,
                            l1 = std::min(c1, (gr + 1) * d.cig) - gr * d.cig;
          const std::size_t len = (l1 - l0) * d.taps;
          if (l1 - l0 == d.cig) {  // the group's whole weights, contiguous in w and in wl
            const std::size_t at_w = group_offset[gr - g0];
            copies.emplace_back(w.rows(gr * d.cog, (gr + 1) * d.cog).flatten(),
                                wl.slice(at_w, at_w + d.cog * len));
            continue;
          }
          for (std::size_t o = 0; o < d.cog; ++o) {
            const std::size_t at_w = group_offset[gr - g0] + o * len;
            copies.emplace_back(w.row(gr * d.cog + o).rows(l0, l1).flatten(),
                                wl.slice(at_w, at_w + len));
          }
        }
        const std::size_t cb_size = c1 - c0;
        for_each_work_split(
            (b1 - b0) * cb_size, r1 - r0, graph.arch().workers_per_tile,
            [&](std::size_t i0, std::size_t i1, std::size_t s0, std::size_t s1) {
              Vertex v{"ConvGradInput", tile, {{dyl.flatten()}, {wl}, {}}, {}};
              geo.append(v.params);
              for (double p : {double(q1 - q0), double(oy1 - oy0), double(oy0), double(d.cog),
                               double(r0 + s0), double(r0 + s1)})
                v.params.push_back(p);
              for (std::size_t i = i0; i < i1; ++i) {
                const std::size_t b = b0 + i / cb_size, c = c0 + i % cb_size;
                const std::size_t gr = c / d.cig;
                const std::size_t l0 = std::max(c0, gr * d.cig) - gr * d.cig,
                                  l1 = std::min(c1, (gr + 1) * d.cig) - gr * d.cig;
                v.fields[2].push_back(dx.row(b).row(c).rows(r0 + s0, r0 + s1).flatten());
                v.params.push_back(double(b - b0));
                v.params.push_back(double(gr * d.cog - q0));
                v.params.push_back(double(group_offset[gr - g0] + (c - gr * d.cig - l0) * d.taps));
                v.params.push_back(double((l1 - l0) * d.taps));
              }
              graph.add_vertex(cs, std::move(v));
            });
      }
  prog.add(Program::copy(std::move(copies)));
  prog.add(Program::execute(cs));
  return dx;
}

}  // namespace

Tensor conv2d_grad_input(Graph& graph, Program& prog, const Tensor& dy, const Tensor& w,
                         const std::vector<std::size_t>& input_shape, const ConvParams& params,
                         const std::string& name) {
  expect_f32(dy, name, "output gradient");
  expect_f32(w, name, "weight");
  expect_same_type(dy, w, name);
  const Dims d = make_dims(input_shape, w.shape(), params, name);
  const std::vector<std::size_t> dy_shape = {d.n, d.co, d.oh, d.ow};
  expect(dy.shape() == dy_shape, name,
         "output gradient must be " + shape_str(dy_shape) + " for input " + shape_str(input_shape) +
             " and weight " + shape_str(w.shape()) + ", got " + shape_str(dy.shape()));
  return grad_input(graph, prog, dy, w, d, name);
}

Tensor conv2d_grad_weight(Graph& graph, Program& prog, const Tensor& dy, const Tensor& x,
                          const std::vector<std::size_t>& weight_shape, const ConvParams& params,
                          const std::string& name) {
  expect_f32(dy, name, "output gradient");
  expect_f32(x, name, "input");
  expect_same_type(dy, x, name);
  const Dims d = make_dims(x.shape(), weight_shape, params, name);
  const std::vector<std::size_t> dy_shape = {d.n, d.co, d.oh, d.ow};
  expect(dy.shape() == dy_shape, name,
         "output gradient must be " + shape_str(dy_shape) + " for input " + shape_str(x.shape()) +
             " and weight " + shape_str(weight_shape) + ", got " + shape_str(dy.shape()));
  const ConvPlan plan = plan_grad_weight(graph.arch(), graph.available_memory_proportion(), d);
  const std::size_t parts = plan.batch_blocks * plan.row_blocks;
  const unsigned first = first_tile(graph, name);
  // Tile of output-channel block cb and reduction part p (batch block x row block).
  const auto tile_of = [&](std::size_t cb, std::size_t p) {
    return static_cast<unsigned>((first + cb * parts + p) % graph.tiles());
  };
  Tensor dw = graph.add_variable(x.dtype(), weight_shape, name);
  std::vector<std::pair<Tensor, Tensor>> copies;
  const ComputeSetId cs = graph.add_compute_set(name);
  const ConvGeometry geo = d.geometry();
  const std::size_t workers = graph.arch().workers_per_tile;
  // partials[cb][p]: the weight-gradient block of part p (dw itself when there is one part).
  std::vector<std::vector<Tensor>> partials(plan.channel_blocks);
  for (std::size_t cb = 0; cb < plan.channel_blocks; ++cb) {
    const std::size_t o0 = cb * plan.channel_block, o1 = std::min(d.co, o0 + plan.channel_block);
    if (o0 >= o1) continue;
    const auto [c0, c1] = d.input_channels(o0, o1);
    const std::size_t ob = o1 - o0;
    for (std::size_t bb = 0; bb < plan.batch_blocks; ++bb)
      for (std::size_t rb = 0; rb < plan.row_blocks; ++rb) {
        const std::size_t p = bb * plan.row_blocks + rb;
        const unsigned tile = tile_of(cb, p);
        const std::string at = "@" + std::to_string(tile);
        const std::size_t b0 = bb * plan.batch_block, b1 = std::min(d.n, b0 + plan.batch_block);
        const std::size_t r0 = rb * plan.row_block, r1 = std::min(d.oh, r0 + plan.row_block);
        Tensor part = dw.rows(o0, o1);
        if (parts > 1) {
          part = graph.add_variable(DType::f32, {ob, d.cig, d.kh, d.kw}, name + "/partial" + at,
                                    MemoryCategory::temporary);
          graph.set_tile_mapping(part, tile);
        } else {
          graph.set_tile_mapping(part, tile);
        }
        partials[cb].push_back(part);
        if (b0 >= b1 || r0 >= r1) {  // an empty part (uneven blocks) contributes zeros
          graph.add_vertex(cs, {"ConvPartialsSum", tile, {{}, {part.flatten()}}, {}});
          continue;
        }
        const auto [ir0, ir1] = d.input_rows(r0, r1);
        Tensor xl = graph.add_variable(x.dtype(), {b1 - b0, c1 - c0, ir1 - ir0, d.w},
                                       name + "/x" + at, MemoryCategory::temporary);
        Tensor dyl = graph.add_variable(dy.dtype(), {b1 - b0, ob, r1 - r0, d.ow}, name + "/dy" + at,
                                        MemoryCategory::temporary);
        graph.set_tile_mapping(xl, tile);
        graph.set_tile_mapping(dyl, tile);
        for (std::size_t b = b0; b < b1; ++b) {
          add_plane_copies(copies, x, b, c0, c1, ir0, ir1, xl.row(b - b0));
          add_plane_copies(copies, dy, b, o0, o1, r0, r1, dyl.row(b - b0));
        }
        // (output channel, input channel) pairs shared out between the workers.
        const std::size_t items = ob * d.cig;
        const std::size_t per = ceil_div(items, std::min(items, workers));
        for (std::size_t t0 = 0; t0 < items; t0 += per) {
          const std::size_t t1 = std::min(items, t0 + per);
          Vertex v{"ConvGradWeight", tile, {{xl.flatten()}, {dyl.flatten()}, {}}, {}};
          geo.append(v.params);
          for (double q : {double(b1 - b0), double(c1 - c0), double(ir1 - ir0), double(ir0),
                           double(ob), double(r1 - r0), double(r0)})
            v.params.push_back(q);
          for (std::size_t t = t0; t < t1;) {
            const std::size_t o = t / d.cig, ca = t % d.cig;
            const std::size_t ce = std::min(d.cig, ca + (t1 - t));
            v.fields[2].push_back(part.row(o).rows(ca, ce).flatten());
            v.params.push_back(double(o));
            v.params.push_back(double((o0 + o) / d.cog * d.cig - c0));
            v.params.push_back(double(ca));
            v.params.push_back(double(ce));
            t += ce - ca;
          }
          graph.add_vertex(cs, std::move(v));
        }
      }
  }
  prog.add(Program::copy(std::move(copies)));
  prog.add(Program::execute(cs));
  if (parts == 1) return dw;

  // Second stage: slice s of each block's gradient is summed on part s's tile.
  std::vector<std::pair<Tensor, Tensor>> gathers;
  const ComputeSetId reduce = graph.add_compute_set(name + "/reduce");
  for (std::size_t cb = 0; cb < plan.channel_blocks; ++cb) {
    const std::size_t o0 = cb * plan.channel_block, o1 = std::min(d.co, o0 + plan.channel_block);
    if (o0 >= o1) continue;
    const Tensor block = dw.rows(o0, o1).flatten();
    const std::size_t e = block.elements(), slices = std::min(parts, e);
    const std::size_t per = ceil_div(e, slices);
    for (std::size_t s = 0; s * per < e; ++s) {
      const std::size_t e0 = s * per, e1 = std::min(e, e0 + per), len = e1 - e0;
      const unsigned tile = tile_of(cb, s);
      graph.set_tile_mapping(block.slice(e0, e1), tile);
      Tensor gathered =
          graph.add_variable(DType::f32, {parts - 1, len},
                             name + "/gathered@" + std::to_string(tile) + "/" + std::to_string(cb),
                             MemoryCategory::temporary);
      graph.set_tile_mapping(gathered, tile);
      std::vector<Tensor> sources;
      for (std::size_t p = 0, k = 0; p < parts; ++p) {
        const Tensor piece = partials[cb][p].flatten().slice(e0, e1);
        if (p == s) {
          sources.push_back(piece);
          continue;
        }
        gathers.emplace_back(piece, gathered.row(k));
        sources.push_back(gathered.row(k++));
      }
      // The slice's elements shared out between the workers.
      const std::size_t wper = ceil_div(len, std::min(len, workers));
      for (std::size_t w0 = 0; w0 < len; w0 += wper) {
        const std::size_t w1 = std::min(len, w0 + wper);
        Vertex v{"ConvPartialsSum", tile, {{}, {block.slice(e0 + w0, e0 + w1)}}, {}};
        for (const Tensor& src : sources) v.fields[0].push_back(src.slice(w0, w1));
        graph.add_vertex(reduce, std::move(v));
      }
    }
  }
  prog.add(Program::copy(std::move(gathers)));
  prog.add(Program::execute(reduce));
  return dw;
}

Tensor conv_transpose2d(Graph& graph, Program& prog, const Tensor& x, const Tensor& w,
                        const ConvParams& params, const std::string& name) {
  expect_f32(x, name, "input");
  expect_f32(w, name, "weight");
  expect_same_type(x, w, name);
  const std::vector<std::size_t> out =
      conv_transpose2d_output_shape(x.shape(), w.shape(), params, name);
  // The transposed convolution of x is the input gradient of the convolution out -> x. With
  // output padding beyond the stride (allowed when dilation is larger) that convolution's
  // formula gives one more output row or column than x has: x covers the first ones.
  Dims d = make_dims(out, w.shape(), params, name);
  expect(d.oh >= x.dim(2) && d.ow >= x.dim(3), name,
         "internal: the convolution transposed maps " + shape_str(out) + " to " +
             std::to_string(d.oh) + "x" + std::to_string(d.ow) + ", smaller than the input " +
             shape_str(x.shape()));
  d.oh = x.dim(2);
  d.ow = x.dim(3);
  return grad_input(graph, prog, x, w, d, name);
}

}  // namespace ops
}  // namespace ipupod::ipu
