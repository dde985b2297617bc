// Lowering of IR ops onto the device, one op library call per op.
#include "pod/compiler.hpp"

#include <stdexcept>

#include "ipu_process/ops/common.hpp"
#include "ipu_process/ops/conv.hpp"
#include "ipu_process/ops/elementwise.hpp"
#include "ipu_process/ops/loss.hpp"
#include "ipu_process/ops/matmul.hpp"
#include "ipu_process/ops/norm.hpp"
#include "ipu_process/ops/pool.hpp"
#include "ipu_process/ops/reduce.hpp"
#include "ipu_process/ops/softmax.hpp"
#include "ipu_process/ops/tensor_ops.hpp"

namespace ipupod::pod {
namespace {

using models::OpKind;
using models::Phase;

ipu::DType device_dtype(models::DType d) {
  return d == models::DType::f32 ? ipu::DType::f32 : ipu::DType::i32;
}

std::vector<std::size_t> sizes(const std::vector<std::int64_t>& list) {
  return {list.begin(), list.end()};
}

ipu::ops::ConvParams conv_params(const models::Op& op) {
  const auto g = models::Conv2dGeometry::read(op);
  ipu::ops::ConvParams p{.stride_h = g.stride_h,
                         .stride_w = g.stride_w,
                         .pad_top = g.pad_top,
                         .pad_bottom = g.pad_bottom,
                         .pad_left = g.pad_left,
                         .pad_right = g.pad_right,
                         .dilation_h = g.dilation_h,
                         .dilation_w = g.dilation_w,
                         .groups = g.groups};
  if (op.attrs.lists.count("output_padding")) {
    const auto& o = op.list("output_padding");
    p.output_padding_h = static_cast<std::size_t>(o[0]);
    p.output_padding_w = static_cast<std::size_t>(o[1]);
  }
  return p;
}

ipu::ops::PoolParams pool_params(const models::Op& op) {
  const auto g = models::Pool2dGeometry::read(op);
  return {.kernel_h = g.kernel_h,
          .kernel_w = g.kernel_w,
          .stride_h = g.stride_h,
          .stride_w = g.stride_w,
          .pad_h = g.pad_h,
          .pad_w = g.pad_w,
          .count_include_pad = g.count_include_pad,
          .adaptive = g.adaptive,
          .out_h = g.out_h,
          .out_w = g.out_w};
}

ipu::ops::NormParams norm_params(const models::Op& op) {
  ipu::ops::NormParams p;
  switch (static_cast<models::NormKind>(op.i("norm"))) {
    case models::NormKind::batch:
      p.kind = ipu::ops::NormKind::batch;
      break;
    case models::NormKind::layer:
      p.kind = ipu::ops::NormKind::layer;
      break;
    case models::NormKind::group:
      p.kind = ipu::ops::NormKind::group;
      break;
  }
  p.eps = op.r("eps");
  p.groups = static_cast<std::size_t>(op.i("groups"));
  return p;
}

ipu::ops::UnaryOp unary_op(const models::Op& op) {
  using models::UnaryFn;
  using U = ipu::ops::UnaryOp;
  switch (static_cast<UnaryFn>(op.i("fn"))) {
    case UnaryFn::gelu:
      return U::gelu;
    case UnaryFn::silu:
      return U::silu;
    case UnaryFn::sigmoid:
      return U::sigmoid;
    case UnaryFn::tanh:
      return U::tanh;
    case UnaryFn::leaky_relu:
      return U::leaky_relu;
    case UnaryFn::sqrt:
      return U::sqrt;
    case UnaryFn::rsqrt:
      return U::rsqrt;
    case UnaryFn::exp:
      return U::exp;
    case UnaryFn::log:
      return U::log;
    case UnaryFn::square:
      return U::square;
    case UnaryFn::abs:
      return U::abs;
    case UnaryFn::neg:
      return U::neg;
  }
  throw std::invalid_argument("op '" + op.name + "': unknown unary function");
}

ipu::ops::BinaryOp binary_op(const models::Op& op) {
  switch (static_cast<models::BinaryFn>(op.i("fn"))) {
    case models::BinaryFn::add:
      return ipu::ops::BinaryOp::add;
    case models::BinaryFn::sub:
      return ipu::ops::BinaryOp::sub;
    case models::BinaryFn::mul:
      return ipu::ops::BinaryOp::mul;
    case models::BinaryFn::div:
      return ipu::ops::BinaryOp::div;
  }
  throw std::invalid_argument("op '" + op.name + "': unknown binary function");
}

class Lowering {
 public:
  explicit Lowering(CompiledModel& out) : out_(out) {}

