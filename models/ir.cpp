// IR construction with shape and dtype inference.
#include "models/ir.hpp"

#include <algorithm>
#include <cstdio>
#include <numeric>

namespace ipupod::models {

const char* dtype_name(DType dtype) {
  return dtype == DType::f32 ? "float32" : "int32";
}

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
    case OpKind::input:
      return "Input";
    case OpKind::parameter:
      return "Parameter";
    case OpKind::constant:
      return "Constant";
    case OpKind::reshape:
      return "Reshape";
    case OpKind::matmul:
      return "MatMul";
    case OpKind::add:
      return "Add";
    case OpKind::add_bias:
      return "AddBias";
    case OpKind::relu:
      return "Relu";
    case OpKind::relu_grad:
      return "ReluGrad";
    case OpKind::column_sum:
      return "ColumnSum";
    case OpKind::softmax_cross_entropy:
      return "SoftmaxCrossEntropy";
    case OpKind::softmax_cross_entropy_grad:
      return "SoftmaxCrossEntropyGrad";
    case OpKind::sgd_step:
      return "SgdStep";
    case OpKind::state:
      return "State";
    case OpKind::unary:
      return "Unary";
    case OpKind::unary_grad:
      return "UnaryGrad";
    case OpKind::binary:
      return "Binary";
    case OpKind::reduce_sum:
      return "ReduceSum";
    case OpKind::broadcast_to:
      return "BroadcastTo";
    case OpKind::permute:
      return "Permute";
    case OpKind::slice:
      return "Slice";
    case OpKind::slice_grad:
      return "SliceGrad";
    case OpKind::concat:
      return "Concat";
    case OpKind::batch_matmul:
      return "BatchMatMul";
    case OpKind::softmax:
      return "Softmax";
    case OpKind::softmax_grad:
      return "SoftmaxGrad";
    case OpKind::conv2d:
      return "Conv2d";
    case OpKind::conv2d_grad_input:
      return "Conv2dGradInput";
    case OpKind::conv2d_grad_weight:
      return "Conv2dGradWeight";
    case OpKind::conv_transpose2d:
      return "ConvTranspose2d";
    case OpKind::max_pool2d:
      return "MaxPool2d";
    case OpKind::max_pool2d_grad:
      return "MaxPool2dGrad";
    case OpKind::avg_pool2d:
      return "AvgPool2d";
    case OpKind::avg_pool2d_grad:
      return "AvgPool2dGrad";
    case OpKind::normalize:
      return "Normalize";
    case OpKind::normalize_grad:
      return "NormalizeGrad";
    case OpKind::batch_norm_inference:
      return "BatchNormInference";
    case OpKind::batch_norm_stats_update:
      return "BatchNormStatsUpdate";
    case OpKind::gather_rows:
      return "GatherRows";
    case OpKind::scatter_add_rows:
      return "ScatterAddRows";
    case OpKind::random_mask:
      return "RandomMask";
    case OpKind::stop_gradient:
      return "StopGradient";
    case OpKind::vq_nearest:
      return "VqNearest";
    case OpKind::vq_ema_update:
      return "VqEmaUpdate";
    case OpKind::increment:
      return "Increment";
    case OpKind::lr_schedule:
      return "LrSchedule";
    case OpKind::global_norm:
      return "GlobalNorm";
    case OpKind::clip_factor:
      return "ClipFactor";
    case OpKind::sgd_momentum_step:
      return "SgdMomentumStep";
    case OpKind::adam_step:
      return "AdamStep";
    case OpKind::lamb_step:
      return "LambStep";
  }
  return "?";
}

const char* unary_fn_name(UnaryFn fn) {
  switch (fn) {
    case UnaryFn::gelu:
      return "gelu";
    case UnaryFn::silu:
      return "silu";
    case UnaryFn::sigmoid:
      return "sigmoid";
    case UnaryFn::tanh:
      return "tanh";
    case UnaryFn::leaky_relu:
      return "leaky_relu";
    case UnaryFn::sqrt:
      return "sqrt";
    case UnaryFn::rsqrt:
      return "rsqrt";
    case UnaryFn::exp:
      return "exp";
    case UnaryFn::log:
      return "log";
    case UnaryFn::square:
      return "square";
    case UnaryFn::abs:
      return "abs";
    case UnaryFn::neg:
      return "neg";
    case UnaryFn::erf:
      return "erf";
  }
  return "?";
}

const char* binary_fn_name(BinaryFn fn) {
  switch (fn) {
    case BinaryFn::add:
      return "add";
    case BinaryFn::sub:
      return "sub";
    case BinaryFn::mul:
      return "mul";
    case BinaryFn::div:
      return "div";
  }
  return "?";
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b) {
  const std::size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const std::size_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const std::size_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::string Attrs::str() const {
  std::string s;
  const auto sep = [&] { return s.empty() ? "" : " "; };
  for (const auto& [k, v] : ints) s += sep() + k + "=" + std::to_string(v);
  for (const auto& [k, v] : reals) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    s += sep() + k + "=" + buf;
  }
  for (const auto& [k, v] : lists) {
    s += sep() + k + "=[";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    s += "]";
  }
  return s;
}

