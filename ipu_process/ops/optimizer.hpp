// Optimizer op library: the step counter, the learning-rate schedule, gradient clipping by the
// global norm and the fused per-element updates of SGD with momentum, Adam/AdamW and LAMB,
// applied in place on the tiles that hold each parameter (PopLibs' optimiser updates to Poplar).
#pragma once

#include <optional>
#include <string>
#include <vector>

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

// What every parameter update of a step reads, made once per step on the learning rate's tile:
// [rate, gradient factor, ...] and for Adam [..., rate / (1 - beta1^step), sqrt(1 - beta2^step)],
// for LAMB [..., step]. The gradient factor (clipping) is 1 without a `factor` tensor.
enum class UpdateKind : std::uint8_t { sgd_momentum, adam, lamb };
Tensor step_coefficients(Graph& graph, Program& prog, UpdateKind kind, const Tensor& rate,
                         const std::optional<Tensor>& step, const std::optional<Tensor>& factor,
                         double beta1, double beta2, const std::string& name);

// A small per-step tensor copied by one exchange onto every tile that holds a piece of the
// given tensors, so that the updates of all parameters read it from their own tile.
struct TileCopies {
  Tensor copies;  // [tiles.size(), width]
  std::vector<unsigned> tiles;
  Tensor on(unsigned tile, const std::string& name) const;  // the copy on `tile`
};
TileCopies copy_to_tiles(Graph& graph, Program& prog, const Tensor& value,
                         const std::vector<Tensor>& targets, const std::string& name);

struct AdamOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled = false;  // AdamW: decay the weights by rate * weight_decay instead of L2
  // The gradient read is grad * grad_scale * the step's gradient factor (the mean over the
  // accumulated micro-batches, then clipping), each product rounded to float in that order.
  double grad_scale = 1;
};
// param -= rate / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps), with the
// moments m, v updated from the gradient first. `coefficients` are step_coefficients(adam).
void adam_update(Graph& graph, Program& prog, const Tensor& param, const Tensor& grad,
                 const Tensor& m, const Tensor& v, const TileCopies& coefficients,
                 const AdamOptions& options, const std::string& name);

struct MomentumOptions {
  double momentum = 0.9, weight_decay = 0;
  bool nesterov = false;
  double grad_scale = 1;  // as AdamOptions::grad_scale
};
// g = grad + weight_decay * param; velocity = momentum * velocity + g;
// param -= rate * (nesterov ? g + momentum * velocity : velocity). `coefficients` are
// step_coefficients(sgd_momentum).
void sgd_momentum_update(Graph& graph, Program& prog, const Tensor& param, const Tensor& grad,
                         const Tensor& velocity, const TileCopies& coefficients,
                         const MomentumOptions& options, const std::string& name);

// Gradient clipping by the global norm, in stages so that the norm can span IPUs:
// sum_of_squares gives the squared L2 norm of scale * (x0, x1, ...) on `tile` (one partial per
// worker piece, then their sum); clip_factor takes every such squared norm of the step (one per
// pipeline stage, in stage order, all on its first's tile) and gives
// min(1, max_norm / (sqrt(their sum) + 1e-6)) * scale (just scale when max_norm <= 0), on the
// first's tile. Sums are taken in double, the norm rounded to float, as the reference does.
Tensor sum_of_squares(Graph& graph, Program& prog, const std::vector<Tensor>& xs, double scale,
                      unsigned tile, const std::string& name);
Tensor clip_factor(Graph& graph, Program& prog, const std::vector<Tensor>& squared_norms,
                   double max_norm, double scale, const std::string& name);

// LAMB, for several parameters at once: the Adam moments updated from the gradient, then
// u = (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps) + weight_decay * param and
// param -= rate * trust * u with the trust ratio ||param|| / ||u|| (1 if either is 0) of each
// parameter. Three compute sets and two exchanges for all of them: moments and partial norms,
// the trust ratios (each on its parameter's first tile), the updates. `coefficients` are
// step_coefficients(lamb) copied onto the parameters' tiles.
struct LambTensors {
  Tensor param, grad, m, v;
};
struct LambOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-6, weight_decay = 0;
  double grad_scale = 1;  // as AdamOptions::grad_scale
};
void lamb_update(Graph& graph, Program& prog, const std::vector<LambTensors>& params,
                 const TileCopies& coefficients, const LambOptions& options,
                 const std::string& name);

}  // namespace ipupod::ipu::ops
