// Shared layout helpers of the op libraries.
#include "ipu_process/ops/common.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace ipupod::ipu::ops {

Tensor clone_like(Graph& graph, const Tensor& like, std::string name, MemoryCategory category,
                  std::optional<DType> dtype) {
  Tensor out =
      graph.add_variable(dtype.value_or(like.dtype()), like.shape(), std::move(name), category);
  for (const auto& iv : graph.tile_mapping(like))
    graph.set_tile_mapping(out.slice(iv.begin, iv.end), iv.tile);
  return out;
}

Tensor rearrange_like(Graph& graph, Program& prog, const Tensor& src, const Tensor& like,
                      const std::string& name) {
  const auto a = graph.tile_mapping(src), b = graph.tile_mapping(like);
  const bool same =
      a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](auto& x, auto& y) {
        return x.begin == y.begin && x.end == y.end && x.tile == y.tile;
      });
  if (same) return src;
  Tensor out = clone_like(graph, like, name, MemoryCategory::temporary, src.dtype());
  prog.add(Program::copy(src, out));
  return out;
}

namespace {
// The elements of each of the pieces of an interval of n elements.
std::size_t piece_elements(const Graph& graph, std::size_t n, std::size_t min_elements) {
  const std::size_t pieces = std::clamp<std::size_t>(n / std::max<std::size_t>(min_elements, 1), 1,
                                                     graph.arch().workers_per_tile);
  return (n + pieces - 1) / pieces;
}
}  // namespace

void for_each_worker_piece(const Graph& graph, const Tensor& t, std::size_t min_elements,
                           const std::function<void(unsigned, std::size_t, std::size_t)>& fn) {
  for (const auto& iv : graph.tile_mapping(t)) {
    const std::size_t per = piece_elements(graph, iv.end - iv.begin, min_elements);
    for (std::size_t b = iv.begin; b < iv.end; b += per)
      fn(iv.tile, b, std::min<std::size_t>(iv.end, b + per));
  }
}

void for_each_tile_group(std::size_t n, const std::function<unsigned(std::size_t)>& tile_of,
                         const std::function<void(unsigned, std::span<const std::size_t>)>& fn) {
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return tile_of(a) < tile_of(b); });
  for (std::size_t first = 0; first < n;) {
    const unsigned tile = tile_of(order[first]);
    std::size_t last = first + 1;
    while (last < n && tile_of(order[last]) == tile) ++last;
    fn(tile, std::span(order).subspan(first, last - first));
    first = last;
  }
}

void for_each_tile_pieces(const Graph& graph, const Tensor& t, std::size_t min_elements,
                          const std::function<void(unsigned, const Pieces&)>& fn) {
  const auto mapping = graph.tile_mapping(t);
  Pieces pieces;
  for_each_tile_group(
      mapping.size(), [&](std::size_t i) { return mapping[i].tile; },
      [&](unsigned tile, std::span<const std::size_t> intervals) {
        pieces.clear();
        for (std::size_t i : intervals) {
          const auto& iv = mapping[i];
          const std::size_t per = piece_elements(graph, iv.end - iv.begin, min_elements);
          for (std::size_t b = iv.begin; b < iv.end; b += per)
            pieces.emplace_back(b, std::min<std::size_t>(iv.end, b + per));
        }
        fn(tile, pieces);
      });
}

void add_elementwise_vertices(Graph& graph, ComputeSetId cs, const std::string& codelet,
                              const std::vector<Tensor>& operands, const Tensor& layout,
                              std::size_t min_elements, const std::vector<double>& params) {
  std::vector<Tensor> flat;
  for (const Tensor& t : operands) flat.push_back(t.flatten());
  Vertex v{codelet, 0, std::vector<std::vector<Tensor>>(operands.size()), params};
  for_each_tile_pieces(graph, layout, min_elements, [&](unsigned tile, const Pieces& pieces) {
    v.tile = tile;
    v.slices = pieces.size();
    for (std::size_t f = 0; f < flat.size(); ++f) {
      v.fields[f].clear();
      for (const auto& [b, e] : pieces) v.fields[f].push_back(flat[f].slice(b, e));
    }
    graph.add_vertex(cs, v);
  });
}

unsigned moving_first_tile(const Graph& graph, std::size_t used) {
  const std::size_t span = graph.tiles() - std::min<std::size_t>(used, graph.tiles()) + 1;
  return static_cast<unsigned>(graph.tensors_made() * 101 % span);
}

void map_rows_evenly(Graph& graph, const Tensor& t, std::size_t width, std::size_t tiles,
                     unsigned first) {
  if (width == 0 || tiles == 0 || t.elements() % width != 0)
    throw std::invalid_argument("map_rows_evenly: " + std::to_string(t.elements()) +
                                " elements in rows of " + std::to_string(width) + " over " +
                                std::to_string(tiles) + " tiles");
  const std::size_t rows = t.elements() / width, per = (rows + tiles - 1) / tiles;
  const Tensor flat = t.flatten();
  for (std::size_t k = 0; k * per < rows; ++k)
    graph.set_tile_mapping(flat.slice(k * per * width, std::min(rows, (k + 1) * per) * width),
                           static_cast<unsigned>((first + k) % graph.tiles()));
}

void for_each_row_block(const Graph& graph, std::size_t rows,
                        const std::function<void(unsigned, std::size_t, std::size_t)>& fn) {
  const std::size_t tiles = std::min<std::size_t>(graph.tiles(), std::max<std::size_t>(rows, 1));
  const std::size_t per = (rows + tiles - 1) / tiles;
  unsigned tile = 0;
  for (std::size_t b = 0; b < rows; b += per, ++tile) fn(tile, b, std::min(rows, b + per));
}

}  // namespace ipupod::ipu::ops
