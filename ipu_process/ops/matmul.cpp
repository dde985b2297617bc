// Matrix multiply: the host kernel behind the MatMulBlock codelet, the planner (output blocks
// and inner-dimension splits over tiles) and the lowering (exchange, partial products,
// reduction of partial sums).
#include "ipu_process/ops/matmul.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include "ipu_process/codelets.hpp"
#include "ipu_process/ops/common.hpp"

// The kernel is built for several host instruction sets, each with the register tile that fits
// its registers, and the best one the host supports is chosen when it is first called, so one
// binary is fast on every x86-64.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define IPUPOD_MATMUL_VARIANTS 1
#endif

namespace ipupod::ipu {
namespace ops {
namespace {

// Host-side blocking of the kernel (how the emulator computes fast, not a hardware figure):
// a register tile of up to MaxRows rows x MaxVectors host vectors of Lanes floats, and passes
// over kDepthBlock steps of the inner dimension so that a kDepthBlock-row panel of b stays in
// the host's cache while the rows stream past it.
constexpr std::size_t kDepthBlock = 256;

template <std::size_t Lanes, std::size_t MaxRows, std::size_t MaxVectors>
struct Kernel {
  static constexpr std::size_t kTileColumns = Lanes * MaxVectors;
  typedef float Vector __attribute__((vector_size(Lanes * sizeof(float))));

  // acc[i][v] += a(i, p) * b(p, v-th vector) for p in [0, depth), in increasing p: every
  // output element sees its terms in the same order as the plain loop. tile holds
  // rows x kTileColumns floats (the running sums) on entry and on exit.
  template <std::size_t Rows, std::size_t Vectors>
  [[gnu::always_inline]] static inline void register_tile(const float* a, std::size_t a_row_stride,
                                                          std::size_t a_depth_stride,
                                                          const float* b, std::size_t b_row_stride,
                                                          std::size_t depth, float* tile) {
    Vector acc[Rows][Vectors];
#pragma GCC unroll 8
    for (std::size_t i = 0; i < Rows; ++i)
#pragma GCC unroll 4
      for (std::size_t v = 0; v < Vectors; ++v)
        std::memcpy(&acc[i][v], tile + i * kTileColumns + v * Lanes, sizeof(Vector));
    for (std::size_t p = 0; p < depth; ++p) {
      Vector bv[Vectors];
#pragma GCC unroll 4
      for (std::size_t v = 0; v < Vectors; ++v)
        std::memcpy(&bv[v], b + p * b_row_stride + v * Lanes, sizeof(Vector));
#pragma GCC unroll 8
      for (std::size_t i = 0; i < Rows; ++i) {
        const float av = a[i * a_row_stride + p * a_depth_stride];
#pragma GCC unroll 4
        for (std::size_t v = 0; v < Vectors; ++v) acc[i][v] += av * bv[v];
      }
    }
#pragma GCC unroll 8
    for (std::size_t i = 0; i < Rows; ++i)
#pragma GCC unroll 4
      for (std::size_t v = 0; v < Vectors; ++v)
        std::memcpy(tile + i * kTileColumns + v * Lanes, &acc[i][v], sizeof(Vector));
  }

  // Copies a row of n <= kTileColumns floats a host vector at a time; the last vector ends at n
  // and may copy again a few floats the one before copied (the same values), so that no copy
  // of a run-time size (a call or a string instruction for every row) is needed.
  [[gnu::always_inline]] static inline void copy_row(float* dst, const float* src, std::size_t n) {
    if (n < Lanes) {
      for (std::size_t j = 0; j < n; ++j) dst[j] = src[j];
      return;
    }
    for (std::size_t j = 0; j + Lanes < n; j += Lanes)
      std::memcpy(dst + j, src + j, sizeof(Vector));
    std::memcpy(dst + n - Lanes, src + n - Lanes, sizeof(Vector));
  }

  // register_tile for a run-time row and vector count (1..MaxRows, 1..MaxVectors).
  template <std::size_t Vectors, std::size_t... R>
  [[gnu::always_inline]] static inline void rows_of(std::size_t rows, const float* a,
                                                    std::size_t ars, std::size_t ads,
                                                    const float* b, std::size_t brs,
                                                    std::size_t depth, float* tile,
                                                    std::index_sequence<R...>) {
    (void)((rows == R + 1 &&
            (register_tile<R + 1, Vectors>(a, ars, ads, b, brs, depth, tile), true)) ||
           ...);
  }
  template <std::size_t... V>
  [[gnu::always_inline]] static inline void tile_of(std::size_t vectors, std::size_t rows,
                                                    const float* a, std::size_t ars,
                                                    std::size_t ads, const float* b,
                                                    std::size_t brs, std::size_t depth, float* tile,
                                                    std::index_sequence<V...>) {
    (void)((vectors == V + 1 && (rows_of<V + 1>(rows, a, ars, ads, b, brs, depth, tile,
                                                std::make_index_sequence<MaxRows>()),
                                 true)) ||
           ...);
  }