  // The model whose ops are lowered next; parameters, state and host inputs are shared by name
  // with the models lowered before (the evaluation model uses the training model's weights).
  void set_model(const models::Model& model, bool owns_variables) {
    model_ = &model;
    owns_variables_ = owns_variables;
    tensors_.clear();
  }
  // Lowers every op of the phase into prog, in graph order.
  void lower_phase(Phase phase, ipu::Program& prog) {
    for (const auto& op : model_->graph.ops())
      if (op.phase == phase && op.kind != OpKind::sgd_step) lower(op, prog);
  }
  const ipu::Tensor& tensor(models::ValueId id) const {
    auto it = tensors_.find(id);
    if (it == tensors_.end())
      throw std::logic_error("pod compiler: value '" + model_->graph.value(id).name +
                             "' was used before it was lowered");
    return it->second;
  }

 private:
  // A parameter, state or input variable, created by the first model that names it.
  ipu::Tensor shared_variable(const models::Op& op, const models::TensorInfo& info,
                              ipu::MemoryCategory category) {
    const std::string& name = model_->graph.value(*op.output).name;
    if (auto it = shared_.find(name); it != shared_.end()) {
      if (it->second.shape() != info.shape)
        throw std::logic_error("pod compiler: '" + name + "' differs in shape between models");
      return it->second;
    }
    if (!owns_variables_)
      throw std::invalid_argument("pod compiler: the evaluation model's '" + name +
                                  "' has no counterpart in the training model");
    ipu::Graph& g = *out_.graph;
    ipu::Tensor t = g.add_variable(device_dtype(info.dtype), info.shape, name, category);
    if (category == ipu::MemoryCategory::stream) {
      const std::size_t sample = info.shape.empty() ? 1 : info.elements() / info.shape[0];
      g.map_linearly(t, sample);
    } else {
      g.map_linearly(t);
    }
    shared_.emplace(name, t);
    return t;
  }

