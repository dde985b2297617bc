// Reverse-mode automatic differentiation: appends the gradient ops of a scalar loss to the
// graph and says which value holds each parameter's gradient.
#pragma once

#include <map>

#include "models/ir.hpp"

namespace ipupod::models {

// Adds backward ops (phase backward) for d(loss)/d(every parameter); returns param -> gradient.
// loss_scale seeds the backward pass (static loss scaling): gradients come out multiplied by it.
std::map<ValueId, ValueId> build_backward(Graph& graph, ValueId loss, double loss_scale = 1.0);

}  // namespace ipupod::models
