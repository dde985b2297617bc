// Helpers the op libraries share: new tensors laid out like others, moving data onto a
// layout, and splitting a tile's share of a tensor between its worker contexts.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace ipupod::ipu::ops {

// A new variable with t's shape and the same tile mapping, element for element, of t's dtype
// unless another is given.
Tensor clone_like(Graph& graph, const Tensor& like, std::string name,
                  MemoryCategory category = MemoryCategory::activation,
                  std::optional<DType> dtype = std::nullopt);
// A temporary made of one piece per tile (a convolution's input rows, a matmul's operand
// blocks) kept as one variable that grows a piece at a time: a full-size model's op makes
// thousands of such pieces, and one variable costs the host far less than thousands. The
// tile bytes are the same, and so is the live range when one exchange or compute set writes
// every piece.
class TilePieces {
 public:
  TilePieces(Graph& graph, DType dtype, std::string name,
             MemoryCategory category = MemoryCategory::temporary)
      : graph_(graph), dtype_(dtype), name_(std::move(name)), category_(category) {}
  Tensor add(unsigned tile, std::vector<std::size_t> shape) {
    if (!var_) var_ = graph_.add_variable(dtype_, {0}, name_, category_).variable();
    return graph_.append_piece(*var_, std::move(shape), tile);
  }

 private:
  Graph& graph_;
  DType dtype_;
  std::string name_;
  MemoryCategory category_;
  std::optional<VariableId> var_;
};

// src itself if it is already laid out like `like`, else a copy of it that is (added to prog).
Tensor rearrange_like(Graph& graph, Program& prog, const Tensor& src, const Tensor& like,
                      const std::string& name);
// Calls fn(tile, begin, end) for pieces of t (elements relative to t) that sit on one tile,
// each tile's share cut into at most workers_per_tile pieces of at least min_elements.
void for_each_worker_piece(const Graph& graph, const Tensor& t, std::size_t min_elements,
                           const std::function<void(unsigned, std::size_t, std::size_t)>& fn);
// Items 0 .. n - 1 grouped by tile: calls fn(tile, items) once per tile, with that tile's items
// in their order (what one vertex with a worker slice per item takes, see Vertex::slices).
void for_each_tile_group(std::size_t n, const std::function<unsigned(std::size_t)>& tile_of,
                         const std::function<void(unsigned, std::span<const std::size_t>)>& fn);
// The same pieces, a tile at a time: calls fn(tile, pieces) once per tile holding part of t,
// with that tile's pieces in element order (for one vertex with a worker slice per piece, see
// Vertex::slices). The tiles come in no particular order.
using Pieces = std::vector<std::pair<std::size_t, std::size_t>>;
void for_each_tile_pieces(const Graph& graph, const Tensor& t, std::size_t min_elements,
                          const std::function<void(unsigned, const Pieces&)>& fn);
// One vertex of `codelet` per tile of `layout`, a worker slice per worker piece, connecting the
// same element range of every operand (flattened) in field order, with parameters `params`.
void add_elementwise_vertices(Graph& graph, ComputeSetId cs, const std::string& codelet,
                              const std::vector<Tensor>& operands, const Tensor& layout,
                              std::size_t min_elements, const std::vector<double>& params = {});
// Maps t, as rows of `width` elements, in even runs of whole rows over `tiles` tiles from
// `first` (wrapping round the IPU): where an op whose blocks are not runs of its output (a
// convolution's or a pooling's channels x some rows) moves that output, so that the ops after it
// see one run per tile.
void map_rows_evenly(Graph& graph, const Tensor& t, std::size_t width, std::size_t tiles,
                     unsigned first);
// Rows [0, rows) spread over tiles in contiguous blocks: calls fn(tile, row_begin, row_end).
// The first of `used` consecutive tiles for an op that needs fewer than all of them: it moves
// with each tensor the graph makes, so that a model's many small outputs and reducers do not
// all pile onto the first tiles.
unsigned moving_first_tile(const Graph& graph, std::size_t used);
void for_each_row_block(const Graph& graph, std::size_t rows,
                        const std::function<void(unsigned, std::size_t, std::size_t)>& fn);

}  // namespace ipupod::ipu::ops
