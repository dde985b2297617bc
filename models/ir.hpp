// The model IR: values (typed, shaped tensors) and the ops that produce them, with shape and
// dtype inference; independent of any IPU. Autodiff and the optimizers add ops to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ipupod::models {

enum class DType : std::uint8_t { f32, i32 };
const char* dtype_name(DType dtype);

struct TensorInfo {
  DType dtype = DType::f32;
  std::vector<std::size_t> shape;
  std::size_t elements() const;
  std::string str() const;  // "float32[32,784]"
};

using ValueId = int;

enum class OpKind : std::uint8_t {
  input,      // fed by the host every micro-batch
  parameter,  // trained weights
  constant,   // a scalar fill (e.g. the loss seed 1.0)
  reshape,
  matmul,     // attrs: transpose_a, transpose_b
  add,
  add_bias,   // x [m,n] + b [n]
  relu,
  relu_grad,  // (dy, y) -> dx
  column_sum, // x [m,n] -> [n]
  softmax_cross_entropy,       // (logits [m,c], labels [m] i32) -> mean loss []
  softmax_cross_entropy_grad,  // (logits, labels, dloss) -> dlogits
  sgd_step,   // (param, grad) -> nothing; param -= lr * grad (in place); attr: learning_rate
};
const char* op_name(OpKind kind);

// Where an op belongs in a training step; the pod lowers each phase separately.
enum class Phase : std::uint8_t { forward, backward, optimizer };

struct Op {
  OpKind kind;
  std::string name;
  std::vector<ValueId> inputs;
  std::optional<ValueId> output;
  Phase phase = Phase::forward;
  int pipeline_stage = 0;  // annotation set by the model (BeginBlock in PopTorch)
  bool transpose_a = false, transpose_b = false;
  double scalar = 0;       // learning rate, constant value, parameter init bound
};

struct Value {
  std::string name;
  TensorInfo info;
  std::optional<std::size_t> producer;  // op index
};

// Raised for a malformed graph: names the op, the input, what was expected and what was got.
class IrError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class Graph {
 public:
  ValueId input(const std::string& name, TensorInfo info);
  // init_bound: weights start uniform in [-init_bound, init_bound] (PyTorch's Linear default
  // is 1/sqrt(fan_in)).
  ValueId parameter(const std::string& name, TensorInfo info, double init_bound);
  ValueId constant(const std::string& name, TensorInfo info, double value);
  ValueId reshape(ValueId x, std::vector<std::size_t> shape, const std::string& name = "");
  ValueId matmul(ValueId a, ValueId b, bool transpose_a = false, bool transpose_b = false,
                 const std::string& name = "");
  ValueId add(ValueId a, ValueId b, const std::string& name = "");
  ValueId add_bias(ValueId x, ValueId bias, const std::string& name = "");
  ValueId relu(ValueId x, const std::string& name = "");
  ValueId relu_grad(ValueId dy, ValueId y, const std::string& name = "");
  ValueId column_sum(ValueId x, const std::string& name = "");
  ValueId softmax_cross_entropy(ValueId logits, ValueId labels, const std::string& name = "");
  ValueId softmax_cross_entropy_grad(ValueId logits, ValueId labels, ValueId dloss,
                                     const std::string& name = "");
  void sgd_step(ValueId param, ValueId grad, double learning_rate, const std::string& name = "");

  // Ops added from now on carry this phase / stage.
  void set_phase(Phase phase) { phase_ = phase; }
  void set_stage(int stage) { stage_ = stage; }

  const std::vector<Op>& ops() const { return ops_; }
  const std::vector<Value>& values() const { return values_; }
  const Value& value(ValueId id) const;
  const TensorInfo& info(ValueId id) const { return value(id).info; }
  std::vector<ValueId> parameters() const;
  std::vector<ValueId> inputs() const;

 private:
  ValueId add_op(OpKind kind, std::string name, std::vector<ValueId> inputs,
                 std::optional<TensorInfo> out, bool ta = false, bool tb = false,
                 double scalar = 0);
  std::string auto_name(OpKind kind, const std::string& name) const;
  void expect(bool ok, OpKind kind, const std::string& name, const std::string& what) const;

  std::vector<Op> ops_;
  std::vector<Value> values_;
  Phase phase_ = Phase::forward;
  int stage_ = 0;
};

}  // namespace ipupod::models