  void lower(const models::Op& op, ipu::Program& prog) {
    namespace ops = ipu::ops;
    ipu::Graph& g = *out_.graph;
    const auto in = [&](std::size_t k) -> const ipu::Tensor& { return tensor(op.inputs[k]); };
    ipu::Tensor result;
    const auto& info = op.output ? model_->graph.info(*op.output) : models::TensorInfo{};
    const std::string& name = op.name;
    switch (op.kind) {
      case OpKind::input:
        result = shared_variable(op, info, ipu::MemoryCategory::stream);
        break;
      case OpKind::parameter:
      case OpKind::state: {
        const bool fresh = !shared_.count(model_->graph.value(*op.output).name);
        result = shared_variable(op, info, ipu::MemoryCategory::weight);
        if (fresh) {
          if (op.kind == OpKind::parameter) out_.parameters.emplace(*op.output, result);
          out_.initial_values.emplace_back(*op.output, result);
          out_.checkpointed.emplace_back(model_->graph.value(*op.output).name, result);
        }
        break;
      }
      case OpKind::constant:
        result = g.add_variable(ipu::DType::f32, info.shape, name, ipu::MemoryCategory::weight);
        g.map_linearly(result);
        out_.constants.emplace_back(result, static_cast<float>(op.scalar));
        break;
      case OpKind::reshape:
        result = in(0).reshape(info.shape);
        break;
      case OpKind::stop_gradient:
        result = in(0);
        break;
      case OpKind::matmul:
        result = ops::matmul(g, prog, in(0), in(1), op.transpose_a, op.transpose_b, name);
        break;
      case OpKind::batch_matmul:
        result = batch_matmul(op, prog, info);
        break;
      case OpKind::add:
        result = ops::add(g, prog, in(0), in(1), name);
        break;
      case OpKind::add_bias:
        result = ops::add_bias(g, prog, in(0), in(1), name);
        break;
      case OpKind::relu:
        result = ops::relu(g, prog, in(0), name);
        break;
      case OpKind::relu_grad:
        result = ops::relu_grad(g, prog, in(0), in(1), name);
        break;
      case OpKind::column_sum:
        result = ops::column_sum(g, prog, in(0), name);
        break;
      case OpKind::softmax_cross_entropy:
        result = ops::softmax_cross_entropy(g, prog, in(0), in(1), name);
        break;
      case OpKind::softmax_cross_entropy_grad:
        result = ops::softmax_cross_entropy_grad(g, prog, in(0), in(1), in(2), name);
        break;
      case OpKind::unary:
        result = ops::unary(g, prog, unary_op(op), in(0), static_cast<float>(op.r("alpha")), name);
        break;
      case OpKind::unary_grad:
        result = ops::unary_grad(g, prog, unary_op(op), in(0), in(1),
                                 static_cast<float>(op.r("alpha")), name);
        break;
      case OpKind::binary:
        result = ops::binary(g, prog, binary_op(op), in(0), in(1), name);
        break;
      case OpKind::reduce_sum:
        result = ops::reduce_sum(g, prog, in(0), sizes(op.list("axes")), op.i("keepdims") != 0,
                                 static_cast<float>(op.r("scale")), name);
        break;
      case OpKind::broadcast_to:
        result =
            ops::broadcast_to(g, prog, in(0), info.shape, static_cast<float>(op.r("scale")), name);
        break;
      case OpKind::permute:
        result = ops::permute(g, prog, in(0), sizes(op.list("perm")), name);
        break;
      case OpKind::slice:
        result = ops::slice(g, prog, in(0), static_cast<std::size_t>(op.i("axis")),
                            static_cast<std::size_t>(op.i("begin")),
                            static_cast<std::size_t>(op.i("end")), name);
        break;
      case OpKind::slice_grad:
        result = ops::slice_grad(g, prog, in(0), info.shape, static_cast<std::size_t>(op.i("axis")),
                                 static_cast<std::size_t>(op.i("begin")),
                                 static_cast<std::size_t>(op.i("end")), name);
        break;
      case OpKind::concat: {
        std::vector<ipu::Tensor> xs;
        for (std::size_t k = 0; k < op.inputs.size(); ++k) xs.push_back(in(k));
        result = ops::concat(g, prog, xs, static_cast<std::size_t>(op.i("axis")), name);
        break;
      }
      case OpKind::softmax:
        result = ops::softmax(g, prog, in(0), name);
        break;
      case OpKind::softmax_grad:
        result = ops::softmax_grad(g, prog, in(0), in(1), name);
        break;
      case OpKind::conv2d:
        result = ops::conv2d(g, prog, in(0), in(1), conv_params(op), name);
        break;
      case OpKind::conv2d_grad_input:
        result = ops::conv2d_grad_input(g, prog, in(0), in(1), info.shape, conv_params(op), name);
        break;
      case OpKind::conv2d_grad_weight:
        result = ops::conv2d_grad_weight(g, prog, in(0), in(1), info.shape, conv_params(op), name);
        break;
      case OpKind::conv_transpose2d:
        result = ops::conv_transpose2d(g, prog, in(0), in(1), conv_params(op), name);
        break;
      case OpKind::max_pool2d:
        result = ops::max_pool2d(g, prog, in(0), pool_params(op), name);
        break;
      case OpKind::max_pool2d_grad:
        result = ops::max_pool2d_grad(g, prog, in(0), in(1), pool_params(op), name);
        break;
      case OpKind::avg_pool2d:
        result = ops::avg_pool2d(g, prog, in(0), pool_params(op), name);
        break;
      case OpKind::avg_pool2d_grad:
        result = ops::avg_pool2d_grad(g, prog, in(0), info.shape, pool_params(op), name);
        break;
      case OpKind::normalize:
        result = ops::normalize(g, prog, in(0), norm_params(op), name);
        break;
      case OpKind::normalize_grad:
        result = ops::normalize_grad(g, prog, in(0), in(1), norm_params(op), name);
        break;
      case OpKind::batch_norm_inference:
        result = ops::batch_norm_inference(g, prog, in(0), in(1), in(2), op.r("eps"), name);
        break;
      case OpKind::batch_norm_stats_update:
        ops::batch_norm_stats_update(g, prog, in(0), in(1), in(2), op.r("momentum"), name);
        return;
      case OpKind::random_mask:
        result = ops::random_mask(g, prog, info.shape, op.r("p"),
                                  static_cast<std::uint64_t>(op.i("seed")), name);
        break;
      case OpKind::sgd_step:
        throw std::logic_error("sgd_step is lowered by the optimizer phase");
      case OpKind::gather_rows:
      case OpKind::scatter_add_rows:
      case OpKind::vq_nearest:
      case OpKind::vq_ema_update:
      case OpKind::increment:
      case OpKind::lr_schedule:
      case OpKind::global_norm:
      case OpKind::clip_factor:
      case OpKind::sgd_momentum_step:
      case OpKind::adam_step:
      case OpKind::lamb_step:
        throw std::invalid_argument(std::string("op ") + models::op_name(op.kind) + " ('" + name +
                                    "') is not lowered onto the IPU yet");
    }
    if (result.shape() != info.shape) {
      if (result.elements() != info.elements())
        throw std::logic_error("pod compiler: op '" + name + "' lowered to " +
                               std::to_string(result.elements()) + " elements, the IR has " +
                               info.str());
      result = result.reshape(info.shape);
    }
    tensors_.emplace(*op.output, result);
  }

