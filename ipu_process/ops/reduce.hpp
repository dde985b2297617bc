// Reduction op library: column sums (bias gradients) and scaled full sums (mean losses).
#pragma once

#include <string>

#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace ipupod::ipu::ops {

// x [m, n] -> [n] float32, the sum over rows (float32 or float16 x, summed in float32);
// columns spread over tiles.
Tensor column_sum(Graph& graph, Program& prog, const Tensor& x, const std::string& name);
// scale * sum(x) -> a scalar (shape {}) on one tile.
Tensor sum_scaled(Graph& graph, Program& prog, const Tensor& x, float scale, unsigned tile,
                  const std::string& name);

}  // namespace ipupod::ipu::ops
