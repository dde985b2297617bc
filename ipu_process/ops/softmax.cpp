// Softmax and its gradient over the set-statistics plan (ops/segments.hpp).
#include "ipu_process/ops/softmax.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "ipu_process/codelets.hpp"
#include "ipu_process/ops/common.hpp"
#include "ipu_process/ops/segments.hpp"

namespace ipupod::ipu {

namespace {
// exp is a short polynomial on the vector unit: a handful of instructions per vector.
constexpr std::size_t kExpInstructions = 6;

std::uint64_t first_field_cycles(const Vertex& v, const ArchPreset& a, std::size_t instructions) {
  return vector_cycles(a, v.fields[0][0].elements(), instructions);
}
}  // namespace

void register_softmax_codelets(CodeletRegistry& r) {
  r.add(ops::set_piece_codelet(
      {"SoftmaxPartialMax",
       "partial[w] = max of x over the piece's elements in set w of its window",
       {"x", "partial"},
       [](const VertexContext& c) {
         auto x = c.region<const float>(0);
         auto part = c.region<float>(1);
         std::fill(part.begin(), part.end(), -std::numeric_limits<float>::infinity());
         ops::for_each_set_run(c, x.size(), [&](std::size_t w, std::size_t i0, std::size_t i1) {
           for (std::size_t i = i0; i < i1; ++i) part[w] = std::max(part[w], x[i]);
         });
       },
       [](const Vertex& v, const ArchPreset& a) { return first_field_cycles(v, a, 1); }}));
  r.add(ops::set_piece_codelet(
      {"SoftmaxPartialExpSum",
       "partial[w] = sum of exp(x - max[w]) over the piece's elements in set w",
       {"x", "max", "partial"},
       [](const VertexContext& c) {
         auto x = c.region<const float>(0);
         auto mx = c.region<const float>(1);
         auto part = c.region<float>(2);
         std::fill(part.begin(), part.end(), 0.f);
         ops::for_each_set_run(c, x.size(), [&](std::size_t w, std::size_t i0, std::size_t i1) {
           for (std::size_t i = i0; i < i1; ++i) part[w] += std::exp(x[i] - mx[w]);
         });
       },
       [](const Vertex& v, const ArchPreset& a) {
         return first_field_cycles(v, a, kExpInstructions + 1);
       }}));
  r.add(ops::set_piece_codelet(
      {"SoftmaxApply",
       "y = exp(x - max[w]) / sum[w]",
       {"x", "max", "sum", "y"},
       [](const VertexContext& c) {
         auto x = c.region<const float>(0);
         auto mx = c.region<const float>(1);
         auto sum = c.region<const float>(2);
         auto y = c.region<float>(3);
         ops::for_each_set_run(c, x.size(), [&](std::size_t w, std::size_t i0, std::size_t i1) {
           for (std::size_t i = i0; i < i1; ++i) y[i] = std::exp(x[i] - mx[w]) / sum[w];
         });
       },
       [](const Vertex& v, const ArchPreset& a) {
         return first_field_cycles(v, a, kExpInstructions + 2);
       }}));
  r.add(ops::set_piece_codelet(
      {"SoftmaxGradPartialDot",
       "partial[w] = sum of dy * y over the piece's elements in set w",
       {"dy", "y", "partial"},
       [](const VertexContext& c) {
         auto dy = c.region<const float>(0);
         auto y = c.region<const float>(1);
         auto part = c.region<float>(2);
         std::fill(part.begin(), part.end(), 0.f);
         ops::for_each_set_run(c, dy.size(), [&](std::size_t w, std::size_t i0, std::size_t i1) {
           for (std::size_t i = i0; i < i1; ++i) part[w] += dy[i] * y[i];
         });
       },
       [](const Vertex& v, const ArchPreset& a) { return first_field_cycles(v, a, 1); }}));
  r.add(ops::set_piece_codelet(
      {"SoftmaxGradApply",
       "dx = y * (dy - dot[w])",
       {"dy", "y", "dot", "dx"},
       [](const VertexContext& c) {
         auto dy = c.region<const float>(0);
         auto y = c.region<const float>(1);
         auto dot = c.region<const float>(2);
         auto dx = c.region<float>(3);
         ops::for_each_set_run(c, dy.size(), [&](std::size_t w, std::size_t i0, std::size_t i1) {
           for (std::size_t i = i0; i < i1; ++i) dx[i] = y[i] * (dy[i] - dot[w]);
         });
       },
       [](const Vertex& v, const ArchPreset& a) { return first_field_cycles(v, a, 2); }}));
}

namespace ops {
namespace {
SetLayout last_axis(const Tensor& x, const std::string& name) {
  if (x.rank() == 0)
    throw std::invalid_argument(name +
                                ": softmax needs a tensor of rank >= 1 (it works along "
                                "the last axis), got a scalar; reshape it to [1] first");
  if (x.dtype() != DType::f32)
    throw std::invalid_argument(name + ": softmax expects float32, got " +
                                std::string(dtype_name(x.dtype())));
  const std::size_t n = x.shape().back();
  return SetLayout::rows(n ? x.elements() / n : 0, n);
}
}  // namespace

Tensor softmax(Graph& graph, Program& prog, const Tensor& x, const std::string& name) {
  const SetLayout layout = last_axis(x, name);
  Tensor y = clone_like(graph, x, name);
  if (x.elements() == 0) return y;
  SetPlan plan(graph, x, layout, name);
  Tensor mx = plan.reduce(prog, "SoftmaxPartialMax", 1, {x}, {}, {}, SetCombine::max,
                          SetFinish::scale, 1.0, 0.0, name + "/max");
  Tensor sum = plan.reduce(prog, "SoftmaxPartialExpSum", 1, {x}, {mx}, {1}, SetCombine::sum,
                           SetFinish::scale, 1.0, 0.0, name + "/sum");
  plan.apply(prog, "SoftmaxApply", {x}, {mx, sum}, {1, 1}, y, name);
  return y;
}

Tensor softmax_grad(Graph& graph, Program& prog, const Tensor& dy, const Tensor& y,
                    const std::string& name) {
  const SetLayout layout = last_axis(y, name);
  if (dy.shape() != y.shape() || dy.dtype() != DType::f32)
    throw std::invalid_argument(name + ": softmax_grad expects dy shaped like y (" +
                                std::to_string(y.elements()) + " float32 elements), got " +
                                std::to_string(dy.elements()) + " " + dtype_name(dy.dtype()) +
                                " elements");
  Tensor dx = clone_like(graph, y, name);
  if (y.elements() == 0) return dx;
  Tensor dy_local = rearrange_like(graph, prog, dy, y, name + "/dy");
  SetPlan plan(graph, y, layout, name);
  Tensor dot = plan.reduce(prog, "SoftmaxGradPartialDot", 1, {dy_local, y}, {}, {}, SetCombine::sum,
                           SetFinish::scale, 1.0, 0.0, name + "/dot");
  plan.apply(prog, "SoftmaxGradApply", {dy_local, y}, {dot}, {1}, dx, name);
  return dx;
}

}  // namespace ops
}  // namespace ipupod::ipu
