// Lookup op library: gathering and scatter-adding table rows by int32 indices known only at run
// time, and the vector-quantisation lookups (nearest code, EMA codebook update).
//
// Exchanges are planned at compile time, so a lookup works like PopLibs' multiSlice: the table
// is spread over tiles in blocks of rows x columns; every block's tile receives all indices and
// answers them (zeros for indices outside its rows); each column block's tiles then select, for
// their share of the positions, the answer of the row block that owns each index; finally the
// output's tiles put the column blocks side by side. Results are deterministic.
#pragma once

#include <cstddef>
#include <string>

#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace ipupod::ipu::ops {

// How a table [rows, dim] is spread for `lookups` indices: row_blocks x col_blocks tiles, block
// (rb, cb) on tile rb * col_blocks + cb, chosen to keep the busiest tile's bytes lowest.
struct LookupPlan {
  std::size_t rows = 0, dim = 0, lookups = 0;
  std::size_t row_blocks = 1, col_blocks = 1, rows_per_block = 0, cols_per_block = 0;
  static LookupPlan make(const Graph& graph, std::size_t rows, std::size_t dim,
                         std::size_t lookups);
  unsigned tile(std::size_t rb, std::size_t cb) const {
    return static_cast<unsigned>(rb * col_blocks + cb);
  }
  std::size_t row_begin(std::size_t rb) const;
  std::size_t row_end(std::size_t rb) const;
  std::size_t col_begin(std::size_t cb) const;
  std::size_t col_end(std::size_t cb) const;
};

// A table laid out for lookups by `lookups` indices, so gather_rows need not rearrange it
// (like popops::createSliceableTensor).
Tensor create_lookup_table(Graph& graph, std::size_t rows, std::size_t dim, std::size_t lookups,
                           const std::string& name,
                           MemoryCategory category = MemoryCategory::weight);

// table [rows, dim] float32, indices int32 of any shape -> [indices..., dim]. An index outside
// [0, rows) stops the run with an error naming the index and its position.
Tensor gather_rows(Graph& graph, Program& prog, const Tensor& table, const Tensor& indices,
                   const std::string& name);
// dy [indices..., dim], indices int32 -> [rows, dim]: out[indices[i]] += dy[i], summed in order
// of i (deterministic); the result is laid out as create_lookup_table would lay it out.
Tensor scatter_add_rows(Graph& graph, Program& prog, const Tensor& dy, const Tensor& indices,
                        std::size_t rows, const std::string& name);

// z [n, dim], codebook [codes, dim] -> int32 [n]: the code nearest to each row (squared
// Euclidean distance accumulated in double, ties to the lowest code index).
Tensor vq_nearest(Graph& graph, Program& prog, const Tensor& z, const Tensor& codebook,
                  const std::string& name);
// In place, for codes c with count[c] = #{i : indices[i] = c} and sum[c] = sum of those z rows:
// cluster_size = decay * cluster_size + (1 - decay) * count;
// embed_sum = decay * embed_sum + (1 - decay) * sum;
// codebook[c] = embed_sum[c] / ((cluster_size[c] + eps) / (total + codes * eps) * total) for
// codes with cluster_size > 0 (total = sum of cluster_size); other codes keep their value.
void vq_ema_update(Graph& graph, Program& prog, const Tensor& z, const Tensor& indices,
                   const Tensor& codebook, const Tensor& cluster_size, const Tensor& embed_sum,
                   double decay, double eps, const std::string& name);

}  // namespace ipupod::ipu::ops
