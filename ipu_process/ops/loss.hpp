// Loss op library: softmax cross-entropy against int32 class labels, and its gradient.
#pragma once

#include <string>

#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace ipupod::ipu::ops {

// logits [m, c], labels [m] int32 -> mean loss (a scalar).
Tensor softmax_cross_entropy(Graph& graph, Program& prog, const Tensor& logits,
                             const Tensor& labels, const std::string& name);
// d(mean loss)/d(logits) scaled by the scalar dloss -> [m, c].
Tensor softmax_cross_entropy_grad(Graph& graph, Program& prog, const Tensor& logits,
                                  const Tensor& labels, const Tensor& dloss,
                                  const std::string& name);

}  // namespace ipupod::ipu::ops