  // [..., m, k] x [..., k, n]: one matmul per leading index, joined along a new first axis.
  ipu::Tensor batch_matmul(const models::Op& op, ipu::Program& prog,
                           const models::TensorInfo& info) {
    ipu::Graph& g = *out_.graph;
    const ipu::Tensor &a = tensor(op.inputs[0]), &b = tensor(op.inputs[1]);
    const std::size_t rank = a.rank();
    std::size_t batch = 1;
    for (std::size_t d = 0; d + 2 < rank; ++d) batch *= a.dim(d);
    const ipu::Tensor a3 = a.reshape({batch, a.dim(rank - 2), a.dim(rank - 1)});
    const ipu::Tensor b3 = b.reshape({batch, b.dim(rank - 2), b.dim(rank - 1)});
    std::vector<ipu::Tensor> parts;
    for (std::size_t i = 0; i < batch; ++i) {
      ipu::Tensor c = ipu::ops::matmul(g, prog, a3.row(i), b3.row(i), op.transpose_a,
                                       op.transpose_b, op.name + "/" + std::to_string(i));
      parts.push_back(c.reshape({1, c.dim(0), c.dim(1)}));
    }
    ipu::Tensor joined =
        batch == 1 ? parts[0] : ipu::ops::concat(g, prog, parts, 0, op.name + "/join");
    return joined.reshape(info.shape);
  }

