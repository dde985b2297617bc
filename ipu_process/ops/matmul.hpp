// Matrix multiply op library: a planner splits the output into blocks over tiles (and, when the
// output alone cannot use the tiles or the operands do not fit, the inner dimension too), an
// exchange brings each block's operand pieces onto its tile, AMP vertices compute, and a second
// compute set adds the partial sums of a split inner dimension, as PopLibs does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace ipupod::ipu::ops {

struct MatMulPlan {
  std::size_t row_blocks = 1, col_blocks = 1;  // output split into row_blocks x col_blocks blocks
  std::size_t k_splits = 1;  // inner dimension split: each block's partial sums on k_splits tiles
  std::uint64_t estimated_cycles = 0;  // compute, exchange and (when split) reduction, with syncs
  std::size_t bytes_per_tile = 0;      // operands, partial sums and result on the busiest tile
  // The inner dimension taken in k_serial passes on the same tiles (then k_splits is 1): each
  // pass's operand pieces reuse the temporary memory of the pass before, its partial sums are
  // added to the running sum. PopLibs' planner splits serially in the same way when a parallel
  // plan does not fit (its inChanSplit.serial).
  std::size_t k_serial = 1;
  std::size_t tiles() const { return row_blocks * col_blocks * k_splits; }
};

// The plan of least estimated cycles among those whose busiest tile holds at most
// available_memory_proportion of its memory; serial passes over the inner dimension only when
// no plan without them fits; if none fits, the plan of fewest bytes per tile.
MatMulPlan plan_matmul(const ArchPreset& arch, std::size_t m, std::size_t k, std::size_t n,
                       double available_memory_proportion = kDefaultAvailableMemoryProportion);

// op(a) [m, k] x op(b) [k, n] -> [m, n] of the operands' type (two float32 or two float16:
// then the AMP's float16 rate, and each sum is rounded to float16 once, at the end); op
// transposes when the flag is set (a is then stored [k, m], b [n, k]). Each output element is
// accumulated in float32 in a
// fixed order (see MatMulBlock and ReducePartials in `ipupod info --codelets`), so results do
// not depend on the engine's thread count.
Tensor matmul(Graph& graph, Program& prog, const Tensor& a, const Tensor& b, bool transpose_a,
              bool transpose_b, const std::string& name);

// The host kernel of the MatMulBlock codelet, exposed for tests and benchmarks: rows
// [r0, r0 + rows) of op(a) [., k] x op(b) [k, n] into the rows c[0..rows), each n floats.
// a is [bm, k] (or [k, bm] when transposed), b is [k, n] (or [n, k] when transposed).
void matmul_block_rows(const float* a, const float* b, float* const* c, std::size_t bm,
                       std::size_t k, std::size_t n, bool transpose_a, bool transpose_b,
                       std::size_t r0, std::size_t rows);

// The host kernel of the MatMulReduce codelet: out[j] = parts[0][j] + parts[1][j] + ... for
// j < n, added in that order in float32 (count >= 1 partials, none overlapping out).
void add_partials(const float* const* parts, std::size_t count, float* out, std::size_t n);
// The same with the kernel built for host instruction set `isa` (see matmul_kernel_isas).
void add_partials(const float* const* parts, std::size_t count, float* out, std::size_t n,
                  std::string_view isa);

// The host instruction sets the kernel is built for that this host runs, best first (the one
// matmul_block_rows uses), and the kernel of a given one, so that tests can check each.
std::vector<std::string> matmul_kernel_isas();
void matmul_block_rows(const float* a, const float* b, float* const* c, std::size_t bm,
                       std::size_t k, std::size_t n, bool transpose_a, bool transpose_b,
                       std::size_t r0, std::size_t rows, std::string_view isa);

}  // namespace ipupod::ipu::ops
