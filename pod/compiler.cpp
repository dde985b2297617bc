// Lowering of IR ops onto the device, one op library call per op.
#include "pod/compiler.hpp"

#include <stdexcept>

#include "ipu_process/ops/common.hpp"
#include "ipu_process/ops/elementwise.hpp"
#include "ipu_process/ops/loss.hpp"
#include "ipu_process/ops/matmul.hpp"
#include "ipu_process/ops/reduce.hpp"

namespace ipupod::pod {
namespace {

using models::OpKind;
using models::Phase;

ipu::DType device_dtype(models::DType d) {
  return d == models::DType::f32 ? ipu::DType::f32 : ipu::DType::i32;
}

class Lowering {
 public:
  Lowering(const models::Model& model, CompiledModel& out) : model_(model), out_(out) {}

  // Lowers every op of the phase into prog, in graph order.
  void lower_phase(Phase phase, ipu::Program& prog) {
    for (const auto& op : model_.graph.ops())
      if (op.phase == phase && op.kind != OpKind::sgd_step) lower(op, prog);
  }
  const ipu::Tensor& tensor(models::ValueId id) const {
    auto it = tensors_.find(id);
    if (it == tensors_.end())
      throw std::logic_error("pod compiler: value '" + model_.graph.value(id).name +
                             "' was used before it was lowered");
    return it->second;
  }

 private:
  void lower(const models::Op& op, ipu::Program& prog) {
    ipu::Graph& g = *out_.graph;
    const auto in = [&](std::size_t k) -> const ipu::Tensor& { return tensor(op.inputs[k]); };
    ipu::Tensor result;
    const auto& info = op.output ? model_.graph.info(*op.output) : models::TensorInfo{};
    switch (op.kind) {
      case OpKind::input: {
        result = g.add_variable(device_dtype(info.dtype), info.shape, op.name,
                                ipu::MemoryCategory::stream);
        const std::size_t sample = info.shape.empty() ? 1 : info.elements() / info.shape[0];
        g.map_linearly(result, sample);
        break;
      }
      case OpKind::parameter:
        result = g.add_variable(ipu::DType::f32, info.shape, op.name, ipu::MemoryCategory::weight);
        g.map_linearly(result);
        out_.parameters.emplace(*op.output, result);
        out_.checkpointed.emplace_back(op.name, result);
        break;
      case OpKind::constant:
        result = g.add_variable(ipu::DType::f32, info.shape, op.name, ipu::MemoryCategory::weight);
        g.set_tile_mapping(result, 0);
        out_.constants.emplace_back(result, static_cast<float>(op.scalar));
        break;
      case OpKind::reshape:
        result = in(0).reshape(info.shape);
        break;
      case OpKind::matmul:
        result = ipu::ops::matmul(g, prog, in(0), in(1), op.transpose_a, op.transpose_b, op.name);
        break;
      case OpKind::add:
        result = ipu::ops::add(g, prog, in(0), in(1), op.name);
        break;
      case OpKind::add_bias:
        result = ipu::ops::add_bias(g, prog, in(0), in(1), op.name);
        break;
      case OpKind::relu:
        result = ipu::ops::relu(g, prog, in(0), op.name);
        break;
      case OpKind::relu_grad:
        result = ipu::ops::relu_grad(g, prog, in(0), in(1), op.name);
        break;
      case OpKind::column_sum:
        result = ipu::ops::column_sum(g, prog, in(0), op.name);
        break;
      case OpKind::softmax_cross_entropy:
        result = ipu::ops::softmax_cross_entropy(g, prog, in(0), in(1), op.name);
        break;
      case OpKind::softmax_cross_entropy_grad:
        result = ipu::ops::softmax_cross_entropy_grad(g, prog, in(0), in(1), in(2), op.name);
        break;
      case OpKind::sgd_step:
        throw std::logic_error("sgd_step is lowered by the optimizer phase");
      case OpKind::state:
      case OpKind::unary:
      case OpKind::unary_grad:
      case OpKind::binary:
      case OpKind::reduce_sum:
      case OpKind::broadcast_to:
      case OpKind::permute:
      case OpKind::slice:
      case OpKind::slice_grad:
      case OpKind::concat:
      case OpKind::batch_matmul:
      case OpKind::softmax:
      case OpKind::softmax_grad:
      case OpKind::conv2d:
      case OpKind::conv2d_grad_input:
      case OpKind::conv2d_grad_weight:
      case OpKind::conv_transpose2d:
      case OpKind::max_pool2d:
      case OpKind::max_pool2d_grad:
      case OpKind::avg_pool2d:
      case OpKind::avg_pool2d_grad:
      case OpKind::normalize:
      case OpKind::normalize_grad:
      case OpKind::batch_norm_inference:
      case OpKind::batch_norm_stats_update:
      case OpKind::gather_rows:
      case OpKind::scatter_add_rows:
      case OpKind::random_mask:
      case OpKind::stop_gradient:
      case OpKind::vq_nearest:
      case OpKind::vq_ema_update:
      case OpKind::increment:
      case OpKind::lr_schedule:
      case OpKind::global_norm:
      case OpKind::clip_factor:
      case OpKind::sgd_momentum_step:
      case OpKind::adam_step:
      case OpKind::lamb_step:
        throw std::invalid_argument(std::string("op ") + models::op_name(op.kind) + " ('" +
                                    op.name + "') is not lowered onto the IPU yet");
    }
    tensors_.emplace(*op.output, result);
  }

  const models::Model& model_;
  CompiledModel& out_;
  std::map<models::ValueId, ipu::Tensor> tensors_;
};

}  // namespace

CompiledModel compile_for_ipu(const models::Model& model, const ipu::ArchPreset& arch,
                              const StepShape& shape) {
  CompiledModel out;
  out.graph = std::make_unique<ipu::Graph>(arch);
  ipu::Graph& g = *out.graph;
  Lowering lowering(model, out);

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
  out.programs["eval"] =
      ipu::Program::sequence({ipu::Program::stream_to_device(kInputStream, out.input),
                              ipu::Program::stream_to_device(kLabelStream, out.labels), forward,
                              ipu::Program::stream_from_device(kLogitsStream, out.logits),
                              ipu::Program::stream_from_device(kLossStream, out.loss)});
  return out;
}

}  // namespace ipupod::pod
