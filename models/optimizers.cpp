// The optimizer phase: a step counter, the scheduled rate, clipping and one update per parameter.
// Each update sits on its parameter's pipeline stage; moments are state values beside it.
#include "models/optimizers.hpp"

#include <stdexcept>

namespace ipupod::models {

const char* optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::sgd:
      return "sgd";
    case OptimizerKind::sgd_momentum:
      return "sgd_momentum";
    case OptimizerKind::adam:
      return "adam";
    case OptimizerKind::adamw:
      return "adamw";
    case OptimizerKind::lamb:
      return "lamb";
  }
  return "?";
}

OptimizerKind optimizer_from_name(const std::string& name) {
  for (auto k : {OptimizerKind::sgd, OptimizerKind::sgd_momentum, OptimizerKind::adam,
                 OptimizerKind::adamw, OptimizerKind::lamb})
    if (name == optimizer_name(k)) return k;
  throw std::invalid_argument("unknown optimizer '" + name +
                              "'; known: sgd, sgd_momentum, adam, adamw, lamb");
}

void build_optimizer(Graph& g, const std::map<ValueId, ValueId>& gradients, double lr,
                     const OptimizerOptions& o) {
  if (o.loss_scale <= 0)
    throw std::invalid_argument("loss scale must be positive, got " + std::to_string(o.loss_scale));
  g.set_phase(Phase::optimizer);
  const bool plain = o.kind == OptimizerKind::sgd && o.schedule.kind == ScheduleKind::constant &&
                     o.schedule.warmup_steps == 0 && o.clip_global_norm == 0 && o.loss_scale == 1 &&
                     o.weight_decay == 0;
  if (plain) {
    for (auto [param, grad] : gradients) {
      g.set_stage(g.producer(param).pipeline_stage);
      g.sgd_step(param, grad, lr, g.value(param).name + "/sgd");
    }
    g.set_phase(Phase::forward);
    return;
  }

  g.set_stage(0);
  const ValueId step = g.state("optimizer/step", {DType::f32, {}}, InitKind::fill, 0.0);
  g.derived(OpKind::increment, "optimizer/step_increment", {step}, std::nullopt);
  Attrs sa;
  sa.ints["schedule"] = static_cast<std::int64_t>(o.schedule.kind);
  sa.ints["warmup_steps"] = static_cast<std::int64_t>(o.schedule.warmup_steps);
  sa.ints["total_steps"] = static_cast<std::int64_t>(o.schedule.total_steps);
  sa.ints["step_size"] = static_cast<std::int64_t>(o.schedule.step_size);
  sa.reals["gamma"] = o.schedule.gamma;
  sa.reals["min_lr"] = o.schedule.min_lr;
  sa.reals["base_lr"] = lr;
  const ValueId rate =
      g.derived(OpKind::lr_schedule, "optimizer/lr", {step}, TensorInfo{DType::f32, {}}, sa);

  // One factor for unscaling and clipping: min(1, max / |g/S|) / S.
  std::optional<ValueId> factor;
  if (o.clip_global_norm > 0 || o.loss_scale != 1) {
    Attrs ca;
    ca.reals["max_norm"] = o.clip_global_norm * o.loss_scale;
    ca.reals["scale"] = 1.0 / o.loss_scale;
    ValueId norm = g.constant("optimizer/no_norm", {DType::f32, {}}, 0.0);
    if (o.clip_global_norm > 0) {
      std::vector<ValueId> grads;
      for (auto [p, d] : gradients) grads.push_back(d);
      norm = g.derived(OpKind::global_norm, "optimizer/global_norm", grads,
                       TensorInfo{DType::f32, {}});
    }
    factor = g.derived(OpKind::clip_factor, "optimizer/grad_factor", {norm},
                       TensorInfo{DType::f32, {}}, ca);
  }

  for (auto [param, grad] : gradients) {
    const std::string n = g.value(param).name;
    const TensorInfo info = g.info(param);
    g.set_stage(g.producer(param).pipeline_stage);
    ValueId d = factor ? g.binary(BinaryFn::mul, grad, *factor, n + "/grad_scaled") : grad;
    Attrs a;
    a.reals["weight_decay"] = o.weight_decay;
    switch (o.kind) {
      case OptimizerKind::sgd:
      case OptimizerKind::sgd_momentum: {
        a.reals["momentum"] = o.kind == OptimizerKind::sgd ? 0.0 : o.momentum;
        a.ints["nesterov"] = o.nesterov;
        const ValueId velocity = g.state(n + "/velocity", info, InitKind::fill, 0.0);
        g.derived(OpKind::sgd_momentum_step, n + "/sgd", {param, d, velocity, rate}, std::nullopt,
                  a);
        break;
      }
      case OptimizerKind::adam:
      case OptimizerKind::adamw:
      case OptimizerKind::lamb: {
        a.reals["beta1"] = o.beta1;
        a.reals["beta2"] = o.beta2;
        a.reals["eps"] = o.eps;
        a.ints["decoupled"] = o.kind == OptimizerKind::adamw;
        const ValueId m = g.state(n + "/exp_avg", info, InitKind::fill, 0.0);
        const ValueId v = g.state(n + "/exp_avg_sq", info, InitKind::fill, 0.0);
        const OpKind k = o.kind == OptimizerKind::lamb ? OpKind::lamb_step : OpKind::adam_step;
        g.derived(k, n + "/" + optimizer_name(o.kind), {param, d, m, v, rate, step}, std::nullopt,
                  a);
        break;
      }
    }
  }
  g.set_phase(Phase::forward);
  g.set_stage(0);
}

}  // namespace ipupod::models
