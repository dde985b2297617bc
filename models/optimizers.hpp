// Optimizers as IR (phase optimizer): SGD, SGD with momentum, Adam, AdamW, LAMB, learning-rate
// schedules, gradient clipping by global norm and static loss scaling.
#pragma once

#include <map>
#include <string>

#include "models/ir.hpp"

namespace ipupod::models {

enum class OptimizerKind : std::uint8_t { sgd, sgd_momentum, adam, adamw, lamb };
const char* optimizer_name(OptimizerKind kind);
OptimizerKind optimizer_from_name(const std::string& name);  // "sgd", "adamw", ...

// The learning rate at 0-based step k: linear warm-up lr*(k+1)/warmup for k < warmup, then
// constant, step (lr * gamma^floor((k-warmup)/step_size)) or cosine (from lr down to min_lr at
// total_steps).
struct LrSchedule {
  ScheduleKind kind = ScheduleKind::constant;
  std::size_t warmup_steps = 0;
  std::size_t total_steps = 0;
  std::size_t step_size = 1;
  double gamma = 0.1;
  double min_lr = 0;
};

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::sgd;
  double momentum = 0.9;  // sgd_momentum
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw, lamb
  double weight_decay = 0;                        // L2 for sgd/adam, decoupled for adamw and lamb
  LrSchedule schedule;
  double clip_global_norm = 0;  // 0: no clipping
  double loss_scale = 1;        // the backward pass was seeded with this; updates divide it out
};

// Appends the optimizer phase: one update op per parameter, in place. Plain SGD with a constant
// rate and no clipping or scaling is one sgd_step per parameter (what the pod lowers today).
void build_optimizer(Graph& graph, const std::map<ValueId, ValueId>& gradients,
                     double learning_rate, const OptimizerOptions& options);

}  // namespace ipupod::models
