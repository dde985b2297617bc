// Convolution codelets: the forward, input-gradient and weight-gradient vertices (their loops
// written to vectorise) and their cycle estimators. Each output element sums its taps in the
// order the reference interpreter does.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ipu_process/codelets.hpp"
#include "ipu_process/ops/conv_internal.hpp"

namespace ipupod::ipu {
namespace {

using ops::conv_impl::ConvGeometry;
using ops::conv_impl::Index;
using ops::conv_impl::signed_of;

// For kernel column j: the output columns [lo, hi) whose input column ox*sw + j*dw - pl lies
// inside the image, and the input column of lo.
struct ColumnRange {
  std::size_t lo, hi, first_input;
};

// Per-thread scratch (codelets run often and briefly: no allocation per call).
const std::vector<ColumnRange>& column_ranges(const ConvGeometry& g) {
  thread_local std::vector<ColumnRange> out;
  out.resize(g.kw);
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

using Mask4 = std::int32_t __attribute__((vector_size(16)));  // lanes all ones or all zeros

// Multiply-accumulates of a vertex with `outputs` output elements of `taps` taps each.
std::uint64_t conv_mac_cycles(const ArchPreset& arch, double outputs, double taps, DType dtype,
                              const AmpShape& shape) {
  return mac_cycles(arch, outputs * taps, dtype, shape);
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
  const std::size_t begin = ox;
  ox = forward_chunks<8, Unit>(orow, taps, ox, end, g);
  ox = forward_chunks<4, Unit>(orow, taps, ox, end, g);
  // The interior's last columns: one more chunk ending at `end`. The columns it repeats get the
  // same sums in the same order again, so the same values.
  if (ox < end && end - begin >= 4) ox = forward_chunks<4, Unit>(orow, taps, end - 4, end, g);
  return ox;
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
  thread_local std::vector<RowTap> taps;
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
  const auto& cols = column_ranges(g);
  const std::size_t plane = oyr * g.ow;
  // With unit strides every input column of [ix_lo, ix_hi) is reached by every kernel column.
  const bool unit = g.sh == 1 && g.sw == 1;
  const Index ix_lo_s = std::max<Index>(0, signed_of((g.kw - 1) * g.dw) - signed_of(g.pl));
  const Index ix_hi_s = std::min<Index>(signed_of(g.w), signed_of(g.ow) - signed_of(g.pl));
  const std::size_t ix_lo = unit ? static_cast<std::size_t>(ix_lo_s) : 0;
  const std::size_t ix_hi = unit && ix_hi_s > ix_lo_s ? static_cast<std::size_t>(ix_hi_s) : ix_lo;
  thread_local std::vector<float> sum;  // the tap's contribution of every output column
  sum.resize(g.ow);
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
  thread_local std::vector<float> acc;
  acc.resize(kGroup * cstride);
  // The columns the 4-wide chunks leave (borders and the interior's tail), with their kernel
  // columns inside the image and the input column of the first.
  struct BorderColumn {
    std::size_t col, j0, j1, at;
  };
  thread_local std::vector<BorderColumn> borders;
  borders.clear();
  const std::size_t done = lo + (hi - lo) / 4 * 4;
  for (std::size_t col = 0; col < g.ow; ++col) {
    if (col >= lo && col < done) continue;
    const auto [j0, j1] = kernel_columns(col, g);
    if (j0 < j1) borders.push_back({col, j0, j1, col * g.sw + j0 * g.dw - g.pl});
  }
  // The border columns in rounds of at most one column per lane (col mod 4), a lane's columns
  // in increasing rounds: a round adds each weight's 4 partial sums one vector of products,
  // with +0 in the lanes it has no term for (a sum that starts at +0 never becomes -0, so
  // adding +0 leaves it unchanged). The other lanes read column or input column 0, masked off.
  struct BorderTap {
    std::size_t x[4];  // input column of each lane's term
    Mask4 keep;        // the lanes with a term
    bool any;
  };
  struct BorderRound {
    std::size_t col[4];
    std::size_t first_tap;  // its kw taps, one per kernel column
  };
  thread_local std::vector<BorderTap> border_taps;
  thread_local std::vector<BorderRound> rounds;
  border_taps.clear();
  rounds.clear();
  std::size_t in_lane[4] = {0, 0, 0, 0};
  for (const BorderColumn& bc : borders) {
    const std::size_t lane = bc.col % 4, round = in_lane[lane]++;
    if (round == rounds.size()) {
      rounds.push_back({{0, 0, 0, 0}, border_taps.size()});
      border_taps.resize(border_taps.size() + g.kw, BorderTap{{0, 0, 0, 0}, Mask4{}, false});
    }
    rounds[round].col[lane] = bc.col;
    for (std::size_t j = bc.j0; j < bc.j1; ++j) {
      BorderTap& t = border_taps[rounds[round].first_tap + j];
      t.x[lane] = bc.at + (j - bc.j0) * g.dw;
      t.keep[lane] = -1;
      t.any = true;
    }
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
            for (const BorderRound& br : rounds) {
              const Vec4 dv = {d[br.col[0]], d[br.col[1]], d[br.col[2]], d[br.col[3]]};
              for (std::size_t j = 0; j < g.kw; ++j) {
                const BorderTap& t = border_taps[br.first_tap + j];
                if (!t.any) continue;
                for (std::size_t q = 0; q < channels; ++q) {
                  const float* xs = xr[q];
                  const Vec4 prod = dv * Vec4{xs[t.x[0]], xs[t.x[1]], xs[t.x[2]], xs[t.x[3]]};
                  float* a = ai + q * cstride + j * 4;
                  store4(a,
                         load4(a) + reinterpret_cast<Vec4>(reinterpret_cast<Mask4>(prod) & t.keep));
                }
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
         "and weight slice; params: geometry (h w oh ow kh kw sh sw dh dw pad_top pad_left, "
         "then a group's input and output channels and half partials, for the cycle estimate), "
         "local channels, local rows, first row, channels per group, output rows, then per "
         "output region: batch, weight offset, first input channel",
         {"x", "w", "out"},
         conv_forward,
         [k](const Vertex& v, const ArchPreset& a) {
           const double taps = v.params[k + 3] * v.params[4] * v.params[5];
           return conv_mac_cycles(a, static_cast<double>(region_elements(v, 2)), taps,
                                  v.fields[0][0].dtype(), ConvGeometry::forward_shape(v));
         },
         {"out"},
         false,
         {},
         {},
         k});
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
           return conv_mac_cycles(a, static_cast<double>(region_elements(v, 2)), taps,
                                  v.fields[0][0].dtype(), ConvGeometry::grad_input_shape(v));
         },
         {"dx"},
         false,
         {},
         {},
         k});
  r.add({"ConvGradWeight",
         "weight gradients of a 2-D convolution summed over the tile's batch and output rows; "
         "params: geometry, batch, local x channels, rows, first row, local dy channels, "
         "rows, first row, then per region: output channel, first input channel, c0, c1",
         {"x", "dy", "dw"},
         conv_grad_weight,
         [k](const Vertex& v, const ArchPreset& a) {
           const double per_weight = v.params[k] * v.params[k + 5] * v.params[3];
           return conv_mac_cycles(a, static_cast<double>(region_elements(v, 2)), per_weight,
                                  v.fields[0][0].dtype(), ConvGeometry::grad_weight_shape(v));
         },
         {"dw"},
         false,
         {},
         {},
         k});
  {
    // The partials of a block are rows of `width` values (PopLibs' equal-size partials
    // reduction): the regions hold whole rows, and a worker slice sums its columns.
    Codelet sum{"ConvPartialsSum",
                "out[i] = the sum over the rows of every partials region, in order, of "
                "row[first + i], each region holding rows of `width` values (the reduction "
                "over tiles of weight gradients); params: width, first column (per worker slice)",
                {"partials", "out"},
                [](const VertexContext& c) {
                  auto out = c.region<float>(1);
                  const std::size_t width = c.size_param(0), first = c.size_param(1);
                  std::fill(out.begin(), out.end(), 0.f);
                  for (std::size_t p = 0; p < c.regions(0); ++p) {
                    auto in = c.region<const float>(0, p);
                    for (std::size_t row = 0; row + width <= in.size(); row += width)
                      for (std::size_t i = 0; i < out.size(); ++i) out[i] += in[row + first + i];
                  }
                },
                [](const Vertex& v, const ArchPreset& a) {
                  const auto width = static_cast<std::size_t>(v.params.at(0));
                  const std::size_t rows = width == 0 ? 0 : region_elements(v, 0) / width;
                  return vector_cycles(a, rows * region_elements(v, 1), 1);
                },
                {"out"}};
    sum.sliced = {"out"};
    sum.slice_params = {1};
    r.add(std::move(sum));
  }
}

}  // namespace ipupod::ipu
