// Pooling on tiles: planes x row blocks over tiles, one exchange of each block's input rows
// (with the windows' halo), vertices per worker; and the pooling codelets. Every output and
// gradient element is summed in the order the reference interpreter uses.
#include "ipu_process/ops/pool.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>

#include "ipu_process/codelets.hpp"
#include "ipu_process/ops/common.hpp"
#include "ipu_process/ops/conv.hpp"
#include "ipu_process/ops/matmul.hpp"

namespace ipupod::ipu {
namespace {

// Input range [begin, end) of output index o along one axis, and the average's divisor.
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

// The window geometry every pooling codelet reads from its first parameters.
struct PoolGeometry {
  std::size_t h, w, oh, ow, kh, kw, sh, sw, ph, pw;
  bool include_pad, adaptive;
  static constexpr std::size_t kParams = 12;
  static PoolGeometry read(const VertexContext& c) {
    return {c.size_param(0), c.size_param(1), c.size_param(2),  c.size_param(3),
            c.size_param(4), c.size_param(5), c.size_param(6),  c.size_param(7),
            c.size_param(8), c.size_param(9), c.param(10) != 0, c.param(11) != 0};
  }
  void append(std::vector<double>& p) const {
    for (std::size_t v : {h, w, oh, ow, kh, kw, sh, sw, ph, pw}) p.push_back(double(v));
    p.push_back(include_pad ? 1 : 0);
    p.push_back(adaptive ? 1 : 0);
  }
  Window row(std::size_t oy) const { return window(oy, h, oh, kh, sh, ph, adaptive, include_pad); }
  Window col(std::size_t ox) const { return window(ox, w, ow, kw, sw, pw, adaptive, include_pad); }
  // The column windows, in per-thread scratch (no allocation per codelet call).
  const std::vector<Window>& cols() const {
    thread_local std::vector<Window> out;
    out.resize(ow);
    for (std::size_t ox = 0; ox < ow; ++ox) out[ox] = col(ox);
    return out;
  }
};

// Where a vertex's input field f starts (global row) and how many rows it holds, then the
// vertex's own rows, the work its estimator counts and, per region, the local plane.
struct PoolVertexLayout {
  std::size_t inputs;
  std::size_t first_row(std::size_t f) const { return PoolGeometry::kParams + 2 * f; }
  std::size_t rows(std::size_t f) const { return PoolGeometry::kParams + 2 * f + 1; }
  std::size_t begin() const { return PoolGeometry::kParams + 2 * inputs; }
  std::size_t end() const { return begin() + 1; }
  std::size_t work() const { return begin() + 2; }
  std::size_t plane(std::size_t r) const { return begin() + 3 + r; }
};

void max_pool(const VertexContext& c) {
  const PoolGeometry g = PoolGeometry::read(c);
  const PoolVertexLayout l{1};
  const float* x = c.region<const float>(0).data();
  const std::size_t x0 = c.size_param(l.first_row(0)), xr = c.size_param(l.rows(0));
  const std::size_t rr0 = c.size_param(l.begin()), rr1 = c.size_param(l.end());
  const auto& cols = g.cols();
  for (std::size_t r = 0; r < c.regions(1); ++r) {
    auto out = c.region<float>(1, r);
    const float* plane = x + c.size_param(l.plane(r)) * xr * g.w;
    for (std::size_t oy = rr0; oy < rr1; ++oy) {
      const Window wy = g.row(oy);
      for (std::size_t ox = 0; ox < g.ow; ++ox) {
        const Window& wx = cols[ox];
        float best = -std::numeric_limits<float>::infinity();
        for (std::size_t y = wy.begin; y < wy.end; ++y) {
          const float* row = plane + (y - x0) * g.w;
          for (std::size_t xx = wx.begin; xx < wx.end; ++xx) best = std::max(best, row[xx]);
        }
        out[(oy - rr0) * g.ow + ox] = best;
      }
    }
  }
}

void max_pool_grad(const VertexContext& c) {
  const PoolGeometry g = PoolGeometry::read(c);
  const PoolVertexLayout l{2};
  const float* x = c.region<const float>(0).data();
  const float* dy = c.region<const float>(1).data();
  const std::size_t x0 = c.size_param(l.first_row(0)), xr = c.size_param(l.rows(0));
  const std::size_t y0 = c.size_param(l.first_row(1)), yr = c.size_param(l.rows(1));
  const std::size_t rr0 = c.size_param(l.begin()), rr1 = c.size_param(l.end());
  const auto& cols = g.cols();
  for (std::size_t r = 0; r < c.regions(2); ++r) {
    auto dx = c.region<float>(2, r);
    std::fill(dx.begin(), dx.end(), 0.f);
    const std::size_t p = c.size_param(l.plane(r));
    const float* plane = x + p * xr * g.w;
    const float* dyplane = dy + p * yr * g.ow;
    for (std::size_t oy = y0; oy < y0 + yr; ++oy) {
      const Window wy = g.row(oy);
      if (wy.end <= rr0 || wy.begin >= rr1) continue;
      for (std::size_t ox = 0; ox < g.ow; ++ox) {
        const Window& wx = cols[ox];
        float best = -std::numeric_limits<float>::infinity();
        std::size_t at_y = wy.begin, at_x = wx.begin;
        for (std::size_t y = wy.begin; y < wy.end; ++y) {
          const float* row = plane + (y - x0) * g.w;
          for (std::size_t xx = wx.begin; xx < wx.end; ++xx)
            if (row[xx] > best) {  // the first maximum, like PyTorch
              best = row[xx];
              at_y = y;
              at_x = xx;
            }
        }
        if (at_y >= rr0 && at_y < rr1)
          dx[(at_y - rr0) * g.w + at_x] += dyplane[(oy - y0) * g.ow + ox];
      }
    }
  }
}

void avg_pool(const VertexContext& c) {
  const PoolGeometry g = PoolGeometry::read(c);
  const PoolVertexLayout l{1};
  const float* x = c.region<const float>(0).data();
  const std::size_t x0 = c.size_param(l.first_row(0)), xr = c.size_param(l.rows(0));
  const std::size_t rr0 = c.size_param(l.begin()), rr1 = c.size_param(l.end());
  const auto& cols = g.cols();
  for (std::size_t r = 0; r < c.regions(1); ++r) {
    auto out = c.region<float>(1, r);
    const float* plane = x + c.size_param(l.plane(r)) * xr * g.w;
    for (std::size_t oy = rr0; oy < rr1; ++oy) {
      const Window wy = g.row(oy);
      for (std::size_t ox = 0; ox < g.ow; ++ox) {
        const Window& wx = cols[ox];
        double s = 0;
        for (std::size_t y = wy.begin; y < wy.end; ++y) {
          const float* row = plane + (y - x0) * g.w;
          for (std::size_t xx = wx.begin; xx < wx.end; ++xx) s += row[xx];
        }
        out[(oy - rr0) * g.ow + ox] =
            static_cast<float>(s / static_cast<double>(wy.divisor * wx.divisor));
      }
    }
  }
}

void avg_pool_grad(const VertexContext& c) {
  const PoolGeometry g = PoolGeometry::read(c);
  const PoolVertexLayout l{1};
  const float* dy = c.region<const float>(0).data();
  const std::size_t y0 = c.size_param(l.first_row(0)), yr = c.size_param(l.rows(0));
  const std::size_t rr0 = c.size_param(l.begin()), rr1 = c.size_param(l.end());
  const auto& cols = g.cols();
  for (std::size_t r = 0; r < c.regions(1); ++r) {
    auto dx = c.region<float>(1, r);
    std::fill(dx.begin(), dx.end(), 0.f);
    const float* dyplane = dy + c.size_param(l.plane(r)) * yr * g.ow;
    for (std::size_t oy = y0; oy < y0 + yr; ++oy) {
      const Window wy = g.row(oy);
      const std::size_t yb = std::max(wy.begin, rr0), ye = std::min(wy.end, rr1);
      if (yb >= ye) continue;
      for (std::size_t ox = 0; ox < g.ow; ++ox) {
        const Window& wx = cols[ox];
        const float v =
            dyplane[(oy - y0) * g.ow + ox] / static_cast<float>(wy.divisor * wx.divisor);
        for (std::size_t y = yb; y < ye; ++y) {
          float* row = dx.data() + (y - rr0) * g.w;
          for (std::size_t xx = wx.begin; xx < wx.end; ++xx) row[xx] += v;
        }
      }
    }
  }
}

// Window elements visited, counted at lowering, at `instructions` per vector of them.
std::function<std::uint64_t(const Vertex&, const ArchPreset&)> pool_cycles(
    std::size_t inputs, std::size_t instructions) {
  return [inputs, instructions](const Vertex& v, const ArchPreset& a) {
    const PoolVertexLayout l{inputs};
    return vector_cycles(a, static_cast<std::size_t>(v.params.at(l.work())), instructions);
  };
}

}  // namespace

void register_pool_codelets(CodeletRegistry& r) {
  const char* params =
      "; params: geometry (h w oh ow kh kw sh sw ph pw count_include_pad adaptive), per input "
      "its first row and rows, the vertex's rows, its work, then per region the local plane";
  r.add({"MaxPool",
         std::string("rows of the maximum of each window") + params,
         {"x", "out"},
         max_pool,
         pool_cycles(1, 1),
         {"out"}});
  r.add({"MaxPoolGrad",
         std::string("rows of dx: each window's dy added at its first maximum in x") + params,
         {"x", "dy", "dx"},
         max_pool_grad,
         pool_cycles(2, 2),
         {"dx"}});
  r.add({"AvgPool",
         std::string("rows of the mean of each window") + params,
         {"x", "out"},
         avg_pool,
         pool_cycles(1, 1),
         {"out"}});
  r.add({"AvgPoolGrad",
         std::string("rows of dx: each window's dy / divisor added over the window") + params,
         {"dy", "dx"},
         avg_pool_grad,
         pool_cycles(1, 2),
         {"dx"}});
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

void expect(bool ok, const std::string& name, const std::string& what) {
  if (!ok) throw std::invalid_argument(name + ": " + what);
}

PoolGeometry geometry_of(const std::vector<std::size_t>& in, const std::vector<std::size_t>& out,
                         const PoolParams& p) {
  return {in[2],      in[3],      out[2],  out[3],  p.kernel_h,          p.kernel_w,
          p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.count_include_pad, p.adaptive};
}

// Whether a block of pb planes x rb rows of [planes, rows, width] is one run of it.
bool block_is_one_run(std::size_t pb, std::size_t rb, std::size_t rows) {
  return pb == 1 || rb >= rows;
}

// One input of a pooling vertex: a [planes, rows, width] tensor and the rows of it that rows
// [r0, r1) of the op's output need.
struct PoolInput {
  Tensor t;
  std::function<std::pair<std::size_t, std::size_t>(std::size_t, std::size_t)> rows;
};

// Lays out an op with output [planes, rows, width] over tiles in blocks of planes x rows: each
// block's input rows arrive in one exchange, its workers share its planes (or rows).
Tensor lower(Graph& graph, Program& prog, const std::string& name, const char* codelet,
             const std::vector<std::size_t>& out_shape, std::vector<PoolInput> inputs,
             const PoolGeometry& geo, std::size_t window_elements) {
  const ArchPreset& arch = graph.arch();
  const std::size_t planes = out_shape[0] * out_shape[1], rows = out_shape[2], width = out_shape[3];
  for (auto& in : inputs) in.t = in.t.reshape({planes, in.t.dim(2), in.t.dim(3)});
  // Plan: the fastest plane x row blocking whose busiest tile fits the memory proportion.
  const double budget =
      graph.available_memory_proportion() * static_cast<double>(arch.bytes_per_tile);
  std::size_t best_pb = planes, best_rb = rows;
  double best_cycles = std::numeric_limits<double>::infinity(), best_bytes = best_cycles;
  for (std::size_t k = 1; k <= planes; ++k) {
    const std::size_t pb = ceil_div(planes, k);
    if (k > 1 && pb == ceil_div(planes, k - 1)) continue;
    for (std::size_t m = 1; m <= rows && k * m <= arch.tiles; ++m) {
      const std::size_t rb = ceil_div(rows, m);
      if (m > 1 && rb == ceil_div(rows, m - 1)) continue;
      if (ceil_div(planes, pb) * ceil_div(rows, rb) > arch.tiles) continue;
      double in_bytes = 0;
      for (const auto& in : inputs) {
        std::size_t most = 0;
        for (std::size_t r0 = 0; r0 < rows; r0 += rb) {
          const auto [a, b] = in.rows(r0, std::min(rows, r0 + rb));
          most = std::max(most, b - a);
        }
        in_bytes += 4.0 * static_cast<double>(pb * most * in.t.dim(2));
      }
      const double out_bytes = 4.0 * static_cast<double>(pb * rb * width);
      double bytes = in_bytes + out_bytes;
      double cycles =
          static_cast<double>(arch.exchange_latency_cycles) +
          in_bytes / arch.exchange_bytes_per_cycle_per_tile +
          static_cast<double>(vector_cycles(arch, pb * rb * width * window_elements, 1)) /
              arch.workers_per_tile;
      if (!block_is_one_run(pb, rb, rows)) {  // the output's move (see below)
        bytes += out_bytes;
        cycles += static_cast<double>(arch.exchange_latency_cycles) +
                  out_bytes / arch.exchange_bytes_per_cycle_per_tile;
      }
      const bool fits = bytes <= budget, best_fits = best_bytes <= budget;
      if ((fits && (!best_fits || cycles < best_cycles)) ||
          (!fits && !best_fits && bytes < best_bytes)) {
        best_pb = pb, best_rb = rb, best_cycles = cycles, best_bytes = bytes;
      }
    }
  }
  const std::size_t row_blocks = ceil_div(rows, best_rb);
  std::uint32_t hash = 2166136261u;  // FNV-1a of the name: layers start on different tiles
  for (char ch : name) hash = (hash ^ static_cast<unsigned char>(ch)) * 16777619u;
  const auto tile_of = [&](std::size_t pb, std::size_t rb) {
    return static_cast<unsigned>((hash + pb * row_blocks + rb) % graph.tiles());
  };
  Tensor out = graph.add_variable(DType::f32, out_shape, name);
  const Tensor out3 = out.reshape({planes, rows, width});
  // A block of several planes' first rows is not one run of the output: the vertices write a
  // piece per tile, and one exchange moves the pieces onto even runs of rows (as a
  // convolution's, see ConvPlan::remap).
  const bool remap = !block_is_one_run(best_pb, best_rb, rows);
  if (remap)
    map_rows_evenly(graph, out, width, ceil_div(planes, best_pb) * row_blocks,
                    hash % graph.tiles());
  else
    for (std::size_t p = 0; p < planes; ++p)
      for (std::size_t rb = 0; rb < row_blocks; ++rb)
        graph.set_tile_mapping(out3.row(p).rows(rb * best_rb, std::min(rows, (rb + 1) * best_rb)),
                               tile_of(p / best_pb, rb));
  CopyRuns copies, outputs;
  TilePieces out_pieces(graph, DType::f32, name + "/out");
  const ComputeSetId cs = graph.add_compute_set(name);
  std::vector<TilePieces> input_pieces;
  for (std::size_t f = 0; f < inputs.size(); ++f)
    input_pieces.emplace_back(graph, DType::f32, name + "/in" + std::to_string(f));
  for (std::size_t p0 = 0; p0 < planes; p0 += best_pb)
    for (std::size_t r0 = 0; r0 < rows; r0 += best_rb) {
      const std::size_t p1 = std::min(planes, p0 + best_pb), r1 = std::min(rows, r0 + best_rb);
      const unsigned tile = tile_of(p0 / best_pb, r0 / best_rb);
      std::vector<Tensor> locals;
      std::vector<double> params;
      geo.append(params);
      for (std::size_t f = 0; f < inputs.size(); ++f) {
        const auto [a, b] = inputs[f].rows(r0, r1);
        const Tensor& t = inputs[f].t;
        Tensor local = input_pieces[f].add(tile, {p1 - p0, b - a, t.dim(2)});
        for (std::size_t p = p0; p < p1; ++p)
          copies.add(t.row(p).rows(a, b).flatten(), local.row(p - p0).flatten());
        locals.push_back(local.flatten());
        params.push_back(double(a));
        params.push_back(double(b - a));
      }
      Tensor local_out;
      if (remap) {
        local_out = out_pieces.add(tile, {p1 - p0, r1 - r0, width});
        for (std::size_t p = p0; p < p1; ++p)
          outputs.add(local_out.row(p - p0).flatten(), out3.row(p).rows(r0, r1).flatten());
      }
      for_each_work_split(
          p1 - p0, r1 - r0, arch.workers_per_tile,
          [&](std::size_t i0, std::size_t i1, std::size_t q0, std::size_t q1) {
            Vertex v{codelet, tile, {}, params};
            for (const Tensor& l : locals) v.fields.push_back({l});
            v.fields.emplace_back();
            v.params.push_back(double(r0 + q0));
            v.params.push_back(double(r0 + q1));
            v.params.push_back(double((i1 - i0) * (q1 - q0) * width * window_elements));
            for (std::size_t i = i0; i < i1; ++i) {
              v.fields.back().push_back(
                  (remap ? local_out.row(i).rows(q0, q1) : out3.row(p0 + i).rows(r0 + q0, r0 + q1))
                      .flatten());
              v.params.push_back(double(i));
            }
            graph.add_vertex(cs, std::move(v));
          });
    }
  prog.add(Program::copy(std::move(copies)));
  prog.add(Program::execute(cs));
  if (remap) prog.add(Program::copy(std::move(outputs)));
  return out;
}

// The largest window, for the cost estimate.
std::size_t window_elements(const PoolGeometry& g) {
  std::size_t wy = 0, wx = 0;
  for (std::size_t oy = 0; oy < g.oh; ++oy) wy = std::max(wy, g.row(oy).end - g.row(oy).begin);
  for (std::size_t ox = 0; ox < g.ow; ++ox) wx = std::max(wx, g.col(ox).end - g.col(ox).begin);
  return std::max<std::size_t>(wy * wx, 1);
}

// Input rows the windows of output rows [r0, r1) read.
std::pair<std::size_t, std::size_t> window_rows(const PoolGeometry& g, std::size_t r0,
                                                std::size_t r1) {
  return {g.row(r0).begin, std::max(g.row(r1 - 1).end, g.row(r0).begin + 1)};
}

// Output rows whose windows overlap input rows [r0, r1) (at least one row, for the layout).
std::pair<std::size_t, std::size_t> rows_covering(const PoolGeometry& g, std::size_t r0,
                                                  std::size_t r1) {
  std::size_t a = g.oh, b = 0;
  for (std::size_t oy = 0; oy < g.oh; ++oy) {
    const Window w = g.row(oy);
    if (w.end > r0 && w.begin < r1) a = std::min(a, oy), b = std::max(b, oy + 1);
  }
  if (a >= b) return {0, 1};
  return {a, b};
}

void expect_f32_nchw(const Tensor& t, const std::string& name, const char* what) {
  expect(t.dtype() == DType::f32 && t.rank() == 4, name,
         std::string(what) + " must be float32 [n, c, h, w], got " + dtype_name(t.dtype()) +
             shape_str(t.shape()));
}

}  // namespace

std::vector<std::size_t> pool2d_output_shape(const std::vector<std::size_t>& x, const PoolParams& p,
                                             const std::string& name) {
  expect(x.size() == 4, name, "input must be [n, c, h, w], got " + shape_str(x));
  expect(x[0] > 0 && x[1] > 0 && x[2] > 0 && x[3] > 0, name, "input " + shape_str(x) + " is empty");
  if (p.adaptive) {
    expect(p.out_h >= 1 && p.out_w >= 1, name,
           "adaptive output size must be at least 1x1, got " + std::to_string(p.out_h) + "x" +
               std::to_string(p.out_w));
    return {x[0], x[1], p.out_h, p.out_w};
  }
  expect(p.kernel_h >= 1 && p.kernel_w >= 1 && p.stride_h >= 1 && p.stride_w >= 1, name,
         "kernel and stride must be at least 1, got kernel " + std::to_string(p.kernel_h) + "x" +
             std::to_string(p.kernel_w) + ", stride " + std::to_string(p.stride_h) + "x" +
             std::to_string(p.stride_w));
  expect(2 * p.pad_h <= p.kernel_h && 2 * p.pad_w <= p.kernel_w, name,
         "padding " + std::to_string(p.pad_h) + "x" + std::to_string(p.pad_w) +
             " must be at most half the kernel " + std::to_string(p.kernel_h) + "x" +
             std::to_string(p.kernel_w) + " (as in PyTorch)");
  const std::size_t oh = conv_output_size(x[2], 2 * p.pad_h, p.kernel_h, 1, p.stride_h);
  const std::size_t ow = conv_output_size(x[3], 2 * p.pad_w, p.kernel_w, 1, p.stride_w);
  expect(oh > 0 && ow > 0, name,
         "window " + std::to_string(p.kernel_h) + "x" + std::to_string(p.kernel_w) +
             " does not fit input " + shape_str(x) + "; use a smaller kernel or more padding");
  return {x[0], x[1], oh, ow};
}

Tensor max_pool2d(Graph& graph, Program& prog, const Tensor& x, const PoolParams& params,
                  const std::string& name) {
  expect_f32_nchw(x, name, "input");
  expect(!params.adaptive, name, "max pooling with adaptive windows is not supported");
  const auto out = pool2d_output_shape(x.shape(), params, name);
  const PoolGeometry g = geometry_of(x.shape(), out, params);
  return lower(graph, prog, name, "MaxPool", out,
               {{x, [&](std::size_t a, std::size_t b) { return window_rows(g, a, b); }}}, g,
               window_elements(g));
}

Tensor avg_pool2d(Graph& graph, Program& prog, const Tensor& x, const PoolParams& params,
                  const std::string& name) {
  expect_f32_nchw(x, name, "input");
  const auto out = pool2d_output_shape(x.shape(), params, name);
  const PoolGeometry g = geometry_of(x.shape(), out, params);
  return lower(graph, prog, name, "AvgPool", out,
               {{x, [&](std::size_t a, std::size_t b) { return window_rows(g, a, b); }}}, g,
               window_elements(g));
}

Tensor max_pool2d_grad(Graph& graph, Program& prog, const Tensor& dy, const Tensor& x,
                       const PoolParams& params, const std::string& name) {
  expect_f32_nchw(dy, name, "output gradient");
  expect_f32_nchw(x, name, "input");
  expect(!params.adaptive, name, "max pooling with adaptive windows is not supported");
  const auto out = pool2d_output_shape(x.shape(), params, name);
  expect(dy.shape() == out, name,
         "output gradient must be " + shape_str(out) + " for input " + shape_str(x.shape()) +
             ", got " + shape_str(dy.shape()));
  const PoolGeometry g = geometry_of(x.shape(), out, params);
  // dx rows [a, b) need the dy rows whose windows overlap them, and all of those windows in x.
  const auto dy_rows = [&](std::size_t a, std::size_t b) { return rows_covering(g, a, b); };
  const auto x_rows = [&](std::size_t a, std::size_t b) {
    const auto [o0, o1] = rows_covering(g, a, b);
    const auto [w0, w1] = window_rows(g, o0, o1);
    return std::pair{std::min(w0, a), std::max(w1, b)};
  };
  return lower(graph, prog, name, "MaxPoolGrad", x.shape(), {{x, x_rows}, {dy, dy_rows}}, g,
               window_elements(g));
}

Tensor avg_pool2d_grad(Graph& graph, Program& prog, const Tensor& dy,
                       const std::vector<std::size_t>& input_shape, const PoolParams& params,
                       const std::string& name) {
  expect_f32_nchw(dy, name, "output gradient");
  const auto out = pool2d_output_shape(input_shape, params, name);
  expect(dy.shape() == out, name,
         "output gradient must be " + shape_str(out) + " for input " + shape_str(input_shape) +
             ", got " + shape_str(dy.shape()));
  const PoolGeometry g = geometry_of(input_shape, out, params);
  return lower(graph, prog, name, "AvgPoolGrad", input_shape,
               {{dy, [&](std::size_t a, std::size_t b) { return rows_covering(g, a, b); }}}, g,
               window_elements(g));
}

}  // namespace ops
}  // namespace ipupod::ipu
