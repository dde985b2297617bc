// Optimizer op library: the step counter, the learning-rate schedule and the fused per-element
// updates of SGD with momentum and Adam/AdamW, applied in place on the tiles that hold each
// parameter (what PopLibs' optimiser updates are to Poplar).
#pragma once

#include <string>

#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace ipupod::ipu::ops {

// counter (a float scalar) += 1, on its tile.
void increment(Graph& graph, Program& prog, const Tensor& counter, const std::string& name);

// The learning rate at the 1-based step `step` (a float scalar, already incremented): linear
// warm-up base * k / warmup for the first `warmup_steps` steps, then constant, step decay
// (base * gamma^floor((k - warmup) / step_size)) or cosine decay to min_lr at total_steps.
struct LrSchedule {
  enum class Kind : std::uint8_t { constant, step, cosine } kind = Kind::constant;
  double base_lr = 0;
  std::size_t warmup_steps = 0, total_steps = 0, step_size = 1;
  double gamma = 0.1, min_lr = 0;
};
Tensor lr_schedule(Graph& graph, Program& prog, const Tensor& step, const LrSchedule& schedule,
                   const std::string& name);

struct AdamOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled = false;  // AdamW: decay the weights by rate * weight_decay instead of L2
};
// param -= rate / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps), with the
// moments m, v updated from grad first. rate and step are float scalars; the bias corrections
// are computed once on their tile and broadcast to the tiles that hold param.
void adam_update(Graph& graph, Program& prog, const Tensor& param, const Tensor& grad,
                 const Tensor& m, const Tensor& v, const Tensor& rate, const Tensor& step,
                 const AdamOptions& options, const std::string& name);

struct MomentumOptions {
  double momentum = 0.9, weight_decay = 0;
  bool nesterov = false;
};
// g = grad + weight_decay * param; velocity = momentum * velocity + g;
// param -= rate * (nesterov ? g + momentum * velocity : velocity).
void sgd_momentum_update(Graph& graph, Program& prog, const Tensor& param, const Tensor& grad,
                         const Tensor& velocity, const Tensor& rate, const MomentumOptions& options,
                         const std::string& name);

}  // namespace ipupod::ipu::ops