std::int64_t Op::i(const std::string& key) const {
  auto it = attrs.ints.find(key);
  if (it == attrs.ints.end())
    throw IrError(std::string(op_name(kind)) + " '" + name + "': integer attribute '" + key +
                  "' is missing");
  return it->second;
}

double Op::r(const std::string& key) const {
  auto it = attrs.reals.find(key);
  if (it == attrs.reals.end())
    throw IrError(std::string(op_name(kind)) + " '" + name + "': real attribute '" + key +
                  "' is missing");
  return it->second;
}

const std::vector<std::int64_t>& Op::list(const std::string& key) const {
  auto it = attrs.lists.find(key);
  if (it == attrs.lists.end())
    throw IrError(std::string(op_name(kind)) + " '" + name + "': list attribute '" + key +
                  "' is missing");
  return it->second;
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

const Op& Graph::producer(ValueId id) const {
  const Value& v = value(id);
  if (!v.producer) throw IrError("value '" + v.name + "' has no producer");
  return ops_[*v.producer];
}

void Graph::expect_f32(ValueId v, OpKind kind, const std::string& name,
                       const std::string& which) const {
  expect(info(v).dtype == DType::f32, kind, name, which + " must be float32, got " + info(v).str());
}

ValueId Graph::derived(OpKind kind, const std::string& name, std::vector<ValueId> inputs,
                       std::optional<TensorInfo> out, Attrs attrs, bool ta, bool tb,
                       double scalar) {
  for (ValueId v : inputs) value(v);  // throws for an unknown id
  return add_op(kind, auto_name(kind, name), std::move(inputs), std::move(out), ta, tb, scalar,
                std::move(attrs));
}

ValueId Graph::add_op(OpKind kind, std::string name, std::vector<ValueId> inputs,
                      std::optional<TensorInfo> out, bool ta, bool tb, double scalar, Attrs attrs) {
  Op op{kind, std::move(name), std::move(inputs), std::nullopt, phase_, stage_, ta,
        tb,   scalar,          std::move(attrs),  recompute_};
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
  return parameter(name, std::move(info), InitKind::uniform, init_bound);
}

ValueId Graph::parameter(const std::string& name, TensorInfo info, InitKind init, double value) {
  expect(info.dtype == DType::f32, OpKind::parameter, name, "must be float32, got " + info.str());
  expect(init != InitKind::eye || (info.shape.size() == 2 && info.shape[0] == info.shape[1]),
         OpKind::parameter, name, "eye initialisation needs a square matrix, got " + info.str());
  Attrs a;
  a.ints["init"] = static_cast<std::int64_t>(init);
  return add_op(OpKind::parameter, name, {}, std::move(info), false, false, value, std::move(a));
}

ValueId Graph::state(const std::string& name, TensorInfo info, InitKind init, double value) {
  Attrs a;
  a.ints["init"] = static_cast<std::int64_t>(init);
  return add_op(OpKind::state, name, {}, std::move(info), false, false, value, std::move(a));
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
  expect(info(x).shape.size() == 2, OpKind::column_sum, n,
         "input must be [m, n], got " + info(x).str());
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

void Graph::set_initial_values(ValueId id, std::vector<float> values) {
  const Op& op = producer(id);
  if (op.kind != OpKind::parameter && op.kind != OpKind::state)
    throw IrError("set_initial_values: '" + value(id).name + "' is a " + op_name(op.kind) +
                  ", not a parameter or state value");
  if (values.size() != info(id).elements() || info(id).dtype != DType::f32)
    throw IrError("set_initial_values: '" + value(id).name + "' is " + info(id).str() + ", got " +
                  std::to_string(values.size()) + " float values");
  initial_values_[id] = std::make_shared<const std::vector<float>>(std::move(values));
}

const std::vector<float>* Graph::initial_values(ValueId id) const {
  const auto it = initial_values_.find(id);
  return it == initial_values_.end() ? nullptr : it->second.get();
}

std::vector<ValueId> Graph::parameters() const {
  std::vector<ValueId> out;
  for (const auto& op : ops_)
    if (op.kind == OpKind::parameter) out.push_back(*op.output);
  return out;
}

std::vector<ValueId> Graph::states() const {
  std::vector<ValueId> out;
  for (const auto& op : ops_)
    if (op.kind == OpKind::state) out.push_back(*op.output);
  return out;
}

int Graph::max_stage() const {
  int s = 0;
  for (const auto& op : ops_) s = std::max(s, op.pipeline_stage);
  return s;
}

std::vector<ValueId> Graph::inputs() const {
  std::vector<ValueId> out;
  for (const auto& op : ops_)
    if (op.kind == OpKind::input) out.push_back(*op.output);
  return out;
}

}  // namespace ipupod::models
