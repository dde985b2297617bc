// Gradient rules, one per op kind, applied in reverse program order. Only values that depend
// on a parameter get gradients, so inputs, masks and codebooks cost nothing in the backward pass.
#include "models/autodiff.hpp"

#include <set>

namespace ipupod::models {
namespace {

// Sums a broadcast gradient back to the shape of the operand it came from.
ValueId sum_to(Graph& g, ValueId d, Shape target, const std::string& name) {
  const Shape s = g.info(d).shape;  // copies: adding ops reallocates the graph's values
  if (s == target) return d;
  const std::size_t lead = s.size() - target.size();
  std::vector<std::size_t> axes;
  for (std::size_t i = 0; i < s.size(); ++i)
    if (i < lead || (target[i - lead] == 1 && s[i] != 1)) axes.push_back(i);
  ValueId r = axes.empty() ? d : g.reduce_sum(d, axes, false, 1.0, name + "_sum");
  return g.info(r).shape == target ? r : g.reshape(r, target, name + "_reshape");
}

Attrs with_fn(const Op& op) {
  return op.attrs;
}

bool differentiable(OpKind kind) {
  switch (kind) {
    case OpKind::input:
    case OpKind::constant:
    case OpKind::state:
    case OpKind::stop_gradient:
    case OpKind::vq_nearest:
    case OpKind::random_mask:
      return false;
    default:
      return true;
  }
}

}  // namespace

std::map<ValueId, ValueId> build_backward(Graph& g, ValueId loss, double loss_scale) {
  if (g.info(loss).elements() != 1)
    throw IrError("build_backward: the loss must be a scalar, got " + g.info(loss).str());
  const std::size_t forward_ops = g.ops().size();

  // Values that depend on a parameter through differentiable ops.
  std::set<ValueId> needs_grad;
  for (std::size_t i = 0; i < forward_ops; ++i) {
    const Op& op = g.ops()[i];
    if (!op.output || op.phase != Phase::forward) continue;
    if (op.kind == OpKind::parameter) {
      needs_grad.insert(*op.output);
      continue;
    }
    if (!differentiable(op.kind) || g.info(*op.output).dtype != DType::f32) continue;
    for (ValueId v : op.inputs)
      if (needs_grad.count(v)) {
        needs_grad.insert(*op.output);
        break;
      }
  }

  const Phase saved_phase = g.phase();
  const int saved_stage = g.stage();
  g.set_phase(Phase::backward);
  std::map<ValueId, ValueId> grad;
  const auto wants = [&](ValueId v) { return needs_grad.count(v) > 0; };
  const auto accumulate = [&](ValueId v, ValueId d) {
    if (!wants(v)) return;
    auto [it, fresh] = grad.emplace(v, d);
    if (!fresh) it->second = g.add(it->second, d, g.value(v).name + "/grad_sum");
  };
  grad[loss] = g.constant(g.value(loss).name + "/seed", g.info(loss), loss_scale);

  for (std::size_t i = forward_ops; i-- > 0;) {
    const Op op = g.ops()[i];  // copy: adding ops reallocates the list
    if (op.phase != Phase::forward || !op.output) continue;
    auto it = grad.find(*op.output);
    if (it == grad.end()) continue;
    g.set_stage(op.pipeline_stage);
    const ValueId dy = it->second;
    const ValueId y = *op.output;
    const std::string n = op.name + "/grad";
    const auto x = [&](std::size_t k) { return op.inputs.at(k); };
    const auto shape = [&](std::size_t k) -> Shape { return g.info(x(k)).shape; };
    const auto out_like = [&](std::size_t k) { return g.info(x(k)); };
    switch (op.kind) {
      case OpKind::input:
      case OpKind::parameter:
      case OpKind::constant:
      case OpKind::state:
      case OpKind::stop_gradient:
      case OpKind::vq_nearest:
      case OpKind::random_mask:
        break;
      case OpKind::reshape:
        accumulate(x(0), g.reshape(dy, shape(0), n));
        break;
      case OpKind::matmul: {
        const ValueId a = x(0), b = x(1);
        const bool ta = op.transpose_a, tb = op.transpose_b;
        // C = op(A) op(B): dA from dC op(B)^T, dB from op(A)^T dC, stored like A and B.
        if (wants(a))
          accumulate(
              a, ta ? g.matmul(b, dy, tb, true, n + "_a") : g.matmul(dy, b, false, !tb, n + "_a"));
        if (wants(b))
          accumulate(
              b, tb ? g.matmul(dy, a, true, ta, n + "_b") : g.matmul(a, dy, !ta, false, n + "_b"));
        break;
      }
      case OpKind::batch_matmul: {
        const ValueId a = x(0), b = x(1);
        const bool ta = op.transpose_a, tb = op.transpose_b;
        if (wants(a))
          accumulate(a, ta ? g.batch_matmul(b, dy, tb, true, n + "_a")
                           : g.batch_matmul(dy, b, false, !tb, n + "_a"));
        if (wants(b))
          accumulate(b, tb ? g.batch_matmul(dy, a, true, ta, n + "_b")
                           : g.batch_matmul(a, dy, !ta, false, n + "_b"));
        break;
      }
      case OpKind::add:
        accumulate(x(0), dy);
        accumulate(x(1), dy);
        break;
      case OpKind::add_bias:
        accumulate(x(0), dy);
        if (wants(x(1))) accumulate(x(1), g.column_sum(dy, n + "_bias"));
        break;
      case OpKind::relu:
        accumulate(x(0), g.relu_grad(dy, y, n));
        break;
      case OpKind::softmax_cross_entropy:
        accumulate(x(0), g.softmax_cross_entropy_grad(x(0), x(1), dy, n));
        break;
      case OpKind::unary:
        accumulate(x(0), g.derived(OpKind::unary_grad, n, {dy, x(0)}, out_like(0), with_fn(op)));
        break;
      case OpKind::binary: {
        const ValueId a = x(0), b = x(1);
        switch (static_cast<BinaryFn>(op.i("fn"))) {
          case BinaryFn::add:
            if (wants(a)) accumulate(a, sum_to(g, dy, shape(0), n + "_a"));
            if (wants(b)) accumulate(b, sum_to(g, dy, shape(1), n + "_b"));
            break;
          case BinaryFn::sub:
            if (wants(a)) accumulate(a, sum_to(g, dy, shape(0), n + "_a"));
            if (wants(b))
              accumulate(b, sum_to(g, g.unary(UnaryFn::neg, dy, n + "_neg"), shape(1), n + "_b"));
            break;
          case BinaryFn::mul:
            if (wants(a))
              accumulate(a,
                         sum_to(g, g.binary(BinaryFn::mul, dy, b, n + "_a"), shape(0), n + "_a"));
            if (wants(b))
              accumulate(b,
                         sum_to(g, g.binary(BinaryFn::mul, dy, a, n + "_b"), shape(1), n + "_b"));
            break;
          case BinaryFn::div:
            if (wants(a))
              accumulate(a,
                         sum_to(g, g.binary(BinaryFn::div, dy, b, n + "_a"), shape(0), n + "_a"));
            if (wants(b)) {  // d(a/b)/db = -(a/b)/b
              const ValueId t =
                  g.binary(BinaryFn::div, g.binary(BinaryFn::mul, dy, y, n + "_dyy"), b, n + "_q");
              accumulate(b, sum_to(g, g.unary(UnaryFn::neg, t, n + "_neg"), shape(1), n + "_b"));
            }
            break;
        }
        break;
      }
      case OpKind::reduce_sum: {
        Shape kept = shape(0);
        for (auto ax : op.list("axes")) kept[static_cast<std::size_t>(ax)] = 1;
        const ValueId r = g.info(dy).shape == kept ? dy : g.reshape(dy, kept, n + "_keepdims");
        accumulate(x(0), g.broadcast_to(r, shape(0), op.r("scale"), n));
        break;
      }
      case OpKind::broadcast_to: {
        ValueId s = sum_to(g, dy, shape(0), n);
        if (op.r("scale") != 1.0) {
          const ValueId c = g.constant(n + "_scale", {DType::f32, {}}, op.r("scale"));
          s = g.binary(BinaryFn::mul, s, c, n + "_scaled");
        }
        accumulate(x(0), s);
        break;
      }
      case OpKind::permute: {
        const auto& perm = op.list("perm");
        std::vector<std::size_t> inverse(perm.size());
        for (std::size_t k = 0; k < perm.size(); ++k)
          inverse[static_cast<std::size_t>(perm[k])] = k;
        accumulate(x(0), g.permute(dy, inverse, n));
        break;
      }
      case OpKind::slice:
        accumulate(x(0), g.derived(OpKind::slice_grad, n, {dy}, out_like(0), op.attrs));
        break;
      case OpKind::slice_grad: {
        const auto axis = static_cast<std::size_t>(op.i("axis"));
        const auto begin = static_cast<std::size_t>(op.i("begin"));
        accumulate(x(0), g.slice(dy, axis, begin, begin + shape(0)[axis], n));
        break;
      }
      case OpKind::concat: {
        const auto axis = static_cast<std::size_t>(op.i("axis"));
        std::size_t begin = 0;
        for (std::size_t k = 0; k < op.inputs.size(); ++k) {
          const std::size_t len = shape(k)[axis];
          if (wants(x(k)))
            accumulate(x(k), g.slice(dy, axis, begin, begin + len, n + std::to_string(k)));
          begin += len;
        }
        break;
      }
      case OpKind::softmax:
        accumulate(x(0), g.derived(OpKind::softmax_grad, n, {dy, y}, out_like(0)));
        break;
      case OpKind::conv2d:
        if (wants(x(0)))
          accumulate(x(0), g.derived(OpKind::conv2d_grad_input, n + "_input", {dy, x(1)},
                                     out_like(0), op.attrs));
        if (wants(x(1)))
          accumulate(x(1), g.derived(OpKind::conv2d_grad_weight, n + "_weight", {dy, x(0)},
                                     out_like(1), op.attrs));
        break;
      case OpKind::conv_transpose2d: {
        // y = conv^T(x): dx is the forward convolution of dy; dw swaps the roles of x and dy.
        Attrs a = op.attrs;
        a.lists.erase("output_padding");
        if (wants(x(0)))
          accumulate(x(0), g.derived(OpKind::conv2d, n + "_input", {dy, x(1)}, out_like(0), a));
        if (wants(x(1)))
          accumulate(x(1), g.derived(OpKind::conv2d_grad_weight, n + "_weight", {x(0), dy},
                                     out_like(1), a));
        break;
      }
      case OpKind::max_pool2d:
        accumulate(x(0), g.derived(OpKind::max_pool2d_grad, n, {dy, x(0)}, out_like(0), op.attrs));
        break;
      case OpKind::avg_pool2d:
        accumulate(x(0), g.derived(OpKind::avg_pool2d_grad, n, {dy}, out_like(0), op.attrs));
        break;
      case OpKind::normalize:
        accumulate(x(0), g.derived(OpKind::normalize_grad, n, {dy, x(0)}, out_like(0), op.attrs));
        break;
      case OpKind::batch_norm_inference: {
        // Affine in x with fixed statistics: dx = dy / sqrt(var + eps).
        const ValueId zero = g.constant(n + "_zero", g.info(x(1)), 0.0);
        accumulate(x(0), g.batch_norm_inference(dy, zero, x(2), op.r("eps"), n));
        break;
      }
      case OpKind::gather_rows: {
        Attrs a;
        a.ints["rows"] = static_cast<std::int64_t>(shape(0)[0]);
        accumulate(x(0), g.derived(OpKind::scatter_add_rows, n, {dy, x(1)}, out_like(0), a));
        break;
      }
      case OpKind::relu_grad:
      case OpKind::column_sum:
      case OpKind::softmax_cross_entropy_grad:
      case OpKind::unary_grad:
      case OpKind::softmax_grad:
      case OpKind::conv2d_grad_input:
      case OpKind::conv2d_grad_weight:
      case OpKind::max_pool2d_grad:
      case OpKind::avg_pool2d_grad:
      case OpKind::normalize_grad:
      case OpKind::scatter_add_rows:
      case OpKind::lr_schedule:
      case OpKind::global_norm:
      case OpKind::clip_factor:
        throw IrError(std::string("build_backward: no gradient rule for ") + op_name(op.kind) +
                      " '" + op.name + "' (second-order gradients are not supported)");
      case OpKind::sgd_step:
      case OpKind::batch_norm_stats_update:
      case OpKind::vq_ema_update:
      case OpKind::increment:
      case OpKind::sgd_momentum_step:
      case OpKind::adam_step:
      case OpKind::lamb_step:
        break;  // no output: never reached
    }
  }
  // A parameter's gradient ends on the parameter's stage, which updates it: the last sum is made
  // by its first reader, on that stage, but when that reader passes it no gradient (a GAN's
  // discriminator judging the generator's images with its weights held) the sum ends where a
  // later reader is; it then comes over as a pipeline transfer.
  for (ValueId p : g.parameters()) {
    auto it = grad.find(p);
    if (it == grad.end()) continue;
    const int stage = g.producer(p).pipeline_stage;
    if (g.producer(it->second).pipeline_stage == stage) continue;
    g.set_stage(stage);
    it->second = g.reshape(it->second, g.info(p).shape, g.value(p).name + "/grad_to_stage");
  }
  g.set_phase(saved_phase);
  g.set_stage(saved_stage);
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
