// Set statistics: worker pieces and their windows, partials, the reduction compute set.
#include "ipu_process/ops/segments.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <tuple>

#include "ipu_process/ops/common.hpp"

namespace ipupod::ipu {

void register_segment_codelets(CodeletRegistry& r) {
  r.add({"SetReduce",
         "out[s, j] = finish(combine over the rows of every region of partials); region r holds "
         "rows of part[s - first_r, j] for sets [first_r, first_r + count_r) of out, combined "
         "region by region and row by row in order; params: k, combine (0 sum, 1 max), finish "
         "(0 scale, 1 rsqrt), scale, eps, then each region's first set and set count",
         {"parts", "out"},
         [](const VertexContext& c) {
           auto out = c.region<float>(1);
           const std::size_t k = c.size_param(0);
           const bool max = c.size_param(1) == 1;
           const bool rsqrt = c.size_param(2) == 1;
           const float scale = static_cast<float>(c.param(3));
           const float eps = static_cast<float>(c.param(4));
           std::fill(out.begin(), out.end(), max ? -std::numeric_limits<float>::infinity() : 0.f);
           for (std::size_t r = 0; r < c.regions(0); ++r) {
             auto part = c.region<const float>(0, r);
             float* o = out.data() + c.size_param(5 + 2 * r) * k;
             const std::size_t width = c.size_param(6 + 2 * r) * k;
             for (std::size_t row = 0; row + width <= part.size(); row += width) {
               const float* p = part.data() + row;
               if (max)
                 for (std::size_t i = 0; i < width; ++i) o[i] = std::max(o[i], p[i]);
               else
                 for (std::size_t i = 0; i < width; ++i) o[i] += p[i];
             }
           }
           if (rsqrt)
             for (float& v : out) v = 1.f / std::sqrt(scale * v + eps);
           else
             for (float& v : out) v *= scale;
         },
         [](const Vertex& v, const ArchPreset& a) {
           std::size_t n = 0;
           for (const auto& t : v.fields[0]) n += t.elements();
           // one combine per incoming partial, one finishing pass over the outputs
           return vector_cycles(a, n, 1) + vector_cycles(a, v.fields[1][0].elements(), 2);
         }});
}

namespace ops {
namespace {
constexpr std::size_t kMinElementsPerWorker = 64;

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}
}  // namespace

SetLayout SetLayout::rows(std::size_t sets, std::size_t length) {
  return {sets, length, std::max<std::size_t>(length, 1), 0};
}

SetLayout SetLayout::channels(std::size_t n, std::size_t c, std::size_t spatial) {
  return {c, n * spatial, std::max<std::size_t>(spatial, 1), c};
}

std::size_t SetLayout::set_of(std::size_t element) const {
  const std::size_t r = element / run;
  return modulo ? r % modulo : r;
}

SetPlan::SetPlan(Graph& graph, const Tensor& x, SetLayout layout, std::string name)
    : graph_(graph), x_(x.flatten()), layout_(layout), name_(std::move(name)) {
  std::size_t mapped = 0;
  for (const auto& iv : graph.tile_mapping(x_)) mapped += iv.end - iv.begin;
  if (mapped != x_.elements())
    throw std::logic_error(name_ + ": input " + graph.describe(x) + " of shape " +
                           shape_text(x.shape()) + " has " + std::to_string(mapped) + " of " +
                           std::to_string(x_.elements()) +
                           " elements mapped to tiles; map it (set_tile_mapping or "
                           "map_linearly) before building the op");
  for_each_worker_piece(graph, x_, kMinElementsPerWorker,
                        [&](unsigned tile, std::size_t b, std::size_t e) {
                          SetPiece p{tile, b, e, 0, 0};
                          const std::size_t r0 = b / layout_.run, r1 = (e - 1) / layout_.run;
                          const std::size_t m = layout_.modulo;
                          if (m == 0) {
                            p.lo = r0, p.hi = r1 + 1;
                          } else if (r1 - r0 + 1 >= m || r0 % m > r1 % m) {
                            p.lo = 0, p.hi = m;  // every channel, or a wrapped range
                          } else {
                            p.lo = r0 % m, p.hi = r1 % m + 1;
                          }
                          pieces_.push_back(p);
                        });
  // The tile that reduces each set: where its first element lives for contiguous sets; for
  // strided channels (data on every tile) the sets are spread evenly over a run of tiles that
  // starts where moving_first_tile says.
  const std::size_t sets = layout_.sets;
  std::vector<unsigned> owner(sets, 0);
  if (layout_.modulo == 0) {
    std::vector<bool> seen(sets, false);
    for (const auto& p : pieces_)
      for (std::size_t s = p.lo; s < p.hi; ++s)
        if (!seen[s]) seen[s] = true, owner[s] = p.tile;
  } else {
    const std::size_t per = (sets + graph.tiles() - 1) / graph.tiles();
    const unsigned first = moving_first_tile(graph, (sets + per - 1) / per);
    for (std::size_t s = 0; s < sets; ++s) owner[s] = first + static_cast<unsigned>(s / per);
  }
  const std::size_t workers = graph.arch().workers_per_tile;
  for (std::size_t a = 0; a < sets;) {
    std::size_t b = a;
    while (b < sets && owner[b] == owner[a]) ++b;
    const std::size_t chunk = (b - a + workers - 1) / workers;
    for (std::size_t s = a; s < b; s += chunk)
      reducers_.push_back({owner[a], s, std::min(b, s + chunk)});
    a = b;
  }
}

std::vector<double> SetPlan::piece_params(const SetPiece& p,
                                          const std::vector<double>& extra) const {
  std::vector<double> params = {double(p.begin), double(layout_.run), double(layout_.modulo),
                                double(p.lo)};
  params.insert(params.end(), extra.begin(), extra.end());
  return params;
}

std::vector<std::vector<Tensor>> SetPlan::windows(Program& prog, const std::vector<Tensor>& stats,
                                                  const std::vector<std::size_t>& stats_k,
                                                  const std::string& name) {
  std::vector<std::vector<Tensor>> out(pieces_.size());
  std::map<std::tuple<std::size_t, unsigned, std::size_t, std::size_t>, Tensor> cache;
  CopyRuns copies;
  std::vector<TilePieces> windows;
  for (std::size_t j = 0; j < stats.size(); ++j)
    windows.emplace_back(graph_, DType::f32, name + "/stats" + std::to_string(j));
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    const SetPiece& p = pieces_[i];
    for (std::size_t j = 0; j < stats.size(); ++j) {
      const std::size_t k = stats_k.at(j);
      if (stats[j].elements() != layout_.sets * k)
        throw std::invalid_argument(name + ": statistics " + graph_.describe(stats[j]) + " hold " +
                                    std::to_string(stats[j].elements()) + " values, expected " +
                                    std::to_string(layout_.sets * k) + " (" +
                                    std::to_string(layout_.sets) + " sets x " + std::to_string(k) +
                                    ")");
      auto key = std::make_tuple(j, p.tile, p.lo, p.hi);
      auto it = cache.find(key);
      if (it == cache.end()) {
        Tensor w = windows[j].add(p.tile, {(p.hi - p.lo) * k});
        copies.add(stats[j].flatten().slice(p.lo * k, p.hi * k), w);
        it = cache.emplace(key, w).first;
      }
      out[i].push_back(it->second);
    }
  }
  if (!copies.empty()) prog.add(Program::copy(std::move(copies)));
  return out;
}

