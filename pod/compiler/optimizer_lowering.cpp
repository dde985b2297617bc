// Lowering of the optimizer phase: the stateful updates (SGD with momentum, Adam, AdamW, LAMB)
// with their step coefficients, and their shards under replicated tensor sharding.
#include <stdexcept>

#include "ipu_process/ops/common.hpp"
#include "pod/compiler/lowering.hpp"
#include "pod/compiler/op_params.hpp"

namespace ipupod::pod {

void Lowering::shard(models::ValueId param, std::size_t begin, std::size_t end) {
  shards_[param] = {begin, end};
}

void Lowering::lower_optimizer(int stage, ipu::Program& prog) {
  stage_ = stage;
  bool updates = false;
  for (const auto& op : model_->graph.ops())
    updates = updates ||
              (op.phase == Phase::optimizer && op.pipeline_stage == stage && is_update(op.kind));
  if (!updates) return;
  for (const auto& op : model_->graph.ops()) {
    // Clipping is lowered with the gradient accumulators (it spans the stages).
    if (op.phase != Phase::optimizer || op.kind == OpKind::sgd_step ||
        op.kind == OpKind::global_norm || op.kind == OpKind::clip_factor)
      continue;
    if (op.pipeline_stage != stage && op.kind != OpKind::increment) continue;
    if (sharded_) {  // no update of a parameter without a shard here, nor its state
      const models::Op* update =
          is_update(op.kind) ? &op : (op.output ? update_of_state(*op.output) : nullptr);
      if (update && !shards_.count(update->inputs[0])) continue;
    }
    if (op.output && has(*op.output)) continue;
    lower_with_inputs(op, prog);
  }
}

std::string Lowering::coefficients_key(const models::Op& update) {
  if (update.kind == OpKind::sgd_momentum_step)
    return "momentum/" + std::to_string(update.inputs[3]);
  return std::string(models::op_name(update.kind)) + "/" + std::to_string(update.inputs[4]) + "/" +
         std::to_string(update.inputs[5]) + "/" + std::to_string(update.r("beta1")) + "/" +
         std::to_string(update.r("beta2"));
}

const ipu::ops::TileCopies& Lowering::step_coefficients(const models::Op& update,
                                                        ipu::Program& prog) {
  const std::string key = coefficients_key(update);
  if (auto it = step_coefficients_.find(key); it != step_coefficients_.end()) return it->second;
  std::vector<ipu::Tensor> params;
  for (const auto& op : model_->graph.ops())
    if (op.phase == Phase::optimizer && op.pipeline_stage == stage_ && op.kind == update.kind &&
        coefficients_key(op) == key)
      params.push_back(tensor(op.inputs[0]));
  namespace ops = ipu::ops;
  ipu::Graph& g = *out_.graph;
  const bool momentum = update.kind == OpKind::sgd_momentum_step;
  const ops::UpdateKind kind = momentum                           ? ops::UpdateKind::sgd_momentum
                               : update.kind == OpKind::lamb_step ? ops::UpdateKind::lamb
                                                                  : ops::UpdateKind::adam;
  std::optional<ipu::Tensor> step;
  if (!momentum) step = tensor(update.inputs[5]);
  const ipu::Tensor values = ops::step_coefficients(
      g, prog, kind, tensor(update.inputs[momentum ? 3 : 4]), step, gradient_factor_,
      momentum ? 0.0 : update.r("beta1"), momentum ? 0.0 : update.r("beta2"),
      "optimizer/coefficients" + std::to_string(step_coefficients_.size()));
  return step_coefficients_
      .emplace(key, ops::copy_to_tiles(g, prog, values, params,
                                       "optimizer/coefficients" +
                                           std::to_string(step_coefficients_.size()) + "/copies"))
      .first->second;
}

void Lowering::lamb_updates(const models::Op& first, ipu::Program& prog) {
  if (lamb_done_.count(&first)) return;
  std::vector<ipu::ops::LambTensors> params;
  for (const auto& op : model_->graph.ops())
    if (op.phase == Phase::optimizer && op.pipeline_stage == stage_ &&
        op.kind == OpKind::lamb_step && coefficients_key(op) == coefficients_key(first)) {
      if (op.r("eps") != first.r("eps") || op.r("weight_decay") != first.r("weight_decay"))
        throw std::logic_error("pod compiler: LAMB updates '" + first.name + "' and '" + op.name +
                               "' differ in eps or weight decay");
      lower_inputs(op, prog);
      params.push_back(
          {tensor(op.inputs[0]), tensor(op.inputs[1]), tensor(op.inputs[2]), tensor(op.inputs[3])});
      lamb_done_.insert(&op);
    }
  ipu::ops::lamb_update(*out_.graph, prog, params, step_coefficients(first, prog),
                        {.beta1 = first.r("beta1"),
                         .beta2 = first.r("beta2"),
                         .eps = first.r("eps"),
                         .weight_decay = first.r("weight_decay"),
                         .grad_scale = gradient_scale_},
                        "optimizer/lamb" + std::to_string(lamb_done_.size()));
}

ipu::Tensor Lowering::updated(const models::Op& update) const {
  const ipu::Tensor& param = tensor(update.inputs[0]);
  const auto it = shards_.find(update.inputs[0]);
  if (it == shards_.end()) return param;
  return param.flatten().slice(it->second.first, it->second.second);
}

std::optional<ipu::Tensor> Lowering::sharded_state(models::ValueId state) {
  const models::Op* update = update_of_state(state);
  if (!sharded_ || !update || !shards_.count(update->inputs[0])) return std::nullopt;
  ipu::Tensor t =
      ipu::ops::clone_like(*out_.graph, updated(*update), model_->graph.value(state).name,
                           ipu::MemoryCategory::optimizer_state);
  out_.constants.emplace_back(t, 0.0f);
  return t;
}

const models::Op* Lowering::update_of_state(models::ValueId value) const {
  if (model_->graph.producer(value).kind != OpKind::state) return nullptr;
  // (param, grad, velocity, rate) or (param, grad, m, v, rate, step): the step is shared.
  for (const auto& op : model_->graph.ops())
    if (is_update(op.kind) &&
        (op.inputs[2] == value || (op.kind != OpKind::sgd_momentum_step && op.inputs[3] == value)))
      return &op;
  return nullptr;
}

void Lowering::lower_with_inputs(const models::Op& op, ipu::Program& prog) {
  lower_inputs(op, prog);
  lower(op, prog);
}

void Lowering::lower_inputs(const models::Op& op, ipu::Program& prog) {
  for (models::ValueId v : op.inputs) {
    if (has(v)) continue;
    const models::Op& producer = model_->graph.producer(v);
    if (producer.phase != Phase::optimizer && producer.kind != OpKind::constant)
      throw std::logic_error("pod compiler: optimizer op '" + op.name + "' reads '" +
                             model_->graph.value(v).name + "', which is not lowered here");
    lower_with_inputs(producer, prog);
  }
}

}  // namespace ipupod::pod
