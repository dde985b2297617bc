// The general tensor op library: elementwise unary and binary ops with broadcasting, reductions,
// permutes, slices, concatenation, random masks and casts, lowered onto MapAffine and the other
// codelets of tensor_ops_codelets.cpp (a permute is a copy: the exchange alone moves it).
#include "ipu_process/ops/tensor_ops.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>

#include "ipu_process/codelets.hpp"
#include "ipu_process/ops/common.hpp"
#include "ipu_process/ops/elementwise.hpp"
#include "ipu_process/ops/tensor_ops_internal.hpp"

namespace ipupod::ipu {
namespace ops {
namespace {

using namespace tensor_ops_impl;  // NOLINT(google-build-using-namespace): shared with its codelets

constexpr std::size_t kMinElementsPerWorker = 64;
constexpr std::size_t kNoAxis = std::numeric_limits<std::size_t>::max();

std::vector<std::size_t> at_least_1d(std::vector<std::size_t> s) {
  if (s.empty()) s = {1};
  return s;
}

std::vector<Index> strides_of(const std::vector<std::size_t>& shape) {
  std::vector<Index> s(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * static_cast<Index>(shape[i]);
  return s;
}

std::string shape_str(const std::vector<std::size_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

// How an operand is read from the output's coordinates: flat index = offset + coord . strides.
struct Operand {
  Tensor t;
  std::vector<Index> strides;
  Index offset = 0;
};
// Only output coordinates with begin <= coord[axis] < end are written.
struct Window {
  std::size_t axis = kNoAxis, begin = 0, end = 0;
};

// `t` read as if broadcast to out_shape (aligned right; stride 0 on broadcast axes).
Operand broadcast_operand(const Tensor& t, const std::vector<std::size_t>& out_shape) {
  const auto shape = t.shape();
  const auto s = strides_of(shape);
  Operand op{t, std::vector<Index>(out_shape.size(), 0), 0};
  const std::size_t lead = out_shape.size() - shape.size();
  for (std::size_t i = 0; i < shape.size(); ++i) op.strides[lead + i] = shape[i] == 1 ? 0 : s[i];
  if (op.strides.empty()) op.strides = {0};
  return op;
}

// The smallest and largest flat index of the operand read by output elements [b, e) (inside
// the window); nullopt if none is in the window. Exact: the flat range is split into at most
// 2 x rank + 1 boxes of coordinates (the rest of b's block, whole blocks between, the start of
// e - 1's block), each giving its extremes from its corners, so a piece that crosses a sample
// or channel boundary does not read the whole operand.
std::optional<std::pair<Index, Index>> touched(const std::vector<std::size_t>& shape,
                                               const Operand& op, std::size_t b, std::size_t e,
                                               const Window& w) {
  const std::size_t rank = shape.size();
  const auto cb = coords_of(b, shape), ce = coords_of(e - 1, shape);
  std::optional<std::pair<Index, Index>> result;
  std::vector<std::size_t> lo(rank), hi(rank);
  const auto box = [&] {  // the box [lo, hi], clipped to the window
    if (w.axis < rank) {
      if (w.begin >= w.end) return;
      lo[w.axis] = std::max(lo[w.axis], w.begin);
      hi[w.axis] = std::min(hi[w.axis], w.end - 1);
      if (lo[w.axis] > hi[w.axis]) return;
    }
    Index first = op.offset, last = op.offset;
    for (std::size_t d = 0; d < rank; ++d) {
      const Index a = static_cast<Index>(lo[d]) * op.strides[d],
                  z = static_cast<Index>(hi[d]) * op.strides[d];
      first += std::min(a, z), last += std::max(a, z);
    }
    if (!result)
      result = std::make_pair(first, last);
    else
      result->first = std::min(result->first, first),
      result->second = std::max(result->second, last);
  };
  // Boxes with dimensions [0, j) fixed at c, dimension j in [from, to], the rest whole.
  const auto slab = [&](const std::vector<std::size_t>& c, std::size_t j, std::size_t from,
                        std::size_t to) {
    if (from > to) return;
    for (std::size_t d = 0; d < rank; ++d)
      if (d < j)
        lo[d] = hi[d] = c[d];
      else if (d == j)
        lo[d] = from, hi[d] = to;
      else
        lo[d] = 0, hi[d] = shape[d] - 1;
    box();
  };
  std::size_t d0 = 0;
  while (d0 < rank && cb[d0] == ce[d0]) ++d0;
  if (d0 == rank) {  // one element
    lo = cb, hi = cb;
    box();
    return result;
  }
  // From b to the end of its block at d0: b itself, then larger coordinates at each level.
  lo = cb, hi = cb;
  box();
  for (std::size_t j = d0 + 1; j < rank; ++j) slab(cb, j, cb[j] + 1, shape[j] - 1);
  // Whole blocks strictly between.
  slab(cb, d0, cb[d0] + 1, ce[d0] - 1);
  // From the start of e - 1's block at d0 to e - 1.
  lo = ce, hi = ce;
  box();
  for (std::size_t j = d0 + 1; j < rank; ++j)
    if (ce[j] > 0) slab(ce, j, 0, ce[j] - 1);
  return result;
}

// A float32 output spread over the tiles in pieces of `grain` elements. Tensors too small to
// reach every tile start at a tile that moves with each new variable, so the many small outputs
// of a model do not all pile up on the first tiles.
Tensor spread(Graph& graph, const std::vector<std::size_t>& shape, const std::string& name,
              std::size_t grain = kMinElementsPerWorker) {
  Tensor out = graph.add_variable(DType::f32, shape, name);
  grain = std::clamp<std::size_t>(grain, 1, std::max<std::size_t>(out.elements(), 1));
  const std::size_t pieces = (out.elements() + grain - 1) / grain;
  if (pieces >= graph.tiles()) {
    graph.map_linearly(out, grain);
  } else {
    graph.map_linearly(out, grain, moving_first_tile(graph, pieces), static_cast<unsigned>(pieces));
  }
  return out;
}

// The slice [lo, hi] of t made available on `tile`: t itself where it already lives there,
// else a piece of `pieces` on the tile filled by an exchange appended to `copies` (a tile's
// pieces of one operand follow each other in one variable, as one run of tile memory).
Tensor on_tile(Graph& graph, const Tensor& t, Index lo, Index hi, unsigned tile,
               std::vector<std::pair<Tensor, Tensor>>& copies, TilePieces& pieces) {
  const Tensor src =
      t.flatten().slice(static_cast<std::size_t>(lo), static_cast<std::size_t>(hi) + 1);
  const auto mapping = graph.tile_mapping(src);
  if (std::all_of(mapping.begin(), mapping.end(),
                  [&](const TileInterval& iv) { return iv.tile == tile; }))
    return src;
  Tensor local = pieces.add(tile, {src.elements()});
  copies.emplace_back(src, local);
  return local;
}

// Adds MapAffine vertices computing `out` (or its window) from the operands to `cs`, one per
// worker piece of out; the exchange bringing operand ranges onto the tiles goes to `copies`.
void add_map_affine(Graph& graph, ComputeSetId cs, std::vector<std::pair<Tensor, Tensor>>& copies,
                    MapOp op, float scale, const std::vector<Operand>& ins, const Tensor& out,
                    const Window& window, const std::string& name) {
  const auto shape = at_least_1d(out.shape());
  struct Piece {
    unsigned tile;
    std::size_t b, e;
    std::vector<std::pair<Index, Index>> ranges;
  };
  std::vector<Piece> pieces;
  // Per tile and operand: the ranges its pieces read, merged where they overlap or touch. Each
  // span is read in place when the operand holds it on the tile, else copied there: a tile
  // holding several separate stretches of an operand copies none of them.
  std::map<std::pair<unsigned, std::size_t>, std::vector<std::pair<Index, Index>>> spans;
  for_each_worker_piece(graph, out, kMinElementsPerWorker,
                        [&](unsigned tile, std::size_t b, std::size_t e) {
                          Piece piece{tile, b, e, {}};
                          for (std::size_t i = 0; i < ins.size(); ++i) {
                            const auto r = touched(shape, ins[i], b, e, window);
                            if (!r) return;
                            piece.ranges.push_back(*r);
                            spans[{tile, i}].push_back(*r);
                          }
                          pieces.push_back(std::move(piece));
                        });
  std::map<std::pair<unsigned, std::size_t>, std::vector<Tensor>> local;
  std::vector<TilePieces> copied;
  for (std::size_t i = 0; i < ins.size(); ++i)
    copied.emplace_back(graph, ins[i].t.dtype(), name + "/in" + std::to_string(i));
  for (auto& [key, ranges] : spans) {
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<Index, Index>> merged;
    for (const auto& r : ranges)
      if (!merged.empty() && r.first <= merged.back().second + 1)
        merged.back().second = std::max(merged.back().second, r.second);
      else
        merged.push_back(r);
    ranges = std::move(merged);
    auto& tensors = local[key];
    for (const auto& [lo, hi] : ranges)
      tensors.push_back(
          on_tile(graph, ins[key.second].t, lo, hi, key.first, copies, copied[key.second]));
  }
  // The span of (tile, operand) holding range r, and its tensor.
  const auto span_of = [&](unsigned tile, std::size_t i, const std::pair<Index, Index>& r) {
    const auto& ranges = spans.at({tile, i});
    const auto k = static_cast<std::size_t>(
        std::upper_bound(ranges.begin(), ranges.end(), r.first,
                         [](Index x, const std::pair<Index, Index>& s) { return x < s.first; }) -
        ranges.begin() - 1);
    return std::pair{ranges[k].first, local.at({tile, i})[k]};
  };
  const Tensor flat_out = out.flatten();
  // One vertex per tile, a worker slice per piece in element order (see Vertex::slices): the
  // piece begin and the operands' offsets into their spans vary by slice.
  if (ins.size() != 1 && window.axis != kNoAxis)
    throw std::logic_error(name + ": a windowed map takes one operand");
  Vertex v{ins.size() != 1          ? "MapAffineBinary"
           : window.axis == kNoAxis ? "MapAffine"
                                    : "MapAffineWindow",
           0,
           {},
           {}};
  for_each_tile_group(
      pieces.size(), [&](std::size_t i) { return pieces[i].tile; },
      [&](unsigned tile, std::span<const std::size_t> group) {
        v.tile = tile;
        v.slices = group.size();
        v.fields.assign(ins.size() + 1, {});
        v.params.clear();
        for (std::size_t k = 0; k < group.size(); ++k) {
          const Piece& piece = pieces[group[k]];
          Index offsets[2] = {0, 0};
          for (std::size_t i = 0; i < ins.size(); ++i) {
            const auto [begin, tensor] = span_of(tile, i, piece.ranges[i]);
            v.fields[i].push_back(tensor);
            offsets[i] = ins[i].offset - begin;
          }
          v.fields[ins.size()].push_back(flat_out.slice(piece.b, piece.e));
          if (k == 0) {
            v.params = {
                static_cast<double>(piece.b),
                static_cast<double>(offsets[0]),
                static_cast<double>(offsets[1]),
                static_cast<double>(op),
                scale,
                static_cast<double>(ins.size()),
                static_cast<double>(shape.size()),
                static_cast<double>(window.axis < shape.size() ? window.axis : shape.size()),
                static_cast<double>(window.begin),
                static_cast<double>(window.end)};
            for (std::size_t d : shape) v.params.push_back(static_cast<double>(d));
            for (std::size_t i = 0; i < ins.size(); ++i)
              for (Index s : ins[i].strides) v.params.push_back(static_cast<double>(s));
          } else {  // this slice's piece begin and offsets (Codelet::slice_params)
            v.params.push_back(static_cast<double>(piece.b));
            for (std::size_t i = 0; i < (ins.size() == 1 ? 1 : 2); ++i)
              v.params.push_back(static_cast<double>(offsets[i]));
          }
        }
        graph.add_vertex(cs, v);
      });
}

// One compute set of MapAffine vertices, preceded by the exchange of its operands.
void run_map_affine(Graph& graph, Program& prog, MapOp op, float scale,
                    const std::vector<Operand>& ins, const Tensor& out, const Window& window,
                    const std::string& name) {
  std::vector<std::pair<Tensor, Tensor>> copies;
  const ComputeSetId cs = graph.add_compute_set(name);
  add_map_affine(graph, cs, copies, op, scale, ins, out, window, name);
  if (!copies.empty()) prog.add(Program::copy(std::move(copies)));
  prog.add(Program::execute(cs));
}

void check_f32(const Tensor& t, const std::string& name, const char* what) {
  if (t.dtype() != DType::f32)
    throw std::invalid_argument(name + ": " + what + " must be float32, got " +
                                dtype_name(t.dtype()));
}

void check_axis(std::size_t axis, std::size_t rank, const std::string& name) {
  if (axis >= rank)
    throw std::invalid_argument(name + ": axis " + std::to_string(axis) +
                                " out of range for rank " + std::to_string(rank));
}

}  // namespace

Tensor unary(Graph& graph, Program& prog, UnaryOp op, const Tensor& x, float alpha,
             const std::string& name) {
  check_f32(x, name, "x");
  Tensor out = clone_like(graph, x, name);
  const ComputeSetId cs = graph.add_compute_set(name);
  add_elementwise_vertices(graph, cs, "Unary", {x, out}, x, kMinElementsPerWorker,
                           {static_cast<double>(op), static_cast<double>(alpha)});
  prog.add(Program::execute(cs));
  return out;
}

Tensor unary_grad(Graph& graph, Program& prog, UnaryOp op, const Tensor& dy, const Tensor& x,
                  float alpha, const std::string& name) {
  check_f32(x, name, "x");
  if (dy.shape() != x.shape())
    throw std::invalid_argument(name + ": dy " + shape_str(dy.shape()) + " and x " +
                                shape_str(x.shape()) + " differ in shape");
  Tensor dx = clone_like(graph, x, name);
  const Tensor dy_local = rearrange_like(graph, prog, dy, x, name + "/dy").flatten();
  const ComputeSetId cs = graph.add_compute_set(name);
  add_elementwise_vertices(graph, cs, "UnaryGrad", {dy_local, x, dx}, x, kMinElementsPerWorker,
                           {static_cast<double>(op), static_cast<double>(alpha)});
  prog.add(Program::execute(cs));
  return dx;
}

Tensor binary(Graph& graph, Program& prog, BinaryOp op, const Tensor& a, const Tensor& b,
              const std::string& name) {
  check_f32(a, name, "a");
  check_f32(b, name, "b");
  const auto& sa = a.shape();
  const auto& sb = b.shape();
  std::vector<std::size_t> shape(std::max(sa.size(), sb.size()), 1);
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const std::size_t da = i < sa.size() ? sa[sa.size() - 1 - i] : 1;
    const std::size_t db = i < sb.size() ? sb[sb.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1)
      throw std::invalid_argument(name + ": shapes " + shape_str(sa) + " and " + shape_str(sb) +
                                  " do not broadcast");
    shape[shape.size() - 1 - i] = std::max(da, db);
  }
  Tensor out = a.shape() == shape   ? clone_like(graph, a, name)
               : b.shape() == shape ? clone_like(graph, b, name)
                                    : spread(graph, shape, name);
  const auto full = at_least_1d(shape);
  const MapOp map_op = op == BinaryOp::add   ? kAdd
                       : op == BinaryOp::sub ? kSub
                       : op == BinaryOp::mul ? kMul
                                             : kDiv;
  run_map_affine(graph, prog, map_op, 1.f, {broadcast_operand(a, full), broadcast_operand(b, full)},
                 out, {}, name);
  return out;
}

Tensor broadcast_to(Graph& graph, Program& prog, const Tensor& x,
                    const std::vector<std::size_t>& shape, float scale, const std::string& name) {
  check_f32(x, name, "x");
  if (x.rank() > shape.size())
    throw std::invalid_argument(name + ": cannot broadcast " + shape_str(x.shape()) + " to " +
                                shape_str(shape));
  for (std::size_t i = 0; i < x.rank(); ++i) {
    const std::size_t d = x.dim(x.rank() - 1 - i), t = shape[shape.size() - 1 - i];
    if (d != t && d != 1)
      throw std::invalid_argument(name + ": cannot broadcast " + shape_str(x.shape()) + " to " +
                                  shape_str(shape));
  }
  Tensor out = spread(graph, shape, name);
  run_map_affine(graph, prog, kCopyScaled, scale, {broadcast_operand(x, at_least_1d(shape))}, out,
                 {}, name);
  return out;
}

Tensor reduce_sum(Graph& graph, Program& prog, const Tensor& x,
                  const std::vector<std::size_t>& axes, bool keepdims, float scale,
                  const std::string& name) {
  check_f32(x, name, "x");
  const auto in = at_least_1d(x.shape());
  std::vector<bool> reduced(in.size(), false);
  for (std::size_t ax : axes) {
    check_axis(ax, x.rank(), name);
    reduced[ax] = true;
  }
  std::vector<std::size_t> kept_shape, out_shape;
  for (std::size_t d = 0; d < in.size(); ++d) {
    kept_shape.push_back(reduced[d] ? 1 : in[d]);
    if (!reduced[d] || keepdims) out_shape.push_back(reduced[d] ? 1 : in[d]);
  }
  if (x.rank() == 0) out_shape.clear();
  // Output strides seen from x's coordinates (0 on reduced axes).
  const auto ks = strides_of(kept_shape);
  Operand out_of_x{Tensor(), std::vector<Index>(in.size(), 0), 0};
  for (std::size_t d = 0; d < in.size(); ++d) out_of_x.strides[d] = reduced[d] ? 0 : ks[d];

  // Stage 1: each worker reduces its piece of x into a partial covering the outputs it touches.
  struct Partial {
    Tensor t;
    Index lo, hi;
  };
  std::vector<Partial> partials;
  const ComputeSetId stage1 = graph.add_compute_set(name + "/partials");
  const Tensor xf = x.flatten();
  // The partials of a tile's pieces (and below, what each output piece gathers) are pieces of
  // one variable per tile: a full-size model reduces over millions of worker pieces.
  TilePieces partial_pieces(graph, DType::f32, name + "/partial");
  // The pieces on a tile are the worker slices of one vertex (a MultiVertex: a region of x,
  // one of the partials and the piece's begin and lo each), in element order.
  struct Piece {
    unsigned tile;
    std::size_t b, e;
  };
  std::vector<Piece> pieces;
  for_each_worker_piece(
      graph, x, kMinElementsPerWorker, [&](unsigned tile, std::size_t b, std::size_t e) {
        const auto [lo, hi] = *touched(in, out_of_x, b, e, {});
        pieces.push_back({tile, b, e});
        partials.push_back(
            {partial_pieces.add(tile, {static_cast<std::size_t>(hi - lo + 1)}), lo, hi});
      });
  Vertex v{"ReducePartial", 0, {{}, {}}, {}};
  for_each_tile_group(
      pieces.size(), [&](std::size_t i) { return pieces[i].tile; },
      [&](unsigned tile, std::span<const std::size_t> group) {
        v.tile = tile;
        v.slices = group.size();
        v.fields[0].clear(), v.fields[1].clear();
        for (std::size_t k = 0; k < group.size(); ++k) {
          const Piece& piece = pieces[group[k]];
          const Partial& partial = partials[group[k]];
          if (k == 0) {
            v.params = {static_cast<double>(in.size()), static_cast<double>(piece.b),
                        static_cast<double>(partial.lo)};
            for (std::size_t d : in) v.params.push_back(static_cast<double>(d));
            for (Index s : out_of_x.strides) v.params.push_back(static_cast<double>(s));
          } else {
            v.params.push_back(static_cast<double>(piece.b));
            v.params.push_back(static_cast<double>(partial.lo));
          }
          v.fields[0].push_back(xf.slice(piece.b, piece.e));
          v.fields[1].push_back(partial.t);
        }
        graph.add_vertex(stage1, v);
      });
  prog.add(Program::execute(stage1));

  // Stage 2: each output piece gathers the overlapping parts of every partial and sums them.
  // Small outputs go one grain per tile so the partials' fan-in is spread too.
  std::size_t out_elements = 1;
  for (std::size_t d : out_shape) out_elements *= d;
  Tensor out =
      spread(graph, out_shape, name,
             std::min((out_elements + graph.tiles() - 1) / graph.tiles(), kMinElementsPerWorker));
  const Tensor of = out.flatten();
  const ComputeSetId stage2 = graph.add_compute_set(name + "/sum");
  CopyRuns copies;
  TilePieces gathered_pieces(graph, DType::f32, name + "/gathered");
  // The output pieces (in element order) and, for each, the partials that overlap it in the
  // partials' order: each partial visits the pieces it overlaps.
  std::vector<Piece> out_pieces;
  for_each_worker_piece(graph, out, kMinElementsPerWorker,
                        [&](unsigned tile, std::size_t b, std::size_t e) {
                          out_pieces.push_back({tile, b, e});
                        });
  std::vector<std::vector<std::pair<const Partial*, std::pair<Index, Index>>>> parts(
      out_pieces.size());  // overlap [from, to)
  for (const auto& p : partials) {
    auto k = static_cast<std::size_t>(
        std::upper_bound(out_pieces.begin(), out_pieces.end(), p.lo,
                         [](Index x, const Piece& q) { return x < static_cast<Index>(q.e); }) -
        out_pieces.begin());
    for (; k < out_pieces.size() && static_cast<Index>(out_pieces[k].b) <= p.hi; ++k) {
      const Index from = std::max<Index>(p.lo, static_cast<Index>(out_pieces[k].b));
      const Index to = std::min<Index>(p.hi + 1, static_cast<Index>(out_pieces[k].e));
      if (from < to) parts[k].push_back({&p, {from, to}});
    }
  }
  for (std::size_t k = 0; k < out_pieces.size(); ++k) {
    const auto [tile, b, e] = out_pieces[k];
    std::size_t total = 0;
    for (const auto& part : parts[k])
      total += static_cast<std::size_t>(part.second.second - part.second.first);
    Vertex v{"SumRegions", tile, {{}, {of.slice(b, e)}}, {static_cast<double>(scale)}};
    if (total > 0) {
      const Tensor gathered = gathered_pieces.add(tile, {total});
      std::size_t at = 0;
      for (const auto& [p, range] : parts[k]) {
        const std::size_t n = static_cast<std::size_t>(range.second - range.first);
        const std::size_t src = static_cast<std::size_t>(range.first - p->lo);
        copies.add(p->t.slice(src, src + n), gathered.slice(at, at + n));
        v.fields[0].push_back(gathered.slice(at, at + n));
        v.params.push_back(static_cast<double>(range.first - static_cast<Index>(b)));
        at += n;
      }
    }
    std::vector<std::pair<const Partial*, std::pair<Index, Index>>>().swap(parts[k]);
    graph.add_vertex(stage2, std::move(v));
  }
  if (!copies.empty()) prog.add(Program::copy(std::move(copies)));
  prog.add(Program::execute(stage2));
  return out;
}

Tensor permute(Graph& graph, Program& prog, const Tensor& x, const std::vector<std::size_t>& perm,
               const std::string& name) {
  check_f32(x, name, "x");
  if (perm.size() != x.rank())
    throw std::invalid_argument(name + ": permutation of " + std::to_string(perm.size()) +
                                " axes for a tensor of rank " + std::to_string(x.rank()));
  std::vector<bool> seen(perm.size(), false);
  const auto xs = strides_of(x.shape());
  std::vector<std::size_t> shape, strides;  // the output's, and the input's of its axes
  for (std::size_t p : perm) {
    check_axis(p, x.rank(), name);
    if (seen[p])
      throw std::invalid_argument(name + ": axis " + std::to_string(p) +
                                  " repeated in the permutation");
    seen[p] = true;
    shape.push_back(x.dim(p));
    strides.push_back(static_cast<std::size_t>(xs[p]));
  }
  Tensor out = spread(graph, shape, name);
  // The output is rows of the input (the last axes that stay where they are, else single
  // elements), which the exchange moves alone, as a copy of the permuted input (as Poplar
  // copies a dimShuffle'd tensor). A MapAffine piece would bring onto its tile every input
  // element between the first and the last it reads: a piece that crosses a head of an
  // attention, or the channels of a channels-last image, reads its whole sample. The cost is the
  // exchange's: the bytes each tile receives, nothing per row (single elements included).
  std::size_t kept = 0, row = 1;
  while (kept < perm.size() && perm[perm.size() - 1 - kept] == perm.size() - 1 - kept)
    row *= x.dim(perm.size() - 1 - kept++);
  if (x.elements() == 0) return out;
  const std::size_t outer_rank = perm.size() - kept;
  const Tensor from = x.flatten(), to = out.flatten();
  std::vector<std::size_t> at(outer_rank, 0);  // the output row's index in the outer axes
  CopyRuns runs;
  for (std::size_t o = 0; o < out.elements(); o += row) {
    std::size_t i = 0;
    for (std::size_t k = 0; k < outer_rank; ++k) i += at[k] * strides[k];
    runs.add(from.slice(i, i + row), to.slice(o, o + row));
    for (std::size_t k = outer_rank; k-- > 0;) {
      if (++at[k] < shape[k]) break;
      at[k] = 0;
    }
  }
  prog.add(Program::copy(std::move(runs)));
  return out;
}

Tensor slice(Graph& graph, Program& prog, const Tensor& x, std::size_t axis, std::size_t begin,
             std::size_t end, const std::string& name) {
  check_f32(x, name, "x");
  check_axis(axis, x.rank(), name);
  if (begin >= end || end > x.dim(axis))
    throw std::invalid_argument(name + ": slice [" + std::to_string(begin) + ", " +
                                std::to_string(end) + ") of an axis of " +
                                std::to_string(x.dim(axis)));
  std::vector<std::size_t> shape = x.shape();
  shape[axis] = end - begin;
  Operand op{x, strides_of(x.shape()), 0};
  op.offset = static_cast<Index>(begin) * op.strides[axis];
  Tensor out = spread(graph, shape, name);
  run_map_affine(graph, prog, kCopyScaled, 1.f, {op}, out, {}, name);
  return out;
}

Tensor slice_grad(Graph& graph, Program& prog, const Tensor& dy,
                  const std::vector<std::size_t>& input_shape, std::size_t axis, std::size_t begin,
                  std::size_t end, const std::string& name) {
  check_f32(dy, name, "dy");
  check_axis(axis, input_shape.size(), name);
  auto expected = input_shape;
  expected[axis] = end - begin;
  if (begin >= end || end > input_shape[axis] || dy.shape() != expected)
    throw std::invalid_argument(name + ": dy " + shape_str(dy.shape()) + " does not fill [" +
                                std::to_string(begin) + ", " + std::to_string(end) + ") of " +
                                shape_str(input_shape) + " along axis " + std::to_string(axis));
  Tensor out = spread(graph, input_shape, name);
  zero(graph, prog, out, name + "/zero");
  Operand op{dy, strides_of(dy.shape()), 0};
  op.offset = -static_cast<Index>(begin) * op.strides[axis];
  run_map_affine(graph, prog, kCopyScaled, 1.f, {op}, out, {axis, begin, end}, name);
  return out;
}

Tensor concat(Graph& graph, Program& prog, const std::vector<Tensor>& xs, std::size_t axis,
              const std::string& name) {
  if (xs.empty()) throw std::invalid_argument(name + ": concat of no tensors");
  check_axis(axis, xs[0].rank(), name);
  std::vector<std::size_t> shape = xs[0].shape();
  shape[axis] = 0;
  for (const auto& x : xs) {
    check_f32(x, name, "every input");
    std::vector<std::size_t> s = x.shape(), want = xs[0].shape();
    if (s.size() == want.size()) s[axis] = want[axis] = 0;
    if (s != want)
      throw std::invalid_argument(name + ": cannot concatenate " + shape_str(x.shape()) + " with " +
                                  shape_str(xs[0].shape()) + " along axis " + std::to_string(axis));
    shape[axis] += x.dim(axis);
  }
  Tensor out = spread(graph, shape, name);
  std::vector<std::pair<Tensor, Tensor>> copies;
  const ComputeSetId cs = graph.add_compute_set(name);
  std::size_t at = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    Operand op{xs[i], strides_of(xs[i].shape()), 0};
    op.offset = -static_cast<Index>(at) * op.strides[axis];
    const std::size_t len = xs[i].dim(axis);
    add_map_affine(graph, cs, copies, kCopyScaled, 1.f, {op}, out, {axis, at, at + len},
                   name + "/" + std::to_string(i));
    at += len;
  }
  if (!copies.empty()) prog.add(Program::copy(std::move(copies)));
  prog.add(Program::execute(cs));
  return out;
}

namespace {
// One invocation counter per tile holding part of t, like each tile's own PRNG state: a u32 in
// always-live memory, zero at start, so every run draws anew and runs are reproducible.
std::map<unsigned, Tensor> invocation_counters(Graph& graph, const Tensor& t,
                                               const std::string& name) {
  std::vector<unsigned> tiles;
  for (const auto& iv : graph.tile_mapping(t))
    if (std::find(tiles.begin(), tiles.end(), iv.tile) == tiles.end()) tiles.push_back(iv.tile);
  Tensor counters = graph.add_variable(DType::u32, {tiles.size()}, name + "/invocations",
                                       MemoryCategory::optimizer_state);
  std::map<unsigned, Tensor> counter_of;
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    graph.set_tile_mapping(counters.slice(i, i + 1), tiles[i]);
    counter_of.emplace(tiles[i], counters.slice(i, i + 1));
  }
  return counter_of;
}

Program next_invocation(Graph& graph, const std::map<unsigned, Tensor>& counter_of,
                        const std::string& name) {
  const ComputeSetId bump = graph.add_compute_set(name + "/next");
  for (const auto& [tile, counter] : counter_of)
    graph.add_vertex(bump, {"IncrementCounter", tile, {{counter}}, {}});
  return Program::execute(bump);
}
}  // namespace

Tensor random_mask(Graph& graph, Program& prog, const std::vector<std::size_t>& shape, double p,
                   std::uint64_t seed, const std::string& name) {
  if (!(p >= 0 && p < 1))
    throw std::invalid_argument(name + ": drop probability must be in [0, 1), got " +
                                std::to_string(p));
  Tensor out = spread(graph, shape, name);
  const std::map<unsigned, Tensor> counter_of = invocation_counters(graph, out, name);
  const ComputeSetId draw = graph.add_compute_set(name);
  const Tensor of = out.flatten();
  for_each_worker_piece(
      graph, out, kMinElementsPerWorker, [&](unsigned tile, std::size_t b, std::size_t e) {
        graph.add_vertex(draw, {"RandomMask",
                                tile,
                                {{of.slice(b, e)}, {counter_of.at(tile)}},
                                {p, static_cast<double>(seed >> 32),
                                 static_cast<double>(seed & 0xffffffffu), static_cast<double>(b)}});
      });
  prog.add(Program::execute(draw));
  prog.add(next_invocation(graph, counter_of, name));
  return out;
}

Tensor cast(Graph& graph, Program& prog, const Tensor& x, DType to, Rounding rounding,
            std::uint64_t seed, const std::string& name) {
  if (x.dtype() == to) return x;
  const bool widen = x.dtype() == DType::f16 && to == DType::f32;
  if (!widen && !(x.dtype() == DType::f32 && to == DType::f16))
    throw std::invalid_argument(name + ": cast converts between float32 and float16, not " +
                                dtype_name(x.dtype()) + " to " + dtype_name(to));
  Tensor out = clone_like(graph, x, name, MemoryCategory::activation, to);
  const bool stochastic = !widen && rounding == Rounding::stochastic;
  std::map<unsigned, Tensor> counter_of;
  if (stochastic) counter_of = invocation_counters(graph, x, name);
  const ComputeSetId cs = graph.add_compute_set(name);
  if (!stochastic) {
    add_elementwise_vertices(graph, cs, widen ? "CastToFloat" : "CastToHalf", {x, out}, x,
                             kMinElementsPerWorker);
  } else {
    const Tensor xf = x.flatten(), of = out.flatten();
    for_each_tile_pieces(graph, x, kMinElementsPerWorker, [&](unsigned tile, const Pieces& pieces) {
      // A worker slice per piece; each slice's first element keys its draws.
      Vertex v{"CastToHalfStochastic",
               tile,
               {{}, {}, {counter_of.at(tile)}},
               {static_cast<double>(seed >> 32), static_cast<double>(seed & 0xffffffffu),
                static_cast<double>(pieces[0].first)},
               pieces.size()};
      for (std::size_t k = 0; k < pieces.size(); ++k) {
        const auto [b, e] = pieces[k];
        v.fields[0].push_back(xf.slice(b, e));
        v.fields[1].push_back(of.slice(b, e));
        if (k > 0) v.params.push_back(static_cast<double>(b));
      }
      graph.add_vertex(cs, v);
    });
  }
  prog.add(Program::execute(cs));
  if (stochastic) prog.add(next_invocation(graph, counter_of, name));
  return out;
}

}  // namespace ops
}  // namespace ipupod::ipu