Tensor SetPlan::reduce(Program& prog, const std::string& codelet, std::size_t k,
                       const std::vector<Tensor>& operands, const std::vector<Tensor>& stats,
                       const std::vector<std::size_t>& stats_k, SetCombine combine,
                       SetFinish finish, double scale, double eps, const std::string& name,
                       const std::vector<double>& extra_params) {
  const auto wins = windows(prog, stats, stats_k, name);
  // Partials: one vector of k values per set of each piece's window, on the piece's tile.
  ComputeSetId partial_cs = graph_.add_compute_set(name + "/partials");
  std::vector<Tensor> partials;
  TilePieces partial_pieces(graph_, DType::f32, name + "/partial");
  for (const SetPiece& p : pieces_)
    partials.push_back(partial_pieces.add(p.tile, {(p.hi - p.lo) * k}));
  add_piece_vertices(partial_cs, codelet, operands, wins, partials, extra_params);
  prog.add(Program::execute(partial_cs));

  // Reduction: each reducer run receives the overlapping slices of every partial, in piece order.
  Tensor result = graph_.add_variable(DType::f32, {layout_.sets * k}, name);
  ComputeSetId reduce_cs = graph_.add_compute_set(name + "/reduce");
  CopyRuns copies;
  TilePieces incoming_pieces(graph_, DType::f32, name + "/incoming");
  // The pieces that overlap each reducer run, in piece order (the runs partition the sets in
  // order, so a piece's runs are found by binary search).
  std::vector<std::vector<std::size_t>> overlapping(reducers_.size());
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    auto r = std::upper_bound(reducers_.begin(), reducers_.end(), pieces_[i].lo,
                              [](std::size_t s, const ReducerRun& run) { return s < run.a; });
    for (--r; r != reducers_.end() && r->a < pieces_[i].hi; ++r)
      overlapping[static_cast<std::size_t>(r - reducers_.begin())].push_back(i);
  }
  for (std::size_t j = 0; j < reducers_.size(); ++j) {
    const ReducerRun& run = reducers_[j];
    // The incoming slices, grouped by the window of sets they cover (in order of first
    // appearance, pieces in order within a window): one region of rows per window, so a set
    // reduced from every tile costs one region, not one per piece.
    struct Window {
      std::size_t s0, s1;
      std::vector<std::size_t> pieces;
    };
    std::vector<Window> incoming;
    std::size_t total = 0;
    for (std::size_t i : overlapping[j]) {
      const std::size_t s0 = std::max(pieces_[i].lo, run.a), s1 = std::min(pieces_[i].hi, run.b);
      auto w = std::find_if(incoming.begin(), incoming.end(),
                            [&](const Window& x) { return x.s0 == s0 && x.s1 == s1; });
      if (w == incoming.end()) w = incoming.insert(incoming.end(), Window{s0, s1, {}});
      w->pieces.push_back(i);
      total += (s1 - s0) * k;
    }
    Tensor recv = incoming_pieces.add(run.tile, {total});
    Vertex v{"SetReduce",
             run.tile,
             {{}, {result.slice(run.a * k, run.b * k)}},
             {double(k), combine == SetCombine::max ? 1.0 : 0.0,
              finish == SetFinish::rsqrt ? 1.0 : 0.0, scale, eps}};
    std::size_t at = 0;
    for (const Window& w : incoming) {
      const std::size_t n = (w.s1 - w.s0) * k, start = at;
      for (std::size_t i : w.pieces) {
        const std::size_t from = (w.s0 - pieces_[i].lo) * k;
        copies.add(partials[i].slice(from, from + n), recv.slice(at, at + n));
        at += n;
      }
      v.fields[0].push_back(recv.slice(start, at));
      v.params.push_back(double(w.s0 - run.a));
      v.params.push_back(double(w.s1 - w.s0));
    }
    graph_.set_tile_mapping(result.slice(run.a * k, run.b * k), run.tile);
    graph_.add_vertex(reduce_cs, std::move(v));
  }
  prog.add(Program::copy(std::move(copies)));
  prog.add(Program::execute(reduce_cs));
  return result;
}

