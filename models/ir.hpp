// The model IR: values (typed, shaped tensors) and the ops that produce them, with shape and
// dtype inference; independent of any IPU. Autodiff and the optimizers add ops to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ipupod::models {

enum class DType : std::uint8_t { f32, i32 };
const char* dtype_name(DType dtype);

using Shape = std::vector<std::size_t>;

struct TensorInfo {
  DType dtype = DType::f32;
  Shape shape;
  std::size_t elements() const;
  std::string str() const;  // "float32[32,784]"
};

using ValueId = int;

// Op kinds. The first block is what the pod lowers today; the order of existing kinds is kept.
// Tensors are row-major; images are NCHW; convolution weights are laid out like PyTorch's.
enum class OpKind : std::uint8_t {
  input,      // fed by the host every micro-batch
  parameter,  // trained weights
  constant,   // a scalar fill (e.g. the loss seed 1.0)
  reshape,
  matmul,  // attrs: transpose_a, transpose_b
  add,
  add_bias,  // x [m,n] + b [n]
  relu,
  relu_grad,                   // (dy, y) -> dx
  column_sum,                  // x [m,n] -> [n]
  softmax_cross_entropy,       // (logits [m,c], labels [m] i32) -> mean loss []
  softmax_cross_entropy_grad,  // (logits, labels, dloss) -> dlogits
  sgd_step,  // (param, grad) -> nothing; param -= lr * grad (in place); attr: learning_rate

  // --- variables that are not trained: running statistics, codebooks, optimizer moments
  state,  // init like a parameter (attrs "init"); updated in place by the ops that own it

  // --- elementwise
  unary,       // attr fn (UnaryFn), alpha (leaky_relu slope)
  unary_grad,  // (dy, x) -> dx
  binary,      // (a, b), attr fn (BinaryFn); NumPy broadcasting
  // --- shapes and reductions
  reduce_sum,    // attr axes, keepdims, scale: scale * sum over axes (scale 1/n gives a mean)
  broadcast_to,  // x -> shape (NumPy rules), times attr scale
  permute,       // attr perm: out.shape[i] = in.shape[perm[i]]
  slice,         // attr axis, begin, end
  slice_grad,    // dy -> zeros of the input shape with dy at [begin, end) along axis
  concat,        // (x0, x1, ...) along attr axis
  batch_matmul,  // [..., m, k] x [..., k, n] with equal leading dims; transpose_a/b
  softmax,       // along the last axis
  softmax_grad,  // (dy, y) -> dx
  // --- convolution and pooling (NCHW); geometry in attrs (see Conv2dGeometry)
  conv2d,              // (x [n,ci,h,w], w [co,ci/g,kh,kw]) -> y
  conv2d_grad_input,   // (dy, w) -> dx of the attr-given input shape
  conv2d_grad_weight,  // (dy, x) -> dw
  conv_transpose2d,    // (x [n,ci,h,w], w [ci,co/g,kh,kw]) -> y; attr output_padding
  max_pool2d,          // attrs kernel, stride, padding
  max_pool2d_grad,     // (dy, x) -> dx
  avg_pool2d,          // attrs kernel, stride, padding, count_include_pad, or adaptive output
  avg_pool2d_grad,     // dy -> dx
  // --- normalisation without the affine part (the layer library adds gamma, beta)
  normalize,                // attr norm (NormKind), eps, groups: (x - mean) / sqrt(var + eps)
  normalize_grad,           // (dy, x) -> dx
  batch_norm_inference,     // (x, running_mean [c], running_var [c]) -> normalised x; attr eps
  batch_norm_stats_update,  // (x, running_mean, running_var): EMA in place; attr momentum
  // --- lookups, randomness, quantisation
  gather_rows,       // (table [v,d], indices i32 [...]) -> [..., d]
  scatter_add_rows,  // (dy [..., d], indices) -> [v,d]; attr rows
  random_mask,       // -> {0, 1/(1-p)} of the output shape; attrs p, seed; new draw each run
  stop_gradient,     // identity; autodiff does not go through it
  vq_nearest,        // (z [n,d], codebook [k,d]) -> i32 [n], the nearest code per row
  vq_ema_update,     // (z, indices, codebook, cluster_size, embed_sum): EMA in place; codes
                     // never chosen (cluster_size 0) keep their value
  // --- optimizer phase
  increment,          // (counter []) += 1 in place
  lr_schedule,        // (step []) -> learning rate []; attrs schedule, base_lr, ...
  global_norm,        // (g0, g1, ...) -> sqrt(sum of squares) []
  clip_factor,        // (norm []) -> min(1, max_norm / (norm + 1e-6)) * attr scale
  sgd_momentum_step,  // (param, grad, velocity, lr) in place; attrs momentum, nesterov, wd
  adam_step,  // (param, grad, m, v, lr, step) in place; attrs beta1, beta2, eps, wd, decoupled
  lamb_step,  // (param, grad, m, v, lr, step) in place; attrs beta1, beta2, eps, wd
};
const char* op_name(OpKind kind);

