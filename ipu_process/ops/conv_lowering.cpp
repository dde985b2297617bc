// Convolution lowering: each op is one exchange that brings every tile its input rows with their
// halo and its weight slice, then a compute set of vertices on the tile; weight gradients split
// over tiles add a second exchange and sum.
#include <algorithm>
#include <string>
#include <vector>

#include "ipu_process/ops/common.hpp"
#include "ipu_process/ops/conv.hpp"
#include "ipu_process/ops/conv_internal.hpp"

namespace ipupod::ipu::ops {

using conv_impl::ceil_div;
using conv_impl::ConvGeometry;
using conv_impl::Dims;
using conv_impl::expect;
using conv_impl::make_dims;
using conv_impl::plan_forward;
using conv_impl::plan_grad_input;
using conv_impl::plan_grad_weight;
using conv_impl::shape_str;

namespace {

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

// Adds the copies of channels [c0, c1), rows [r0, r1) of batch element b of src (NCHW) into
// dst's local block [channels, rows, width] (or, with `back`, from the block into src): one
// pair when the rows are whole planes (the channels are then contiguous in both), else one per
// channel.
void add_plane_copies(CopyRuns& copies, const Tensor& src, std::size_t b, std::size_t c0,
                      std::size_t c1, std::size_t r0, std::size_t r1, const Tensor& dst_block,
                      bool back = false) {
  const auto add = [&](const Tensor& from, const Tensor& to) {
    back ? copies.add(to, from) : copies.add(from, to);
  };
  const std::size_t channels = src.dim(1), height = src.dim(2), width = src.dim(3);
  const Tensor s = src.flatten(), d = dst_block.flatten();
  const std::size_t plane = height * width, first = (b * channels + c0) * plane;
  if (r0 == 0 && r1 == height) {
    add(s.slice(first, first + (c1 - c0) * plane), d);
    return;
  }
  // Taken many times over while lowering a full-size model: flat slices, not nested views.
  const std::size_t n = (r1 - r0) * width, dst_plane = d.elements() / dst_block.dim(0);
  for (std::size_t ch = c0; ch < c1; ++ch) {
    const std::size_t from = first + (ch - c0) * plane + r0 * width, to = (ch - c0) * dst_plane;
    add(s.slice(from, from + n), d.slice(to, to + dst_plane));
  }
}

// Maps a pass's output y [n, channels, rows, width]: block by block on the tile that computes
// it (tile_of(batch block, channel block, row block)), or, when the plan remaps, in even runs
// of whole rows over the plan's tiles from `first`.
template <class TileOf>
void map_output(Graph& graph, const Tensor& y, const ConvPlan& plan, unsigned first,
                TileOf&& tile_of) {
  const std::size_t n = y.dim(0), channels = y.dim(1), rows = y.dim(2), width = y.dim(3);
  if (!plan.remap) {
    for (std::size_t b = 0; b < n; ++b)
      for (std::size_t c = 0; c < channels; ++c)
        for (std::size_t rb = 0; rb < plan.row_blocks; ++rb) {
          const std::size_t r0 = rb * plan.row_block, r1 = std::min(rows, r0 + plan.row_block);
          graph.set_tile_mapping(y.row(b).row(c).rows(r0, r1),
                                 tile_of(b / plan.batch_block, c / plan.channel_block, rb));
        }
    return;
  }
  map_rows_evenly(graph, y, width, plan.tiles(), first);
}

// d with the operands' type and the graph's partials type, which the planner's cycles need.
Dims typed(Dims d, const Graph& graph, DType dtype) {
  d.dtype = dtype;
  d.half_partials = graph.half_partials();
  return d;
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

Tensor conv2d(Graph& graph, Program& prog, const Tensor& x, const Tensor& w,
              const ConvParams& params, const std::string& name) {
  expect_f32(x, name, "input");
  expect_f32(w, name, "weight");
  expect_same_type(x, w, name);
  const Dims d = typed(make_dims(x.shape(), w.shape(), params, name), graph, x.dtype());
  const ConvPlan plan = plan_forward(graph.arch(), graph.available_memory_proportion(), d);
  const unsigned first = first_tile(graph, name);
  const auto tile_of = [&](std::size_t bb, std::size_t cb, std::size_t rb) {
    return static_cast<unsigned>((first + (bb * plan.channel_blocks + cb) * plan.row_blocks + rb) %
                                 graph.tiles());
  };
  Tensor y = graph.add_variable(x.dtype(), {d.n, d.co, d.oh, d.ow}, name);
  map_output(graph, y, plan, first, tile_of);
  CopyRuns copies, outputs;
  TilePieces y_pieces(graph, x.dtype(), name + "/out");
  const ComputeSetId cs = graph.add_compute_set(name);
  const ConvGeometry geo = d.geometry(graph.half_partials());
  TilePieces x_pieces(graph, x.dtype(), name + "/x"), w_pieces(graph, w.dtype(), name + "/w");
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
        Tensor xl = x_pieces.add(tile, {b1 - b0, c1 - c0, ir1 - ir0, d.w});
        Tensor wl = w_pieces.add(tile, {o1 - o0, d.cig, d.kh, d.kw});
        for (std::size_t b = b0; b < b1; ++b)
          add_plane_copies(copies, x, b, c0, c1, ir0, ir1, xl.row(b - b0));
        copies.add(w.rows(o0, o1).flatten(), wl.flatten());
        Tensor yl;  // the block's piece when the plan remaps
        if (plan.remap) {
          yl = y_pieces.add(tile, {b1 - b0, o1 - o0, r1 - r0, d.ow});
          for (std::size_t b = b0; b < b1; ++b)
            add_plane_copies(outputs, y, b, o0, o1, r0, r1, yl.row(b - b0), true);
        }
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
                v.fields[2].push_back((plan.remap ? yl.row(b - b0).row(o - o0).rows(q0, q1)
                                                  : y.row(b).row(o).rows(r0 + q0, r0 + q1))
                                          .flatten());
                v.params.push_back(double(b - b0));
                v.params.push_back(double((o - o0) * d.cig * d.taps));
                v.params.push_back(double(o / d.cog * d.cig - c0));
              }
              graph.add_vertex(cs, std::move(v));
            });
      }
  prog.add(Program::copy(std::move(copies)));
  prog.add(Program::execute(cs));
  if (plan.remap) prog.add(Program::copy(std::move(outputs)));
  return y;
}

