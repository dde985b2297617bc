// General tensor op library: elementwise unary and binary functions with NumPy broadcasting,
// reductions over any axes (two stages across tiles), shape ops that move data between tiles
// (permute, slice, concat, broadcast), counter-based random masks and float16 casts.
//
// Every op here follows the same pattern: the output is spread over tiles; for each worker's
// piece of the output, the range of each operand it reads is brought onto the piece's tile
// by one exchange (nothing moves if it is already there), then a vertex walks the piece with
// the operands' strides. Semantics match the models layer's reference interpreter.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ipu_process/codelets.hpp"
#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace ipupod::ipu::ops {

enum class UnaryOp : std::uint8_t {
  gelu,  // exact (erf) form
  silu,
  sigmoid,
  tanh,
  leaky_relu,  // slope alpha
  sqrt,
  rsqrt,
  exp,
  log,
  square,
  abs,
  neg,
  erf
};
enum class BinaryOp : std::uint8_t { add, sub, mul, div };

Tensor unary(Graph& graph, Program& prog, UnaryOp op, const Tensor& x, float alpha,
             const std::string& name);
// dx = dy * f'(x).
Tensor unary_grad(Graph& graph, Program& prog, UnaryOp op, const Tensor& dy, const Tensor& x,
                  float alpha, const std::string& name);
// a op b with NumPy broadcasting; the result is laid out like the operand of its shape.
Tensor binary(Graph& graph, Program& prog, BinaryOp op, const Tensor& a, const Tensor& b,
              const std::string& name);
// x broadcast to shape (NumPy rules), times scale.
Tensor broadcast_to(Graph& graph, Program& prog, const Tensor& x,
                    const std::vector<std::size_t>& shape, float scale, const std::string& name);
// scale * the sum over axes; keepdims keeps them as size 1.
Tensor reduce_sum(Graph& graph, Program& prog, const Tensor& x,
                  const std::vector<std::size_t>& axes, bool keepdims, float scale,
                  const std::string& name);
// out.shape[i] = x.shape[perm[i]].
Tensor permute(Graph& graph, Program& prog, const Tensor& x, const std::vector<std::size_t>& perm,
               const std::string& name);
// x[..., begin:end, ...] along axis.
Tensor slice(Graph& graph, Program& prog, const Tensor& x, std::size_t axis, std::size_t begin,
             std::size_t end, const std::string& name);
// Zeros of input_shape with dy placed at [begin, end) along axis.
Tensor slice_grad(Graph& graph, Program& prog, const Tensor& dy,
                  const std::vector<std::size_t>& input_shape, std::size_t axis, std::size_t begin,
                  std::size_t end, const std::string& name);
Tensor concat(Graph& graph, Program& prog, const std::vector<Tensor>& xs, std::size_t axis,
              const std::string& name);
// A mask of {0, 1/(1-p)}: element i of invocation k is kept when a counter-based uniform draw
// keyed by (seed, k, i) is at least p. Each tile keeps its own invocation counter (a u32 in
// always-live memory, zero at start), so every run draws anew and runs are reproducible.
Tensor random_mask(Graph& graph, Program& prog, const std::vector<std::size_t>& shape, double p,
                   std::uint64_t seed, const std::string& name);
// x converted to `to` (float32 <-> float16; x itself when it already is), laid out like x.
// float16 -> float32 is exact; float32 -> float16 rounds to nearest even, or stochastically
// with draws keyed by (seed, the tile's invocation counter, element) like random_mask.
Tensor cast(Graph& graph, Program& prog, const Tensor& x, DType to, Rounding rounding,
            std::uint64_t seed, const std::string& name);

}  // namespace ipupod::ipu::ops