  [[gnu::always_inline]] static inline void block_rows(const float* a, const float* b,
                                                       float* const* c, std::size_t bm,
                                                       std::size_t k, std::size_t n, bool ta,
                                                       bool tb, std::size_t r0, std::size_t rows) {
    // a(i, p) of this vertex's rows, wherever the operand's layout puts it.
    const std::size_t a_row_stride = ta ? 1 : k, a_depth_stride = ta ? bm : 1;
    const float* a_rows = a + r0 * a_row_stride;
    thread_local std::vector<float> panel;  // b columns re-laid out [depth, kTileColumns]
    alignas(64) float tile[MaxRows * kTileColumns] = {};
    // Rows in register tiles of equal height (19 rows as 5+5+5+4, not 6+6+6+1): a tile of few
    // rows loads b as often as a full one for less work.
    const std::size_t row_tiles = (rows + MaxRows - 1) / MaxRows;
    const std::size_t rows_per_tile = row_tiles == 0 ? 0 : (rows + row_tiles - 1) / row_tiles;
    for (std::size_t j0 = 0; j0 < n; j0 += kTileColumns) {
      const std::size_t width = std::min(kTileColumns, n - j0);
      const std::size_t vectors = (width + Lanes - 1) / Lanes;
      const std::size_t lanes = vectors * Lanes;
      // Rows of b the register tile may read in place: all of a full-width panel, and for the
      // last, narrower panel every row whose full vectors stay inside b (the extra lanes read
      // the next row's values, and their sums are dropped). Transposed b is always re-laid out.
      const std::size_t direct_rows =
          tb ? 0 : (k * n >= j0 + lanes ? std::min(k, (k * n - j0 - lanes) / n + 1) : 0);
      for (std::size_t p0 = 0; p0 < k; p0 += kDepthBlock) {
        const std::size_t depth = std::min(kDepthBlock, k - p0);
        const std::size_t direct = std::min(depth, direct_rows > p0 ? direct_rows - p0 : 0);
        // The other rows are copied into a zero-padded panel of the layout the tile reads.
        const std::size_t packed = depth - direct;
        if (packed > 0) {
          panel.assign(packed * kTileColumns, 0.f);
          const std::size_t first = p0 + direct;
          if (tb)  // read along b's rows (contiguous in p)
            for (std::size_t j = 0; j < width; ++j)
              for (std::size_t q = 0; q < packed; ++q)
                panel[q * kTileColumns + j] = b[(j0 + j) * k + first + q];
          else
            for (std::size_t q = 0; q < packed; ++q)
              for (std::size_t j = 0; j < width; ++j)
                panel[q * kTileColumns + j] = b[(first + q) * n + j0 + j];
        }
        for (std::size_t i0 = 0; i0 < rows; i0 += rows_per_tile) {
          const std::size_t tile_rows = std::min(rows_per_tile, rows - i0);
          // The running sums pass through `tile` between depth blocks and between the in-place
          // and packed rows: stored and reloaded as float32, so no result changes.
          for (std::size_t i = 0; i < tile_rows; ++i) {
            if (p0 == 0)
              std::fill_n(tile + i * kTileColumns, kTileColumns, 0.f);
            else
              copy_row(tile + i * kTileColumns, c[i0 + i] + j0, width);
          }
          const float* ap = a_rows + i0 * a_row_stride + p0 * a_depth_stride;
          // In-place rows, then packed rows.
          for (int part = 0; part < 2; ++part) {
            const std::size_t steps = part == 0 ? direct : packed;
            if (steps == 0) continue;
            tile_of(vectors, tile_rows, part == 0 ? ap : ap + direct * a_depth_stride, a_row_stride,
                    a_depth_stride, part == 0 ? b + p0 * n + j0 : panel.data(),
                    part == 0 ? n : kTileColumns, steps, tile,
                    std::make_index_sequence<MaxVectors>());
          }
          for (std::size_t i = 0; i < tile_rows; ++i)
            copy_row(c[i0 + i] + j0, tile + i * kTileColumns, width);
        }
      }
    }
  }
};

// One function per instruction set, each with the register tile its registers hold (the
// accumulators, the vectors of b and a broadcast element of a); the same sums in the same order.
using KernelFunction = void (*)(const float*, const float*, float* const*, std::size_t, std::size_t,
                                std::size_t, bool, bool, std::size_t, std::size_t);

#if defined(IPUPOD_MATMUL_VARIANTS)
// AVX-512: 32 registers of 16 floats; 6 rows x 4 vectors (64 columns) = 24 accumulators.
[[gnu::target("arch=x86-64-v4")]] void block_rows_avx512(const float* a, const float* b,
                                                         float* const* c, std::size_t bm,
                                                         std::size_t k, std::size_t n, bool ta,
                                                         bool tb, std::size_t r0,
                                                         std::size_t rows) {
  Kernel<16, 6, 4>::block_rows(a, b, c, bm, k, n, ta, tb, r0, rows);
}

// AVX2: 16 registers of 8 floats; 4 rows x 3 vectors (24 columns) = 12 accumulators.
[[gnu::target("arch=x86-64-v3")]] void block_rows_avx2(const float* a, const float* b,
                                                       float* const* c, std::size_t bm,
                                                       std::size_t k, std::size_t n, bool ta,
                                                       bool tb, std::size_t r0, std::size_t rows) {
  Kernel<8, 4, 3>::block_rows(a, b, c, bm, k, n, ta, tb, r0, rows);
}
#endif

// Any host: 4-float vectors (SSE2 on x86-64), 6 rows x 2 vectors.
void block_rows_baseline(const float* a, const float* b, float* const* c, std::size_t bm,
                         std::size_t k, std::size_t n, bool ta, bool tb, std::size_t r0,
                         std::size_t rows) {
  Kernel<4, 6, 2>::block_rows(a, b, c, bm, k, n, ta, tb, r0, rows);
}

// add_partials over elements [j, n) in whole host vectors of Lanes floats; returns where it
// stopped. Each vector of sums stays in a register while every partial is added to it.
template <std::size_t Lanes>
[[gnu::always_inline]] inline std::size_t add_partial_vectors(const float* const* parts,
                                                              std::size_t count, float* out,
                                                              std::size_t j, std::size_t n) {
  typedef float Vector __attribute__((vector_size(Lanes * sizeof(float))));
  for (; j + Lanes <= n; j += Lanes) {
    Vector sum, part;
    std::memcpy(&sum, parts[0] + j, sizeof(Vector));
    for (std::size_t g = 1; g < count; ++g) {
      std::memcpy(&part, parts[g] + j, sizeof(Vector));
      sum += part;
    }
    std::memcpy(out + j, &sum, sizeof(Vector));
  }
  return j;
}

// Lane by lane the same additions in the same order as the plain loop at the end, so every
// instruction set gives the same sums.
template <std::size_t... Lanes>
[[gnu::always_inline]] inline void add_partials_in(const float* const* parts, std::size_t count,
                                                   float* out, std::size_t n) {
  std::size_t j = 0;
  ((j = add_partial_vectors<Lanes>(parts, count, out, j, n)), ...);
  for (; j < n; ++j) {
    float sum = parts[0][j];
    for (std::size_t g = 1; g < count; ++g) sum += parts[g][j];
    out[j] = sum;
  }
}

using AddPartialsFunction = void (*)(const float* const*, std::size_t, float*, std::size_t);

#if defined(IPUPOD_MATMUL_VARIANTS)
[[gnu::target("arch=x86-64-v4")]] void add_partials_avx512(const float* const* parts,
                                                           std::size_t count, float* out,
                                                           std::size_t n) {
  add_partials_in<16, 8>(parts, count, out, n);
}
[[gnu::target("arch=x86-64-v3")]] void add_partials_avx2(const float* const* parts,
                                                         std::size_t count, float* out,
                                                         std::size_t n) {
  add_partials_in<8, 4>(parts, count, out, n);
}
#endif

void add_partials_baseline(const float* const* parts, std::size_t count, float* out,
                           std::size_t n) {
  add_partials_in<4>(parts, count, out, n);
}

struct KernelVariant {
  const char* isa;
  KernelFunction function;
  AddPartialsFunction add_partials;
};

// The variants this host can run, best first.
const std::vector<KernelVariant>& kernel_variants() {
  static const std::vector<KernelVariant> variants = [] {
    std::vector<KernelVariant> v;
#if defined(IPUPOD_MATMUL_VARIANTS)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4"))
      v.push_back({"avx512", block_rows_avx512, add_partials_avx512});
    if (__builtin_cpu_supports("x86-64-v3"))
      v.push_back({"avx2", block_rows_avx2, add_partials_avx2});
#endif
    v.push_back({"baseline", block_rows_baseline, add_partials_baseline});
    return v;
  }();
  return variants;
}

// The variant built for `isa`; invalid_argument if it is not built or this host lacks it.
const KernelVariant& kernel_variant(std::string_view isa) {
  const auto& variants = kernel_variants();
  auto it = std::find_if(variants.begin(), variants.end(),
                         [&](const KernelVariant& v) { return v.isa == isa; });
  if (it == variants.end())
    throw std::invalid_argument("matmul kernel for '" + std::string(isa) +
                                "' is not built or not supported by this host");
  return *it;
}
}  // namespace

void add_partials(const float* const* parts, std::size_t count, float* out, std::size_t n) {
  static const AddPartialsFunction best = kernel_variants().front().add_partials;
  best(parts, count, out, n);
}

void add_partials(const float* const* parts, std::size_t count, float* out, std::size_t n,
                  std::string_view isa) {
  kernel_variant(isa).add_partials(parts, count, out, n);
}

std::vector<std::string> matmul_kernel_isas() {
  std::vector<std::string> out;
  for (const auto& v : kernel_variants()) out.push_back(v.isa);
  return out;
}

void matmul_block_rows(const float* a, const float* b, float* const* c, std::size_t bm,
                       std::size_t k, std::size_t n, bool transpose_a, bool transpose_b,
                       std::size_t r0, std::size_t rows, std::string_view isa) {
  const KernelVariant& variant = kernel_variant(isa);
  if (k == 0) {
    for (std::size_t i = 0; i < rows; ++i) std::fill_n(c[i], n, 0.f);
    return;
  }
  variant.function(a, b, c, bm, k, n, transpose_a, transpose_b, r0, rows);
}

void matmul_block_rows(const float* a, const float* b, float* const* c, std::size_t bm,
                       std::size_t k, std::size_t n, bool transpose_a, bool transpose_b,
                       std::size_t r0, std::size_t rows) {
  if (k == 0) {
    for (std::size_t i = 0; i < rows; ++i) std::fill_n(c[i], n, 0.f);
    return;
  }
  static const KernelFunction best = kernel_variants().front().function;
  best(a, b, c, bm, k, n, transpose_a, transpose_b, r0, rows);
}

}  // namespace ops

void register_matmul_codelets(CodeletRegistry& r) {
  r.add({"MatMulBlock",
         "rows [r0, r0 + rows) of a tile's output block: c[i] = op(a)[r0 + i, :] x op(b), the "
         "rows laid end to end in the regions of c (one region per row, or one for all); "
         "params: block rows bm, depth k, block columns bn, a transposed, b transposed, r0, "
         "half partials (the AMP rate only). "
         "Each element is a float32 sum over p = 0..k-1 in increasing order, starting from 0 "
         "(one fused multiply-add per term on hosts with FMA, a multiply then an add otherwise)",
         {"a", "b", "c"},
         [](const VertexContext& c) {
           auto a = c.region<const float>(0);
           auto b = c.region<const float>(1);
           const std::size_t bm = c.size_param(0), k = c.size_param(1), bn = c.size_param(2);
           thread_local std::vector<float*> out;
           out.clear();
           for (std::size_t i = 0; i < c.regions(2); ++i) {
             auto region = c.region<float>(2, i);
             for (std::size_t e = 0; e + bn <= region.size(); e += bn)
               out.push_back(region.data() + e);
           }
           ops::matmul_block_rows(a.data(), b.data(), out.data(), bm, k, bn, c.param(3) != 0,
                                  c.param(4) != 0, c.size_param(5), out.size());
         },
         [](const Vertex& v, const ArchPreset& a) {
           std::size_t elements = 0;
           for (const Tensor& t : v.fields[2]) elements += t.elements();
           // Each output sums `depth` products; the block's columns share each row of a.
           return mac_cycles(a, static_cast<double>(elements) * v.params[1], v.fields[0][0].dtype(),
                             {v.params[1], v.params[2], v.params[6] != 0});
         },
         {"c"}});
  r.add({"MatMulReduce",
         "out = partials[0] + partials[1] + ... (float32, added in region order) for the "
         "partial sums of a matmul whose inner dimension is split over tiles; every partials "
         "region has as many elements as all out regions together",
         {"partials", "out"},
         [](const VertexContext& c) {
           thread_local std::vector<const float*> parts;
           parts.clear();
           for (std::size_t g = 0; g < c.regions(0); ++g)
             parts.push_back(c.region<const float>(0, g).data());
           for (std::size_t o = 0; o < c.regions(1); ++o) {
             auto out = c.region<float>(1, o);
             ops::add_partials(parts.data(), parts.size(), out.data(), out.size());
             for (auto& part : parts) part += out.size();
           }
         },
         [](const Vertex& v, const ArchPreset& a) {
           // Per vector of output: one load-and-add per partial, then a store.
           return vector_cycles(a, v.fields[0].at(0).elements(), v.fields[0].size());
         },
         {"out"}});
}

namespace ops {
namespace {

std::size_t ceil_div(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

struct PlanCost {
  double cycles = 0;
  double bytes = 0;  // busiest tile
};

// The cycles and bytes of one candidate, with the same estimators the codelets and the engine
// use: AMP cycles of the busiest worker, exchange bytes into the busiest tile, a sync per step.
// bk is the depth a tile multiplies at once: k / splits, or k / serial when the inner dimension
// is taken in `serial` passes on the same tiles (then splits is 1).
PlanCost plan_cost(const ArchPreset& arch, std::size_t bm, std::size_t bk, std::size_t bn,
                   std::size_t splits, std::size_t serial = 1) {
  const double workers = arch.workers_per_tile;
  const double rows_per_worker = std::ceil(static_cast<double>(bm) / workers);
  const double per_worker_flops = arch.fp32_flops_per_cycle_per_tile / workers;
  const double exchange_rate = arch.exchange_bytes_per_cycle_per_tile;
  const double sync = static_cast<double>(arch.sync_cycles_internal);
  const double latency = static_cast<double>(arch.exchange_latency_cycles);
  const double block = static_cast<double>(bm * bn);
  // Adding `parts` blocks of partial sums of `share` elements per tile: a vector pass.
  const auto reduce_cycles = [&](double share, double parts) {
    const double per_worker = std::ceil(share / workers);
    return arch.vertex_overhead_cycles +
           std::ceil(per_worker / arch.fp32_vector_width) * parts * workers + sync;
  };
  PlanCost c;
  const double operand_bytes = 4.0 * static_cast<double>(bm * bk + bk * bn);
  c.cycles = latency + operand_bytes / exchange_rate + sync;  // operands in
  c.cycles += arch.vertex_overhead_cycles +
              std::ceil(2.0 * rows_per_worker * bk * bn / per_worker_flops) + sync;
  c.bytes = operand_bytes + 4.0 * block;
  if (serial > 1) {
    // Every pass brings its operand pieces into the same temporary memory and leaves a block
    // of partial sums; from the second pass on the running sum and the new block are added
    // into a third block (the last pass's sum goes to the output).
    const double passes = static_cast<double>(serial);
    c.cycles = passes * c.cycles + (passes - 1) * reduce_cycles(block, 2);
    c.bytes = operand_bytes + 3.0 * 4.0 * block;
  }
  if (splits > 1) {
    // Each of the block's tiles adds up 1/splits of it: the other partials come in, the sum
    // of the share is written in place of the output.
    const double share = std::ceil(block / splits);
    c.cycles += latency + 4.0 * (splits - 1) * share / exchange_rate + sync;
    c.cycles += reduce_cycles(share, static_cast<double>(splits));
    c.bytes += 4.0 * static_cast<double>(splits) * share;
  }
  return c;
}

// Copies block [row0, row1) x [col0, col1) of a row-major matrix (src: its flat view, rows
// of row_length elements) into the contiguous dst: one piece if the block is whole rows,
// else one per row.
void copy_block(CopyRuns& copies, const Tensor& src, std::size_t row_length, std::size_t row0,
                std::size_t row1, std::size_t col0, std::size_t col1, const Tensor& dst) {
  const std::size_t width = col1 - col0;
  if (width == row_length) {
    copies.add(src.slice(row0 * row_length, row1 * row_length), dst);
    return;
  }
  for (std::size_t r = row0; r < row1; ++r)
    copies.add(src.slice(r * row_length + col0, r * row_length + col1),
               dst.slice((r - row0) * width, (r - row0 + 1) * width));
}

// The operand pieces of output block [r0, r1) x [c0, c1) over inner range [k0, k1), gathered
// onto `tile` by the exchange (added to `copies`): op(a)'s rows and op(b)'s columns.
struct Operands {
  Tensor a, b;
};
Operands gather_operands(CopyRuns& copies, TilePieces& a_pieces, TilePieces& b_pieces,
                         unsigned tile, const Tensor& a_flat, const Tensor& b_flat, bool ta,
                         bool tb, std::size_t m, std::size_t k, std::size_t n, std::size_t r0,
                         std::size_t r1, std::size_t c0, std::size_t c1, std::size_t k0,
                         std::size_t k1) {
  const std::size_t rows = r1 - r0, cols = c1 - c0, depth = k1 - k0;
  Operands o{a_pieces.add(tile, ta ? std::vector{depth, rows} : std::vector{rows, depth}),
             b_pieces.add(tile, tb ? std::vector{cols, depth} : std::vector{depth, cols})};
  if (ta)
    copy_block(copies, a_flat, m, k0, k1, r0, r1, o.a.flatten());
  else
    copy_block(copies, a_flat, k, r0, r1, k0, k1, o.a.flatten());
  if (tb)
    copy_block(copies, b_flat, k, c0, c1, k0, k1, o.b.flatten());
  else
    copy_block(copies, b_flat, n, k0, k1, c0, c1, o.b.flatten());
  return o;
}

// c's regions of flat elements [e0, e1) of the block at (r0, c0) with `cols` columns, row by
// row (c's rows are not adjacent in a block), appended to `field`.
void add_block_rows(std::vector<Tensor>& field, const Tensor& c, std::size_t r0, std::size_t c0,
                    std::size_t cols, std::size_t e0, std::size_t e1) {
  for (std::size_t e = e0; e < e1;) {
    const std::size_t r = e / cols, j = e % cols, len = std::min(cols - j, e1 - e);
    field.push_back(c.row(r0 + r).slice(c0 + j, c0 + j + len));
    e += len;
  }
}

// The serial plan's lowering: every output block stays on one tile, which multiplies the
// inner dimension in plan.k_serial passes. Pass p brings in its operand pieces (new
// temporaries, which the memory plan lays over the last pass's) and leaves a float32 block of
// partial sums; from the second pass on, MatMulReduce adds the running sum and the new block,
// in k order, so the sums are those of a parallel split at the same boundaries; the last pass's
// sum is written to c.
void matmul_serial(Graph& graph, Program& prog, const Tensor& a, const Tensor& b, bool ta, bool tb,
                   const MatMulPlan& plan, std::size_t m, std::size_t k, std::size_t n,
                   const Tensor& c, const std::string& name) {
  const std::size_t bm = ceil_div(m, plan.row_blocks), bn = ceil_div(n, plan.col_blocks);
  const std::size_t bk = ceil_div(k, plan.k_serial);
  const std::size_t workers = graph.arch().workers_per_tile;
  const Tensor a_flat = a.flatten(), b_flat = b.flatten();
  struct Block {
    std::size_t r0, rows, c0, cols;
    unsigned tile;
    Tensor sum;  // the running float32 sum of the passes so far
  };
  std::vector<Block> blocks;
  std::vector<std::pair<Tensor, unsigned>> c_pieces;
  unsigned tile = 0;
  for (std::size_t r0 = 0; r0 < m; r0 += bm)
    for (std::size_t c0 = 0; c0 < n; c0 += bn, ++tile) {
      const std::size_t rows = std::min(m, r0 + bm) - r0, cols = std::min(n, c0 + bn) - c0;
      blocks.push_back({r0, rows, c0, cols, tile, {}});
      for (std::size_t r = r0; r < r0 + rows; ++r)
        c_pieces.emplace_back(c.row(r).slice(c0, c0 + cols), tile);
    }
  std::sort(c_pieces.begin(), c_pieces.end(),
            [](const auto& x, const auto& y) { return x.first.offset() < y.first.offset(); });
  for (const auto& [piece, on] : c_pieces) graph.set_tile_mapping(piece, on);
  for (std::size_t pass = 0, k0 = 0; k0 < k; ++pass, k0 += bk) {
    const std::size_t k1 = std::min(k, k0 + bk), depth = k1 - k0;
    const bool last = k1 == k;
    const std::string at = name + "/pass" + std::to_string(pass);
    TilePieces a_pieces(graph, a.dtype(), at + "/a"), b_pieces(graph, b.dtype(), at + "/b"),
        partial_pieces(graph, DType::f32, at + "/partial"),
        sum_pieces(graph, DType::f32, at + "/sum");
    CopyRuns copies;
    const ComputeSetId cs = graph.add_compute_set(at);
    const ComputeSetId add_cs = graph.add_compute_set(at + "/add");
    for (Block& blk : blocks) {
      const auto [a_local, b_local] =
          gather_operands(copies, a_pieces, b_pieces, blk.tile, a_flat, b_flat, ta, tb, m, k, n,
                          blk.r0, blk.r0 + blk.rows, blk.c0, blk.c0 + blk.cols, k0, k1);
      const Tensor partial = partial_pieces.add(blk.tile, {blk.rows, blk.cols});
      const std::size_t per_worker = ceil_div(blk.rows, workers);
      for (std::size_t w0 = 0; w0 < blk.rows; w0 += per_worker) {
        const std::size_t w1 = std::min(blk.rows, w0 + per_worker);
        graph.add_vertex(cs, Vertex{"MatMulBlock",
                                    blk.tile,
                                    {{a_local}, {b_local}, {partial.rows(w0, w1).flatten()}},
                                    {double(blk.rows), double(depth), double(blk.cols), double(ta),
                                     double(tb), double(w0), double(graph.half_partials())}});
      }
      if (pass == 0) {
        blk.sum = partial;
        continue;
      }
      // sum + partial, into a new running sum, or into the block's rows of c after the last pass.
      const std::size_t elements = blk.rows * blk.cols;
      const Tensor sum = last ? Tensor() : sum_pieces.add(blk.tile, {blk.rows, blk.cols});
      const std::size_t share = ceil_div(elements, workers);
      for (std::size_t e0 = 0; e0 < elements; e0 += share) {
        const std::size_t e1 = std::min(elements, e0 + share);
        Vertex v{"MatMulReduce",
                 blk.tile,
                 {{blk.sum.flatten().slice(e0, e1), partial.flatten().slice(e0, e1)}, {}},
                 {}};
        if (!last)
          v.fields[1].push_back(sum.flatten().slice(e0, e1));
        else
          add_block_rows(v.fields[1], c, blk.r0, blk.c0, blk.cols, e0, e1);
        graph.add_vertex(add_cs, std::move(v));
      }
      if (!last) blk.sum = sum;
    }
    prog.add(Program::copy(std::move(copies)));
    prog.add(Program::execute(cs));
    if (pass > 0) prog.add(Program::execute(add_cs));
  }
}

}  // namespace

MatMulPlan plan_matmul(const ArchPreset& arch, std::size_t m, std::size_t k, std::size_t n,
                       double available_memory_proportion) {
  // More passes than this only trade exchange and syncs for memory that a larger split of the
  // output would save better.
  constexpr std::size_t kMaxSerialPasses = 256;
  if (m == 0 || k == 0 || n == 0)
    throw std::invalid_argument(
        "plan_matmul: every dimension must be positive, got m=" + std::to_string(m) +
        " k=" + std::to_string(k) + " n=" + std::to_string(n));
  const double budget = available_memory_proportion * static_cast<double>(arch.bytes_per_tile);
  MatMulPlan best;
  PlanCost best_cost{std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::infinity()};
  const auto consider = [&](std::size_t bm, std::size_t bk, std::size_t bn, std::size_t serial) {
    const std::size_t gm = ceil_div(m, bm), gn = ceil_div(n, bn);
    const std::size_t gk = serial > 1 ? 1 : ceil_div(k, bk);
    const PlanCost c = plan_cost(arch, bm, bk, bn, gk, serial);
    const bool fits = c.bytes <= budget, best_fits = best_cost.bytes <= budget;
    if ((fits && (!best_fits || c.cycles < best_cost.cycles)) ||
        (!fits && !best_fits && c.bytes < best_cost.bytes)) {
      best = {
          gm,    gn, gk, static_cast<std::uint64_t>(c.cycles), static_cast<std::size_t>(c.bytes),
          serial};
      best_cost = c;
    }
  };
  // Every distinct block size of each dimension (block counts that give the same block size
  // are the same plan): the output's blocks, and for each the inner dimension's parallel
  // splits (max_serial 0), or, when no such plan fits, its serial passes on the same tiles.
  const auto search = [&](std::size_t max_serial) {
    std::size_t last_bm = 0;
    for (std::size_t gm = 1; gm <= std::min<std::size_t>(m, arch.tiles); ++gm) {
      const std::size_t bm = ceil_div(m, gm);
      if (bm == last_bm) continue;
      last_bm = bm;
      const std::size_t gm_used = ceil_div(m, bm);
      std::size_t last_bn = 0;
      for (std::size_t gn = 1; gn <= std::min<std::size_t>(n, arch.tiles / gm_used); ++gn) {
        const std::size_t bn = ceil_div(n, gn);
        if (bn == last_bn) continue;
        last_bn = bn;
        const std::size_t blocks = gm_used * ceil_div(n, bn);
        std::size_t last_bk = 0;
        if (max_serial == 0) {
          for (std::size_t gk = 1; gk <= std::min<std::size_t>(k, arch.tiles / blocks); ++gk) {
            const std::size_t bk = ceil_div(k, gk);
            if (bk == last_bk) continue;
            last_bk = bk;
            consider(bm, bk, bn, 1);
          }
          continue;
        }
        for (std::size_t passes = 2; passes <= std::min(k, max_serial); ++passes) {
          const std::size_t bk = ceil_div(k, passes);
          if (bk == last_bk) continue;
          last_bk = bk;
          consider(bm, bk, bn, ceil_div(k, bk));
        }
      }
    }
  };
  search(0);
  // As PopLibs' planner does when memory is short: the inner dimension in serial passes, each
  // reusing the temporary memory of the one before.
  if (best_cost.bytes > budget) search(kMaxSerialPasses);
  return best;
}

Tensor matmul(Graph& graph, Program& prog, const Tensor& a, const Tensor& b, bool ta, bool tb,
              const std::string& name) {
  if (a.rank() != 2 || b.rank() != 2)
    throw std::invalid_argument(name + ": matmul expects rank-2 operands, got ranks " +
                                std::to_string(a.rank()) + " and " + std::to_string(b.rank()));
  if (a.dtype() != b.dtype() || (a.dtype() != DType::f32 && a.dtype() != DType::f16))
    throw std::invalid_argument(name +
                                ": matmul expects two float32 or two float16 operands, got " +
                                dtype_name(a.dtype()) + " and " + dtype_name(b.dtype()) +
                                "; cast them to one float type first");
  const std::size_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  const std::size_t kb = tb ? b.dim(1) : b.dim(0), n = tb ? b.dim(0) : b.dim(1);
  if (k != kb)
    throw std::invalid_argument(name + ": inner dimensions differ: op(a) is [" + std::to_string(m) +
                                "," + std::to_string(k) + "], op(b) is [" + std::to_string(kb) +
                                "," + std::to_string(n) + "]");
  if (m == 0 || k == 0 || n == 0)
    throw std::invalid_argument(name + ": matmul of an empty operand: op(a) is [" +
                                std::to_string(m) + "," + std::to_string(k) + "], op(b) is [" +
                                std::to_string(kb) + "," + std::to_string(n) + "]");
  const MatMulPlan plan = plan_matmul(graph.arch(), m, k, n, graph.available_memory_proportion());
  if (plan.k_serial > 1) {
    Tensor c = graph.add_variable(a.dtype(), {m, n}, name);
    matmul_serial(graph, prog, a, b, ta, tb, plan, m, k, n, c, name);
    return c;
  }
  const std::size_t bm = ceil_div(m, plan.row_blocks), bn = ceil_div(n, plan.col_blocks);
  const std::size_t bk = ceil_div(k, plan.k_splits);
  const bool split = plan.k_splits > 1;
  Tensor c = graph.add_variable(a.dtype(), {m, n}, name);
  CopyRuns copies, reduce_copies;
  // c's pieces and their tiles, mapped in element order at the end: mapping a variable front
  // to back costs the graph constant time per piece, out of order it costs the whole mapping.
  std::vector<std::pair<Tensor, unsigned>> c_pieces;
  ComputeSetId cs = graph.add_compute_set(name);
  const ComputeSetId reduce_cs = split ? graph.add_compute_set(name + "/reduce") : cs;
  const std::size_t workers = graph.arch().workers_per_tile;
  const Tensor a_flat = a.flatten(), b_flat = b.flatten();
  TilePieces a_pieces(graph, a.dtype(), name + "/a"), b_pieces(graph, b.dtype(), name + "/b"),
      partial_pieces(graph, DType::f32, name + "/partial"),
      gathered_pieces(graph, DType::f32, name + "/partials");
  unsigned tile = 0;
  for (std::size_t r0 = 0; r0 < m; r0 += bm) {
    const std::size_t r1 = std::min(m, r0 + bm), rows = r1 - r0;
    for (std::size_t c0 = 0; c0 < n; c0 += bn) {
      const std::size_t c1 = std::min(n, c0 + bn), cols = c1 - c0;
      std::vector<Tensor> partials;  // of this block, one per piece of k (when split)
      std::vector<unsigned> partial_tiles;
      for (std::size_t k0 = 0; k0 < k; k0 += bk, ++tile) {
        const std::size_t k1 = std::min(k, k0 + bk), depth = k1 - k0;
        // Operand pieces this block needs, gathered onto its tile by the exchange.
        const auto [a_local, b_local] =
            gather_operands(copies, a_pieces, b_pieces, tile, a_flat, b_flat, ta, tb, m, k, n, r0,
                            r1, c0, c1, k0, k1);
        // The block's result, or its partial sums over this piece of k (float32, as the AMP
        // accumulates, whatever the operands' type).
        Tensor out;
        if (split) {
          out = partial_pieces.add(tile, {rows, cols});
          partials.push_back(out);
          partial_tiles.push_back(tile);
        } else {
          for (std::size_t r = r0; r < r1; ++r) c_pieces.emplace_back(c.row(r).slice(c0, c1), tile);
        }
        // Rows of the block shared out between the tile's workers.
        const std::size_t per_worker = ceil_div(rows, workers);
        for (std::size_t w0 = 0; w0 < rows; w0 += per_worker) {
          const std::size_t w1 = std::min(rows, w0 + per_worker);
          Vertex v{"MatMulBlock",
                   tile,
                   {{a_local}, {b_local}, {}},
                   {double(rows), double(depth), double(cols), double(ta), double(tb), double(w0),
                    double(graph.half_partials())}};
          if (split)  // the partial sums are contiguous on the tile: one region
            v.fields[2].push_back(out.rows(w0, w1).flatten());
          else
            for (std::size_t r = w0; r < w1; ++r)
              v.fields[2].push_back(c.row(r0 + r).slice(c0, c1));
          graph.add_vertex(cs, std::move(v));
        }
      }
      if (!split) continue;
      // Reduction: each tile holding a partial adds up one share of the block (flat elements
      // [e0, e1)), the other partials' shares brought in by the exchange; the share's output
      // elements are mapped on that tile.
      const std::size_t parts = partials.size(), elements = rows * cols;
      const std::size_t share = ceil_div(elements, parts);
      for (std::size_t g = 0; g < parts; ++g) {
        const std::size_t e0 = g * share, e1 = std::min(elements, e0 + share);
        if (e0 >= e1) break;
        const unsigned reducer = partial_tiles[g];
        Tensor gathered = gathered_pieces.add(reducer, {parts - 1, e1 - e0});
        std::vector<Tensor> sources;  // the share of every partial, in k order, on this tile
        for (std::size_t h = 0, row = 0; h < parts; ++h) {
          const Tensor piece = partials[h].flatten().slice(e0, e1);
          if (h == g) {
            sources.push_back(piece);
            continue;
          }
          reduce_copies.add(piece, gathered.row(row));
          sources.push_back(gathered.row(row++));
        }
        // Output pieces of the share: row by row, as c's rows are not adjacent in the block.
        for (std::size_t e = e0; e < e1;) {
          const std::size_t r = e / cols, j = e % cols, len = std::min(cols - j, e1 - e);
          c_pieces.emplace_back(c.row(r0 + r).slice(c0 + j, c0 + j + len), reducer);
          e += len;
        }
        const std::size_t per_worker = ceil_div(e1 - e0, workers);
        for (std::size_t s0 = e0; s0 < e1; s0 += per_worker) {
          const std::size_t s1 = std::min(e1, s0 + per_worker);
          Vertex v{"MatMulReduce", reducer, {{}, {}}, {}};
          for (const Tensor& src : sources) v.fields[0].push_back(src.slice(s0 - e0, s1 - e0));
          add_block_rows(v.fields[1], c, r0, c0, cols, s0, s1);
          graph.add_vertex(reduce_cs, std::move(v));
        }
      }
    }
  }
  std::sort(c_pieces.begin(), c_pieces.end(),
            [](const auto& x, const auto& y) { return x.first.offset() < y.first.offset(); });
  for (const auto& [piece, on] : c_pieces) graph.set_tile_mapping(piece, on);
  prog.add(Program::copy(std::move(copies)));
  prog.add(Program::execute(cs));
  if (split) {
    prog.add(Program::copy(std::move(reduce_copies)));
    prog.add(Program::execute(reduce_cs));
  }
  return c;
}

}  // namespace ops
}  // namespace ipupod::ipu
