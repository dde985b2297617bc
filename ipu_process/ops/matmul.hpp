// Matrix multiply op library: a planner splits the output into blocks over tiles, an
// exchange brings each block's operand rows and columns onto its tile, AMP vertices compute.
#pragma once

#include <string>

#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace ipupod::ipu::ops {

// Share of a tile the planner may fill with one matmul's operands and result (PopTorch's
// setAvailableMemoryProportion default).
inline constexpr double kAvailableMemoryProportion = 0.6;

struct MatMulPlan {
  std::size_t row_blocks = 1, col_blocks = 1;  // output split into row_blocks x col_blocks tiles
  std::uint64_t estimated_cycles = 0;
};

// op(a) [m, k] x op(b) [k, n] -> [m, n]; op transposes when the flag is set
// (a is then stored [k, m], b [n, k]).
MatMulPlan plan_matmul(const ArchPreset& arch, std::size_t m, std::size_t k, std::size_t n);
Tensor matmul(Graph& graph, Program& prog, const Tensor& a, const Tensor& b, bool transpose_a,
              bool transpose_b, const std::string& name);

}  // namespace ipupod::ipu::ops
