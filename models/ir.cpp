// IR construction with shape and dtype inference.
#include "models/ir.hpp"

#include <numeric>

namespace ipupod::models {

const char* dtype_name(DType dtype) { return dtype == DType::f32 ? "float32" : "int32"; }

std::size_t TensorInfo::elements() const {
  return std::accumulate(shape.begin(), shape.end(), std::size_t{1}, std::multiplies<>());
}

std::string TensorInfo::str() const {
  std::string s = std::string(dtype_name(dtype)) + "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

const char* op_name(OpKind kind) {
  switch (kind) {
    case OpKind::input: return "Input";
    case OpKind::parameter: return "Parameter";
    case OpKind::constant: return "Constant";
    case OpKind::reshape: return "Reshape";
    case OpKind::matmul: return "MatMul";
    case OpKind::add: return "Add";
    case OpKind::add_bias: return "AddBias";
    case OpKind::relu: return "Relu";
    case OpKind::relu_grad: return "ReluGrad";
    case OpKind::column_sum: return "ColumnSum";
    case OpKind::softmax_cross_entropy: return "SoftmaxCrossEntropy";
    case OpKind::softmax_cross_entropy_grad: return "SoftmaxCrossEntropyGrad";
    case OpKind::sgd_step: return "SgdStep";
  }
  return "?";
}

const Value& Graph::value(ValueId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= values_.size())
    throw IrError("value id " + std::to_string(id) + " does not exist in this graph (it has " +
                  std::to_string(values_.size()) + " values)");
  return values_[static_cast<std::size_t>(id)];
}

std::string Graph::auto_name(OpKind kind, const std::string& name) const {
  return name.empty() ? std::string(op_name(kind)) + "_" + std::to_string(ops_.size()) : name;
}

void Graph::expect(bool ok, OpKind kind, const std::string& name, const std::string& what) const {
  if (!ok) throw IrError(std::string(op_name(kind)) + " '" + name + "': " + what);
}

ValueId Graph::add_op(OpKind kind, std::string name, std::vector<ValueId> inputs,
                      std::optional<TensorInfo> out, bool ta, bool tb, double scalar) {
  Op op{kind, std::move(name), std::move(inputs), std::nullopt, phase_, stage_, ta, tb, scalar};
  if (out) {
    values_.push_back({op.name, *out, ops_.size()});
    op.output = static_cast<ValueId>(values_.size() - 1);
  }
  ops_.push_back(std::move(op));
  return ops_.back().output.value_or(-1);
}

ValueId Graph::input(const std::string& name, TensorInfo info) {
  return add_op(OpKind::input, name, {}, std::move(info));
}

ValueId Graph::parameter(const std::string& name, TensorInfo info, double init_bound) {
  return add_op(OpKind::parameter, name, {}, std::move(info), false, false, init_bound);
}

ValueId Graph::constant(const std::string& name, TensorInfo info, double value) {
  return add_op(OpKind::constant, name, {}, std::move(info), false, false, value);
}

ValueId Graph::reshape(ValueId x, std::vector<std::size_t> shape, const std::string& name) {
  const std::string n = auto_name(OpKind::reshape, name);
  TensorInfo out{info(x).dtype, std::move(shape)};
  expect(out.elements() == info(x).elements(), OpKind::reshape, n,
         "input " + info(x).str() + " cannot be reshaped to " + out.str() +
             " (element counts differ)");
  return add_op(OpKind::reshape, n, {x}, out);
}

ValueId Graph::matmul(ValueId a, ValueId b, bool ta, bool tb, const std::string& name) {
  const std::string n = auto_name(OpKind::matmul, name);
  const TensorInfo &ia = info(a), &ib = info(b);
  expect(ia.shape.size() == 2, OpKind::matmul, n, "input 0 must be rank 2, got " + ia.str());
  expect(ib.shape.size() == 2, OpKind::matmul, n, "input 1 must be rank 2, got " + ib.str());
  expect(ia.dtype == DType::f32 && ib.dtype == DType::f32, OpKind::matmul, n,
         "inputs must be float32, got " + ia.str() + " and " + ib.str());
  const std::size_t m = ta ? ia.shape[1] : ia.shape[0], k = ta ? ia.shape[0] : ia.shape[1];
  const std::size_t kb = tb ? ib.shape[1] : ib.shape[0], cols = tb ? ib.shape[0] : ib.shape[1];
  expect(k == kb, OpKind::matmul, n,
         "inner dimensions differ: input 0 " + ia.str() + " gives k=" + std::to_string(k) +
             ", input 1 " + ib.str() + " gives k=" + std::to_string(kb));
  return add_op(OpKind::matmul, n, {a, b}, TensorInfo{DType::f32, {m, cols}}, ta, tb);
}

ValueId Graph::add(ValueId a, ValueId b, const std::string& name) {
  const std::string n = auto_name(OpKind::add, name);
  expect(info(a).shape == info(b).shape && info(a).dtype == info(b).dtype, OpKind::add, n,
         "inputs must match, got " + info(a).str() + " and " + info(b).str());
  return add_op(OpKind::add, n, {a, b}, info(a));
}

ValueId Graph::add_bias(ValueId x, ValueId bias, const std::string& name) {
  const std::string n = auto_name(OpKind::add_bias, name);
  const TensorInfo &ix = info(x), &ib = info(bias);
  expect(ix.shape.size() == 2, OpKind::add_bias, n, "input 0 must be [m, n], got " + ix.str());
  expect(ib.shape.size() == 1 && ib.shape[0] == ix.shape[1], OpKind::add_bias, n,
         "input 1 (bias) must be [" + std::to_string(ix.shape[1]) + "], got " + ib.str());
  return add_op(OpKind::add_bias, n, {x, bias}, ix);
}

ValueId Graph::relu(ValueId x, const std::string& name) {
  return add_op(OpKind::relu, auto_name(OpKind::relu, name), {x}, info(x));
}

ValueId Graph::relu_grad(ValueId dy, ValueId y, const std::string& name) {
  const std::string n = auto_name(OpKind::relu_grad, name);
  expect(info(dy).shape == info(y).shape, OpKind::relu_grad, n,
         "gradient " + info(dy).str() + " and output " + info(y).str() + " differ");
  return add_op(OpKind::relu_grad, n, {dy, y}, info(y));
}

ValueId Graph::column_sum(ValueId x, const std::string& name) {
  const std::string n = auto_name(OpKind::column_sum, name);
  expect(info(x).shape.size() == 2, OpKind::column_sum, n, "input must be [m, n], got " + info(x).str());
  return add_op(OpKind::column_sum, n, {x}, TensorInfo{DType::f32, {info(x).shape[1]}});
}

ValueId Graph::softmax_cross_entropy(ValueId logits, ValueId labels, const std::string& name) {
  const std::string n = auto_name(OpKind::softmax_cross_entropy, name);
  const TensorInfo &il = info(logits), &iy = info(labels);
  expect(il.shape.size() == 2 && il.dtype == DType::f32, OpKind::softmax_cross_entropy, n,
         "input 0 (logits) must be float32[m, classes], got " + il.str());
  expect(iy.shape.size() == 1 && iy.shape[0] == il.shape[0] && iy.dtype == DType::i32,
         OpKind::softmax_cross_entropy, n,
         "input 1 (labels) must be int32[" + std::to_string(il.shape[0]) + "], got " + iy.str());
  return add_op(OpKind::softmax_cross_entropy, n, {logits, labels}, TensorInfo{DType::f32, {}});
}

ValueId Graph::softmax_cross_entropy_grad(ValueId logits, ValueId labels, ValueId dloss,
                                          const std::string& name) {
  const std::string n = auto_name(OpKind::softmax_cross_entropy_grad, name);
  expect(info(dloss).elements() == 1, OpKind::softmax_cross_entropy_grad, n,
         "input 2 (dloss) must be a scalar, got " + info(dloss).str());
  return add_op(OpKind::softmax_cross_entropy_grad, n, {logits, labels, dloss}, info(logits));
}

void Graph::sgd_step(ValueId param, ValueId grad, double learning_rate, const std::string& name) {
  const std::string n = auto_name(OpKind::sgd_step, name);
  expect(value(param).producer && ops_[*value(param).producer].kind == OpKind::parameter,
         OpKind::sgd_step, n, "input 0 must be a parameter");
  expect(info(param).shape == info(grad).shape, OpKind::sgd_step, n,
         "parameter " + info(param).str() + " and gradient " + info(grad).str() + " differ");
  add_op(OpKind::sgd_step, n, {param, grad}, std::nullopt, false, false, learning_rate);
}

std::vector<ValueId> Graph::parameters() const {
  std::vector<ValueId> out;
  for (const auto& op : ops_)
    if (op.kind == OpKind::parameter) out.push_back(*op.output);
  return out;
}

std::vector<ValueId> Graph::inputs() const {
  std::vector<ValueId> out;
  for (const auto& op : ops_)
    if (op.kind == OpKind::input) out.push_back(*op.output);
  return out;
}

}  // namespace ipupod::models