namespace {

// dx from dy and w for the dimensions d (whose output size may be smaller than the forward
// formula's when a transposed convolution's output padding exceeds its stride).
Tensor grad_input(Graph& graph, Program& prog, const Tensor& dy, const Tensor& w, const Dims& d,
                  const std::string& name) {
  const std::vector<std::size_t> input_shape = {d.n, d.ci, d.h, d.w};
  const ConvPlan plan = plan_grad_input(graph.arch(), graph.available_memory_proportion(),
                                        typed(d, graph, dy.dtype()));
  const unsigned first = first_tile(graph, name);
  const auto tile_of = [&](std::size_t bb, std::size_t cb, std::size_t rb) {
    return static_cast<unsigned>((first + (bb * plan.channel_blocks + cb) * plan.row_blocks + rb) %
                                 graph.tiles());
  };
  Tensor dx = graph.add_variable(dy.dtype(), input_shape, name);
  map_output(graph, dx, plan, first, tile_of);
  CopyRuns copies, outputs;
  TilePieces dx_pieces(graph, dy.dtype(), name + "/out");
  const ComputeSetId cs = graph.add_compute_set(name);
  const ConvGeometry geo = d.geometry(graph.half_partials());
  TilePieces dy_pieces(graph, dy.dtype(), name + "/dy"), w_pieces(graph, w.dtype(), name + "/w");
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
        Tensor dyl = dy_pieces.add(tile, {b1 - b0, q1 - q0, oy1 - oy0, d.ow});
        // Weights grouped by group: for each group the block touches, [cog, its channels, taps].
        const std::size_t g0 = c0 / d.cig, g1 = (c1 - 1) / d.cig + 1;
        std::vector<std::size_t> group_offset(g1 - g0 + 1, 0);
        for (std::size_t gr = g0; gr < g1; ++gr) {
          const std::size_t l0 = std::max(c0, gr * d.cig), l1 = std::min(c1, (gr + 1) * d.cig);
          group_offset[gr - g0 + 1] = group_offset[gr - g0] + d.cog * (l1 - l0) * d.taps;
        }
        Tensor wl = w_pieces.add(tile, {group_offset.back()});
        for (std::size_t b = b0; b < b1; ++b)
          add_plane_copies(copies, dy, b, q0, q1, oy0, oy1, dyl.row(b - b0));
        for (std::size_t gr = g0; gr < g1; ++gr) {
          const std::size_t l0 = std::max(c0, gr * d.cig) - gr * d.cig,
                            l1 = std::min(c1, (gr + 1) * d.cig) - gr * d.cig;
          const std::size_t len = (l1 - l0) * d.taps;
          if (l1 - l0 == d.cig) {  // the group's whole weights, contiguous in w and in wl
            const std::size_t at_w = group_offset[gr - g0];
            copies.add(w.rows(gr * d.cog, (gr + 1) * d.cog).flatten(),
                       wl.slice(at_w, at_w + d.cog * len));
            continue;
          }
          for (std::size_t o = 0; o < d.cog; ++o) {
            const std::size_t at_w = group_offset[gr - g0] + o * len;
            copies.add(w.row(gr * d.cog + o).rows(l0, l1).flatten(), wl.slice(at_w, at_w + len));
          }
        }
        Tensor dxl;  // the block's piece when the plan remaps
        if (plan.remap) {
          dxl = dx_pieces.add(tile, {b1 - b0, c1 - c0, r1 - r0, d.w});
          for (std::size_t b = b0; b < b1; ++b)
            add_plane_copies(outputs, dx, b, c0, c1, r0, r1, dxl.row(b - b0), true);
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
                v.fields[2].push_back((plan.remap ? dxl.row(b - b0).row(c - c0).rows(s0, s1)
                                                  : dx.row(b).row(c).rows(r0 + s0, r0 + s1))
                                          .flatten());
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
  if (plan.remap) prog.add(Program::copy(std::move(outputs)));
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
  const ConvPlan plan = plan_grad_weight(graph.arch(), graph.available_memory_proportion(),
                                         typed(d, graph, x.dtype()));
  const std::size_t parts = plan.batch_blocks * plan.row_blocks;
  const unsigned first = first_tile(graph, name);
  // Tile of output-channel block cb and reduction part p (batch block x row block).
  const auto tile_of = [&](std::size_t cb, std::size_t p) {
    return static_cast<unsigned>((first + cb * parts + p) % graph.tiles());
  };
  Tensor dw = graph.add_variable(x.dtype(), weight_shape, name);
  CopyRuns copies;
  const ComputeSetId cs = graph.add_compute_set(name);
  const ConvGeometry geo = d.geometry(graph.half_partials());
  const std::size_t workers = graph.arch().workers_per_tile;
  // partials[cb][p]: the weight-gradient block of part p (dw itself when there is one part).
  std::vector<std::vector<Tensor>> partials(plan.channel_blocks);
  TilePieces part_pieces(graph, DType::f32, name + "/partial"),
      x_pieces(graph, x.dtype(), name + "/x"), dy_pieces(graph, dy.dtype(), name + "/dy");
  for (std::size_t cb = 0; cb < plan.channel_blocks; ++cb) {
    const std::size_t o0 = cb * plan.channel_block, o1 = std::min(d.co, o0 + plan.channel_block);
    if (o0 >= o1) continue;
    const auto [c0, c1] = d.input_channels(o0, o1);
    const std::size_t ob = o1 - o0;
    for (std::size_t bb = 0; bb < plan.batch_blocks; ++bb)
      for (std::size_t rb = 0; rb < plan.row_blocks; ++rb) {
        const std::size_t p = bb * plan.row_blocks + rb;
        const unsigned tile = tile_of(cb, p);
        const std::size_t b0 = bb * plan.batch_block, b1 = std::min(d.n, b0 + plan.batch_block);
        const std::size_t r0 = rb * plan.row_block, r1 = std::min(d.oh, r0 + plan.row_block);
        Tensor part = dw.rows(o0, o1);
        if (parts > 1)
          part = part_pieces.add(tile, {ob, d.cig, d.kh, d.kw});
        else
          graph.set_tile_mapping(part, tile);
        partials[cb].push_back(part);
        if (b0 >= b1 || r0 >= r1) {  // an empty part (uneven blocks) contributes zeros
          graph.add_vertex(
              cs,
              {"ConvPartialsSum", tile, {{}, {part.flatten()}}, {double(part.elements()), 0.0}});
          continue;
        }
        const auto [ir0, ir1] = d.input_rows(r0, r1);
        Tensor xl = x_pieces.add(tile, {b1 - b0, c1 - c0, ir1 - ir0, d.w});
        Tensor dyl = dy_pieces.add(tile, {b1 - b0, ob, r1 - r0, d.ow});
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
  CopyRuns gathers;
  const ComputeSetId reduce = graph.add_compute_set(name + "/reduce");
  TilePieces gathered_pieces(graph, DType::f32, name + "/gathered");
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
      Tensor gathered = gathered_pieces.add(tile, {parts - 1, len});
      for (std::size_t p = 0, k = 0; p < parts; ++p)
        if (p != s) gathers.add(partials[cb][p].flatten().slice(e0, e1), gathered.row(k++));
      // One vertex, its workers sharing out the columns; the partials in part order: the
      // gathered rows before part s, part s's own slice, the gathered rows after it.
      Vertex v{"ConvPartialsSum", tile, {{}, {}}, {double(len), 0.0}};
      if (s > 0) v.fields[0].push_back(gathered.rows(0, s).flatten());
      v.fields[0].push_back(partials[cb][s].flatten().slice(e0, e1));
      if (s + 1 < parts) v.fields[0].push_back(gathered.rows(s, parts - 1).flatten());
      const std::size_t wper = ceil_div(len, std::min(len, workers));
      for (std::size_t w0 = 0; w0 < len; w0 += wper) {
        v.fields[1].push_back(block.slice(e0 + w0, e0 + std::min(len, w0 + wper)));
        if (w0 > 0) v.params.push_back(double(w0));
      }
      v.slices = v.fields[1].size();
      graph.add_vertex(reduce, std::move(v));
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

}  // namespace ipupod::ipu::ops
