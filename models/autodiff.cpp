// Gradient rules, one per op kind, applied in reverse program order.
#include "models/autodiff.hpp"

namespace ipupod::models {

std::map<ValueId, ValueId> build_backward(Graph& g, ValueId loss) {
  if (g.info(loss).elements() != 1)
    throw IrError("build_backward: the loss must be a scalar, got " + g.info(loss).str());
  g.set_phase(Phase::backward);
  std::map<ValueId, ValueId> grad;
  const auto accumulate = [&](ValueId v, ValueId d) {
    auto [it, fresh] = grad.emplace(v, d);
    if (!fresh) it->second = g.add(it->second, d, g.value(v).name + "/grad_sum");
  };
  grad[loss] = g.constant(g.value(loss).name + "/seed", g.info(loss), 1.0);

  const std::size_t forward_ops = g.ops().size();
  for (std::size_t i = forward_ops; i-- > 0;) {
    const Op op = g.ops()[i];  // copy: adding ops reallocates the list
    if (op.phase != Phase::forward || !op.output) continue;
    auto it = grad.find(*op.output);
    if (it == grad.end()) continue;
    g.set_stage(op.pipeline_stage);
    const ValueId dy = it->second;
    const std::string n = op.name + "/grad";
    switch (op.kind) {
      case OpKind::input:
      case OpKind::parameter:
      case OpKind::constant:
        break;
      case OpKind::reshape:
        accumulate(op.inputs[0], g.reshape(dy, g.info(op.inputs[0]).shape, n));
        break;
      case OpKind::matmul: {
        const ValueId a = op.inputs[0], b = op.inputs[1];
        const bool ta = op.transpose_a, tb = op.transpose_b;
        // C = op(A) op(B): dA from dC op(B)^T, dB from op(A)^T dC, stored like A and B.
        accumulate(a, ta ? g.matmul(b, dy, tb, true, n + "_a") : g.matmul(dy, b, false, !tb, n + "_a"));
        accumulate(b, tb ? g.matmul(dy, a, true, ta, n + "_b") : g.matmul(a, dy, !ta, false, n + "_b"));
        break;
      }
      case OpKind::add:
        accumulate(op.inputs[0], dy);
        accumulate(op.inputs[1], dy);
        break;
      case OpKind::add_bias:
        accumulate(op.inputs[0], dy);
        accumulate(op.inputs[1], g.column_sum(dy, n + "_bias"));
        break;
      case OpKind::relu:
        accumulate(op.inputs[0], g.relu_grad(dy, *op.output, n));
        break;
      case OpKind::softmax_cross_entropy:
        accumulate(op.inputs[0], g.softmax_cross_entropy_grad(op.inputs[0], op.inputs[1], dy, n));
        break;
      case OpKind::relu_grad:
      case OpKind::column_sum:
      case OpKind::softmax_cross_entropy_grad:
      case OpKind::sgd_step:
        throw IrError(std::string("build_backward: no gradient rule for ") + op_name(op.kind) +
                      " '" + op.name + "' (second-order gradients are not supported)");
    }
  }
  g.set_phase(Phase::forward);
  std::map<ValueId, ValueId> out;
  for (ValueId p : g.parameters()) {
    auto it = grad.find(p);
    if (it == grad.end())
      throw IrError("build_backward: parameter '" + g.value(p).name +
                    "' does not influence the loss; remove it or connect it");
    out.emplace(p, it->second);
  }
  return out;
}

}  // namespace ipupod::models
