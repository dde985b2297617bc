// Elementwise op library: ReLU and its gradient, addition, bias addition, scaled in-place
// addition and zeroing, each building vertices on the tiles where its operands live.
#pragma once

#include <string>

#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace ipupod::ipu::ops {

Tensor relu(Graph& graph, Program& prog, const Tensor& x, const std::string& name);
Tensor relu_grad(Graph& graph, Program& prog, const Tensor& dy, const Tensor& y,
                 const std::string& name);
Tensor add(Graph& graph, Program& prog, const Tensor& a, const Tensor& b, const std::string& name);
// x [m, n] + bias [n] broadcast over rows.
Tensor add_bias(Graph& graph, Program& prog, const Tensor& x, const Tensor& bias,
                const std::string& name);
// acc += factor * g, in place on acc's tiles.
void scaled_add_in_place(Graph& graph, Program& prog, const Tensor& acc, const Tensor& g,
                         float factor, const std::string& name);
void zero(Graph& graph, Program& prog, const Tensor& t, const std::string& name);

}  // namespace ipupod::ipu::ops
