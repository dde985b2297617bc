// Helpers the op libraries share: new tensors laid out like others, moving data onto a
// layout, and splitting a tile's share of a tensor between its worker contexts.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace ipupod::ipu::ops {

// A new variable with t's shape and the same tile mapping, element for element, of t's dtype
// unless another is given.
Tensor clone_like(Graph& graph, const Tensor& like, std::string name,
                  MemoryCategory category = MemoryCategory::activation,
                  std::optional<DType> dtype = std::nullopt);
// src itself if it is already laid out like `like`, else a copy of it that is (added to prog).
Tensor rearrange_like(Graph& graph, Program& prog, const Tensor& src, const Tensor& like,
                      const std::string& name);
// Calls fn(tile, begin, end) for pieces of t (elements relative to t) that sit on one tile,
// each tile's share cut into at most workers_per_tile pieces of at least min_elements.
void for_each_worker_piece(const Graph& graph, const Tensor& t, std::size_t min_elements,
                           const std::function<void(unsigned, std::size_t, std::size_t)>& fn);
// Rows [0, rows) spread over tiles in contiguous blocks: calls fn(tile, row_begin, row_end).
void for_each_row_block(const Graph& graph, std::size_t rows,
                        const std::function<void(unsigned, std::size_t, std::size_t)>& fn);

}  // namespace ipupod::ipu::ops