  CompiledModel& out_;
  const models::Model* model_ = nullptr;
  bool owns_variables_ = true;
  std::map<models::ValueId, ipu::Tensor> tensors_;
  std::map<std::string, ipu::Tensor> shared_;
};

}  // namespace

CompiledModel compile_for_ipu(const models::Model& model, const ipu::ArchPreset& arch,
                              const StepShape& shape, const models::Model* eval_model) {
  CompiledModel out;
  out.graph = std::make_unique<ipu::Graph>(arch);
  ipu::Graph& g = *out.graph;
  Lowering lowering(out);
  lowering.set_model(model, true);

  ipu::Program forward, backward;
  lowering.lower_phase(Phase::forward, forward);
  lowering.lower_phase(Phase::backward, backward);
  out.input = lowering.tensor(model.input);
  out.labels = lowering.tensor(model.labels);
  out.logits = lowering.tensor(model.logits);
  out.loss = lowering.tensor(model.loss);

  // Gradient accumulators, laid out like their parameters (the optimizer works in place).
  ipu::Program zero_accumulators, accumulate, optimizer;
  std::vector<ipu::Tensor> accumulators;
  for (const auto& op : model.graph.ops()) {
    if (op.phase == Phase::optimizer && op.kind != OpKind::sgd_step)
      throw std::invalid_argument(std::string("optimizer op ") + models::op_name(op.kind) + " ('" +
                                  op.name +
                                  "') is not lowered onto the IPU yet; train with "
                                  "plain SGD for now");
    if (op.kind != OpKind::sgd_step) continue;
    const ipu::Tensor& param = out.parameters.at(op.inputs[0]);
    const ipu::Tensor& grad = lowering.tensor(op.inputs[1]);
    const std::string name = model.graph.value(op.inputs[0]).name;
    ipu::Tensor acc =
        ipu::ops::clone_like(g, param, name + "/accumulator", ipu::MemoryCategory::optimizer_state);
    accumulators.push_back(acc);
    ipu::ops::zero(g, zero_accumulators, acc, name + "/zero");
    ipu::ops::scaled_add_in_place(g, accumulate, acc, grad, 1.0f, name + "/accumulate");
    // Mean over the accumulated micro-batches; the all-reduce already averaged the replicas.
    const float factor =
        -static_cast<float>(op.scalar / static_cast<double>(shape.gradient_accumulation));
    ipu::ops::scaled_add_in_place(g, optimizer, param, acc, factor, name + "/sgd");
  }

  ipu::Program micro_batch = ipu::Program::sequence(
      {ipu::Program::stream_to_device(kInputStream, out.input),
       ipu::Program::stream_to_device(kLabelStream, out.labels), forward, backward, accumulate,
       ipu::Program::stream_from_device(kLossStream, out.loss)});
  ipu::Program step = ipu::Program::sequence(
      {zero_accumulators, ipu::Program::repeat(shape.gradient_accumulation, micro_batch)});
  if (shape.replicas > 1) step.add(ipu::Program::all_reduce(accumulators, ipu::CollectiveOp::mean));
  step.add(optimizer);
  out.programs["train"] = ipu::Program::repeat(shape.device_iterations, step);
  // Evaluation runs the inference-mode model (running statistics, no dropout) on the same
  // weights when one is given, else the training model's forward pass.
  ipu::Program eval_forward = forward;
  if (eval_model) {
    eval_forward = ipu::Program();
    lowering.set_model(*eval_model, false);
    lowering.lower_phase(Phase::forward, eval_forward);
    out.eval_logits = lowering.tensor(eval_model->logits);
    out.eval_loss = lowering.tensor(eval_model->loss);
  } else {
    out.eval_logits = out.logits;
    out.eval_loss = out.loss;
  }
  out.programs["eval"] = ipu::Program::sequence(
      {ipu::Program::stream_to_device(kInputStream, out.input),
       ipu::Program::stream_to_device(kLabelStream, out.labels), eval_forward,
       ipu::Program::stream_from_device(kLogitsStream, out.eval_logits),
       ipu::Program::stream_from_device(kLossStream, out.eval_loss)});
  return out;
}

}  // namespace ipupod::pod