void SetPlan::apply(Program& prog, const std::string& codelet, const std::vector<Tensor>& operands,
                    const std::vector<Tensor>& stats, const std::vector<std::size_t>& stats_k,
                    const Tensor& out, const std::string& name,
                    const std::vector<double>& extra_params) {
  const auto wins = windows(prog, stats, stats_k, name);
  ComputeSetId cs = graph_.add_compute_set(name);
  std::vector<Tensor> outs;
  const Tensor flat_out = out.flatten();
  for (const SetPiece& p : pieces_) outs.push_back(flat_out.slice(p.begin, p.end));
  add_piece_vertices(cs, codelet, operands, wins, outs, extra_params);
  prog.add(Program::execute(cs));
}

void SetPlan::add_piece_vertices(ComputeSetId cs, const std::string& codelet,
                                 const std::vector<Tensor>& operands,
                                 const std::vector<std::vector<Tensor>>& wins,
                                 const std::vector<Tensor>& last_field,
                                 const std::vector<double>& extra_params) {
  // Per tile, its pieces in element order: one vertex, a worker slice each.
  std::vector<Tensor> flat;
  for (const Tensor& t : operands) flat.push_back(t.flatten());
  Vertex v{codelet, 0, {}, {}};
  for_each_tile_group(
      pieces_.size(), [&](std::size_t i) { return pieces_[i].tile; },
      [&](unsigned tile, std::span<const std::size_t> group) {
        v.tile = tile;
        v.slices = group.size();
        v.fields.assign(flat.size() + wins[group[0]].size() + 1, {});
        for (std::size_t i : group) {
          const SetPiece& p = pieces_[i];
          std::size_t f = 0;
          for (const Tensor& t : flat) v.fields[f++].push_back(t.slice(p.begin, p.end));
          for (const Tensor& w : wins[i]) v.fields[f++].push_back(w);
          v.fields[f].push_back(last_field[i]);
          if (i == group[0]) {
            v.params = piece_params(p, extra_params);
          } else {  // this slice's first element and window (set_piece_codelet's slice params)
            v.params.push_back(static_cast<double>(p.begin));
            v.params.push_back(static_cast<double>(p.lo));
          }
        }
        graph_.add_vertex(cs, v);
      });
}

}  // namespace ops
}  // namespace ipupod::ipu