enum class UnaryFn : std::uint8_t {
  gelu,
  silu,
  sigmoid,
  tanh,
  leaky_relu,
  sqrt,
  rsqrt,
  exp,
  log,
  square,
  abs,
  neg,
  // The error function (ONNX Erf: PyTorch's exact GELU exports as x (1 + erf(x / sqrt 2)) / 2).
  erf
};
const char* unary_fn_name(UnaryFn fn);
enum class BinaryFn : std::uint8_t { add, sub, mul, div };
const char* binary_fn_name(BinaryFn fn);
// batch: per channel over (n, h, w); layer: per row over the last axis; group: per (n, group).
enum class NormKind : std::uint8_t { batch, layer, group };
enum class InitKind : std::uint8_t { uniform, fill, normal, eye };
enum class ScheduleKind : std::uint8_t { constant, step, cosine };

// Where an op belongs in a training step; the pod lowers each phase separately.
enum class Phase : std::uint8_t { forward, backward, optimizer };

// Named op attributes (integers, reals, integer lists); absent keys are an error on read.
struct Attrs {
  std::map<std::string, std::int64_t> ints;
  std::map<std::string, double> reals;
  std::map<std::string, std::vector<std::int64_t>> lists;
  std::string str() const;  // "kernel=[3,3] stride=[1,1]" for summaries
};

struct Op {
  OpKind kind;
  std::string name;
  std::vector<ValueId> inputs;
  std::optional<ValueId> output;
  Phase phase = Phase::forward;
  int pipeline_stage = 0;  // annotation set by the model (BeginBlock in PopTorch)
  bool transpose_a = false, transpose_b = false;
  double scalar = 0;  // learning rate, constant value, parameter init bound
  Attrs attrs = {};
  bool recompute = false;  // annotation: recompute in the backward pass instead of stashing

  std::int64_t i(const std::string& key) const;
  double r(const std::string& key) const;
  const std::vector<std::int64_t>& list(const std::string& key) const;
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

// Convolution geometry: strides, explicit per-side padding, dilation and groups.
struct Conv2dGeometry {
  std::size_t stride_h = 1, stride_w = 1;
  std::size_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  std::size_t dilation_h = 1, dilation_w = 1;
  std::size_t groups = 1;
  // PyTorch's padding="same" (stride 1): total d*(k-1), the extra one on the bottom/right.
  static Conv2dGeometry same(std::size_t kh, std::size_t kw, std::size_t dilation = 1);
  static Conv2dGeometry symmetric(std::size_t stride, std::size_t padding, std::size_t dilation = 1,
                                  std::size_t groups = 1);
  void write(Attrs& attrs) const;
  static Conv2dGeometry read(const Op& op);
};

// Pooling window: kernel, stride, symmetric padding; or adaptive to an output size.
struct Pool2dGeometry {
  std::size_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  bool count_include_pad = true;  // average pooling, like PyTorch's default
  bool adaptive = false;          // PyTorch's adaptive pooling windows
  std::size_t out_h = 0, out_w = 0;
  void write(Attrs& attrs) const;
  static Pool2dGeometry read(const Op& op);
};

class Graph {
 public:
  ValueId input(const std::string& name, TensorInfo info);
  // init_bound: weights start uniform in [-init_bound, init_bound] (PyTorch's Linear default
  // is 1/sqrt(fan_in)).
  ValueId parameter(const std::string& name, TensorInfo info, double init_bound);
  // A parameter with another initialiser: fill(value), normal(std = value), eye(value).
  ValueId parameter(const std::string& name, TensorInfo info, InitKind init, double value);
  ValueId state(const std::string& name, TensorInfo info, InitKind init, double value);
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

