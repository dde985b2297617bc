// Softmax op library: softmax along the last axis and its gradient, rows computed on the tiles
// that hold them; a row spread over several tiles is reduced in stages (max, then sum of exps).
#pragma once

#include <string>

#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace ipupod::ipu::ops {

// y = exp(x - max) / sum(exp(x - max)) along the last axis; y is laid out like x.
Tensor softmax(Graph& graph, Program& prog, const Tensor& x, const std::string& name);
// dx = y * (dy - sum(dy * y)) along the last axis; dx is laid out like y.
Tensor softmax_grad(Graph& graph, Program& prog, const Tensor& dy, const Tensor& y,
                    const std::string& name);

}  // namespace ipupod::ipu::ops
