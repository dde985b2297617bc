// Lowering of IR ops onto the device, one op library call per op.
#include "pod/compiler/lowering.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "ipu_process/ops/common.hpp"
#include "ipu_process/ops/conv.hpp"
#include "ipu_process/ops/elementwise.hpp"
#include "ipu_process/ops/gather.hpp"
#include "ipu_process/ops/loss.hpp"
#include "ipu_process/ops/matmul.hpp"
#include "ipu_process/ops/norm.hpp"
#include "ipu_process/ops/pool.hpp"
#include "ipu_process/ops/reduce.hpp"
#include "ipu_process/ops/softmax.hpp"
#include "ipu_process/ops/tensor_ops.hpp"
#include "pod/compiler/op_params.hpp"

namespace ipupod::pod {

void Lowering::set_model(const models::Model& model, bool owns_variables) {
  model_ = &model;
  owns_variables_ = owns_variables;
  tensors_.clear();
  casts_.clear();
}

void RecomputePrograms::add(std::size_t s, ipu::Program& prog) {
  if (added[s]) return;
  added[s] = true;
  for (std::size_t read : plan.reads_segments[s]) add(read, prog);
  prog.add(segments[s]);
}

void Lowering::lower_phase(Phase phase, ipu::Program& prog, int stage, const Transfers& transfers,
                           RecomputePrograms* recompute) {
  if (!share_casts_) casts_.clear();
  const auto on_stage = [&](const models::Op& op) {
    return op.phase == phase && op.kind != OpKind::sgd_step && op.pipeline_stage == stage;
  };
  std::size_t total = 0, done = 0;
  for (const auto& op : model_->graph.ops()) total += on_stage(op);
  const std::string_view phase_name = !owns_variables_          ? "evaluation"
                                      : phase == Phase::forward ? "forward"
                                                                : "backward";
  for (const auto& op : model_->graph.ops()) {
    if (!on_stage(op)) continue;
    for (models::ValueId v : op.inputs) {
      if (tensors_.count(v)) continue;
      const models::Op& producer = model_->graph.producer(v);
      if (producer.kind == OpKind::constant)
        lower(producer, prog);  // every stage makes its own constants
      else
        receive(v, stage, transfers, prog);
    }
    if (recompute && phase == Phase::backward)
      for (models::ValueId v : op.inputs)
        if (const auto made = recompute->plan.segment_of(&model_->graph.producer(v)))
          recompute->add(*made, prog);
    const std::optional<std::size_t> segment =
        recompute && phase == Phase::forward ? recompute->plan.segment_of(&op) : std::nullopt;
    if (segment) {
      // Its casts go into the piece (made anew when it runs again), none shared with others.
      casts_.clear();
      ipu::Program piece;
      lower(op, piece);
      casts_.clear();
      prog.add(piece);
      recompute->segments[*segment].add(piece);
    } else {
      lower(op, prog);
    }
    if (op.output) send(*op.output, stage, transfers, prog);
    out_.graph->settle();
    if (progress_ && *progress_) (*progress_)({phase_name, ++done, total, op.name});
  }
}

void Lowering::receive(models::ValueId v, int stage, const Transfers& transfers,
                       ipu::Program& prog) {
  for (const auto& t : transfers)
    if (t.value == v && t.to == stage) {
      const auto& info = model_->graph.info(v);
      ipu::Graph& g = *out_.graph;
      ipu::Tensor buf =
          g.add_variable(value_dtype(v), info.shape, model_->graph.value(v).name + "/received");
      g.map_linearly(buf, std::max<std::size_t>(1, info.elements() / g.tiles()));
      prog.add(ipu::Program::receive(buf, static_cast<unsigned>(t.from), t.tag));
      ++out_.transfers;
      tensors_.emplace(v, buf);
      return;
    }
  throw std::logic_error("pod compiler: stage " + std::to_string(stage) + " needs '" +
                         model_->graph.value(v).name + "', which no transfer brings");
}

void Lowering::send(models::ValueId v, int stage, const Transfers& transfers, ipu::Program& prog) {
  for (const auto& t : transfers)
    if (t.value == v && t.from == stage) {
      prog.add(ipu::Program::send(tensor(v), static_cast<unsigned>(t.to), t.tag));
      ++out_.transfers;
    }
}

std::vector<models::ValueId> Lowering::lowered() const {
  std::vector<models::ValueId> ids;
  for (const auto& [id, t] : tensors_) ids.push_back(id);
  return ids;
}

const ipu::Tensor& Lowering::tensor(models::ValueId id) const {
  auto it = tensors_.find(id);
  if (it == tensors_.end())
    throw std::logic_error("pod compiler: value '" + model_->graph.value(id).name +
                           "' was used before it was lowered");
  return it->second;
}

ipu::Tensor Lowering::shared_variable(const models::Op& op, const models::TensorInfo& info,
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
  ipu::Tensor t = g.add_variable(value_dtype(*op.output), info.shape, name, category);
  // Host inputs too are spread over every tile, not a sample per tile: a micro-batch of one
  // 224x224 image would otherwise sit on one tile (with each of its stash copies).
  g.map_linearly(t);
  shared_.emplace(name, t);
  return t;
}

ipu::DType Lowering::value_dtype(models::ValueId v) const {
  const ipu::DType natural = device_dtype(model_->graph.info(v).dtype);
  if (!float16_ || natural != ipu::DType::f32) return natural;
  const models::Op& producer = model_->graph.producer(v);
  if (producer.kind == OpKind::reshape || producer.kind == OpKind::stop_gradient)
    return value_dtype(producer.inputs[0]);
  const bool half = producer.kind == OpKind::parameter || makes_float16(producer.kind);
  return half ? ipu::DType::f16 : ipu::DType::f32;
}

const ipu::Tensor& Lowering::operand(const models::Op& op, std::size_t k, ipu::Program& prog) {
  const models::ValueId v = op.inputs[k];
  const ipu::Tensor& t = tensor(v);
  const bool float_type = t.dtype() == ipu::DType::f32 || t.dtype() == ipu::DType::f16;
  if (!float16_ || !float_type || op.phase == Phase::optimizer || op.kind == OpKind::reshape ||
      op.kind == OpKind::stop_gradient)
    return t;
  const ipu::DType want = reads_float16(op.kind) ? ipu::DType::f16 : ipu::DType::f32;
  if (t.dtype() == want) return t;
  if (auto it = casts_.find({v, want}); it != casts_.end()) return it->second;
  const std::string name = model_->graph.value(v).name + "/" + ipu::dtype_name(want);
  return casts_
      .emplace(std::pair{v, want},
               ipu::ops::cast(*out_.graph, prog, t, want, ipu::Rounding::nearest_even, 0, name))
      .first->second;
}

void Lowering::lower(const models::Op& op, ipu::Program& prog) {
  namespace ops = ipu::ops;
  ipu::Graph& g = *out_.graph;
  const auto in = [&](std::size_t k) -> const ipu::Tensor& { return operand(op, k, prog); };
  ipu::Tensor result;
  const auto& info = op.output ? model_->graph.info(*op.output) : models::TensorInfo{};
  const std::string& name = op.name;
  switch (op.kind) {
    case OpKind::input:
      result = shared_variable(op, info, ipu::MemoryCategory::stream);
      break;
    case OpKind::parameter:
    case OpKind::state: {
      if (const auto sharded = sharded_state(*op.output)) {
        tensors_.emplace(*op.output, *sharded);  // its shard's shape, not the IR's
        return;
      }
      const bool fresh = !shared_.count(model_->graph.value(*op.output).name);
      result = shared_variable(op, info,
                               update_of_state(*op.output) ? ipu::MemoryCategory::optimizer_state
                                                           : ipu::MemoryCategory::weight);
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
      result = ops::gather_rows(g, prog, in(0), in(1), name);
      break;
    case OpKind::scatter_add_rows:
      result = ops::scatter_add_rows(g, prog, in(0), in(1), static_cast<std::size_t>(op.i("rows")),
                                     name);
      break;
    case OpKind::vq_nearest:
      result = ops::vq_nearest(g, prog, in(0), in(1), name);
      break;
    case OpKind::vq_ema_update:
      ops::vq_ema_update(g, prog, in(0), in(1), in(2), in(3), in(4), op.r("decay"), op.r("eps"),
                         name);
      return;
    case OpKind::increment:
      ops::increment(g, prog, in(0), name);
      return;
    case OpKind::lr_schedule: {
      ops::LrSchedule schedule;
      schedule.kind = static_cast<ops::LrSchedule::Kind>(op.i("schedule"));
      schedule.base_lr = op.r("base_lr");
      schedule.warmup_steps = static_cast<std::size_t>(op.i("warmup_steps"));
      schedule.total_steps = static_cast<std::size_t>(op.i("total_steps"));
      schedule.step_size = static_cast<std::size_t>(op.i("step_size"));
      schedule.gamma = op.r("gamma");
      schedule.min_lr = op.r("min_lr");
      result = ops::lr_schedule(g, prog, in(0), schedule, name);
      break;
    }
    case OpKind::sgd_momentum_step:
      ops::sgd_momentum_update(g, prog, updated(op), in(1), in(2), step_coefficients(op, prog),
                               {.momentum = op.r("momentum"),
                                .weight_decay = op.r("weight_decay"),
                                .nesterov = op.i("nesterov") != 0,
                                .grad_scale = gradient_scale_},
                               name);
      return;
    case OpKind::adam_step:
      ops::adam_update(g, prog, updated(op), in(1), in(2), in(3), step_coefficients(op, prog),
                       {.beta1 = op.r("beta1"),
                        .beta2 = op.r("beta2"),
                        .eps = op.r("eps"),
                        .weight_decay = op.r("weight_decay"),
                        .decoupled = op.i("decoupled") != 0,
                        .grad_scale = gradient_scale_},
                       name);
      return;
    case OpKind::lamb_step:
      lamb_updates(op, prog);
      return;
    case OpKind::global_norm:
    case OpKind::clip_factor:
      throw std::logic_error(std::string("op ") + models::op_name(op.kind) + " ('" + name +
                             "') is lowered with the gradient accumulators, not on its own");
  }
  if (result.shape() != info.shape) {
    if (result.elements() != info.elements())
      throw std::logic_error("pod compiler: op '" + name + "' lowered to " +
                             std::to_string(result.elements()) + " elements, the IR has " +
                             info.str());
    result = result.reshape(info.shape);
  }
  if (result.dtype() != value_dtype(*op.output))
    throw std::logic_error("pod compiler: op '" + name + "' lowered to " +
                           ipu::dtype_name(result.dtype()) + ", the precision plan says " +
                           ipu::dtype_name(value_dtype(*op.output)));
  tensors_.emplace(*op.output, result);
}

ipu::Tensor Lowering::batch_matmul(const models::Op& op, ipu::Program& prog,
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
    ipu::Tensor c = ipu::ops::matmul(g, prog, a3.row(i), b3.row(i), op.transpose_a, op.transpose_b,
                                     op.name + "/" + std::to_string(i));
    parts.push_back(c.reshape({1, c.dim(0), c.dim(1)}));
  }
  ipu::Tensor joined =
      batch == 1 ? parts[0] : ipu::ops::concat(g, prog, parts, 0, op.name + "/join");
  return joined.reshape(info.shape);
}

}  // namespace ipupod::pod