  ValueId unary(UnaryFn fn, ValueId x, const std::string& name = "", double alpha = 0.01);
  ValueId binary(BinaryFn fn, ValueId a, ValueId b, const std::string& name = "");
  ValueId reduce_sum(ValueId x, std::vector<std::size_t> axes, bool keepdims, double scale = 1.0,
                     const std::string& name = "");
  ValueId reduce_mean(ValueId x, std::vector<std::size_t> axes, bool keepdims,
                      const std::string& name = "");
  ValueId broadcast_to(ValueId x, Shape shape, double scale = 1.0, const std::string& name = "");
  ValueId permute(ValueId x, std::vector<std::size_t> perm, const std::string& name = "");
  ValueId slice(ValueId x, std::size_t axis, std::size_t begin, std::size_t end,
                const std::string& name = "");
  ValueId concat(const std::vector<ValueId>& xs, std::size_t axis, const std::string& name = "");
  ValueId batch_matmul(ValueId a, ValueId b, bool transpose_a = false, bool transpose_b = false,
                       const std::string& name = "");
  ValueId softmax(ValueId x, const std::string& name = "");
  ValueId conv2d(ValueId x, ValueId w, const Conv2dGeometry& geometry,
                 const std::string& name = "");
  ValueId conv_transpose2d(ValueId x, ValueId w, const Conv2dGeometry& geometry,
                           std::size_t output_padding_h = 0, std::size_t output_padding_w = 0,
                           const std::string& name = "");
  ValueId max_pool2d(ValueId x, const Pool2dGeometry& geometry, const std::string& name = "");
  ValueId avg_pool2d(ValueId x, const Pool2dGeometry& geometry, const std::string& name = "");
  ValueId normalize(ValueId x, NormKind norm, double eps, std::size_t groups = 1,
                    const std::string& name = "");
  ValueId batch_norm_inference(ValueId x, ValueId running_mean, ValueId running_var, double eps,
                               const std::string& name = "");
  void batch_norm_stats_update(ValueId x, ValueId running_mean, ValueId running_var,
                               double momentum, const std::string& name = "");
  ValueId gather_rows(ValueId table, ValueId indices, const std::string& name = "");
  ValueId random_mask(Shape shape, double drop_probability, std::uint64_t seed,
                      const std::string& name = "");
  ValueId stop_gradient(ValueId x, const std::string& name = "");
  ValueId vq_nearest(ValueId z, ValueId codebook, const std::string& name = "");
  void vq_ema_update(ValueId z, ValueId indices, ValueId codebook, ValueId cluster_size,
                     ValueId embed_sum, double decay, double eps, const std::string& name = "");

  // For autodiff and optimizers, which build ops from checked ones: an op with the given
  // output info and attributes, checked only for the existence of its inputs.
  ValueId derived(OpKind kind, const std::string& name, std::vector<ValueId> inputs,
                  std::optional<TensorInfo> out, Attrs attrs = {}, bool ta = false, bool tb = false,
                  double scalar = 0);

  // Ops added from now on carry this phase / stage / recompute annotation.
  void set_phase(Phase phase) { phase_ = phase; }
  void set_stage(int stage) { stage_ = stage; }
  void set_recompute(bool on) { recompute_ = on; }
  Phase phase() const { return phase_; }
  int stage() const { return stage_; }
  // Given starting values of a parameter or state value (an imported model's weights), used
  // instead of its initialiser; the count must match its shape.
  void set_initial_values(ValueId id, std::vector<float> values);
  const std::vector<float>* initial_values(ValueId id) const;

  // Moves an op already built to another stage (the automatic pipeline split, before autodiff).
  void set_op_stage(std::size_t op_index, int stage) { ops_.at(op_index).pipeline_stage = stage; }

  const std::vector<Op>& ops() const { return ops_; }
  const std::vector<Value>& values() const { return values_; }
  const Value& value(ValueId id) const;
  const TensorInfo& info(ValueId id) const { return value(id).info; }
  const Op& producer(ValueId id) const;
  std::vector<ValueId> parameters() const;
  std::vector<ValueId> inputs() const;
  std::vector<ValueId> states() const;
  int max_stage() const;

 private:
  ValueId add_op(OpKind kind, std::string name, std::vector<ValueId> inputs,
                 std::optional<TensorInfo> out, bool ta = false, bool tb = false, double scalar = 0,
                 Attrs attrs = {});
  std::string auto_name(OpKind kind, const std::string& name) const;
  void expect(bool ok, OpKind kind, const std::string& name, const std::string& what) const;
  void expect_f32(ValueId v, OpKind kind, const std::string& name, const std::string& which) const;

  std::vector<Op> ops_;
  std::vector<Value> values_;
  std::map<ValueId, std::shared_ptr<const std::vector<float>>> initial_values_;  // shared by copies
  Phase phase_ = Phase::forward;
  int stage_ = 0;
  bool recompute_ = false;
};

// NumPy broadcasting of two shapes; nullopt if they do not broadcast.
std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b);
std::string shape_str(const Shape& s);  // "[2,3]"

}  // namespace ipupod::models
