// Optimizer op library and its codelets. The arithmetic follows the models layer's reference
// kernels operation for operation (float moments, double bias corrections), so that a model
// trained on the emulated IPU matches the interpreter.
#include "ipu_process/ops/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

#include "ipu_process/codelets.hpp"
#include "ipu_process/ops/common.hpp"

namespace ipupod::ipu {

namespace {
// Vector instructions per element group of the fused updates (loads, multiply-adds, the square
// root and the division of Adam; the two multiply-adds of momentum SGD).
constexpr std::size_t kAdamInstructions = 10, kMomentumInstructions = 4;

std::uint64_t scalar_cycles(const Vertex&, const ArchPreset& arch) {
  return vector_cycles(arch, 1, 8);
}
}  // namespace

void register_optimizer_codelets(CodeletRegistry& r) {
  r.add({"Increment",
         "counter += 1 (a float step counter)",
         {"counter"},
         [](const VertexContext& c) { c.region<float>(0)[0] += 1.f; },
         scalar_cycles});
  r.add({"LrSchedule",
         "rate at 1-based step: warm-up, then constant / step / cosine; params: kind, base, "
         "warmup, total, step size, gamma, min",
         {"step", "rate"},
         [](const VertexContext& c) {
           const double base = c.param(1), warmup = c.param(2), total = c.param(3);
           const double k = std::max(0.0, static_cast<double>(c.region<const float>(0)[0]) - 1.0);
           double lr = base;
           if (k < warmup) {
             lr = base * (k + 1) / warmup;
           } else if (c.param(0) == 1) {
             lr = base * std::pow(c.param(5), std::floor((k - warmup) / std::max(1.0, c.param(4))));
           } else if (c.param(0) == 2) {
             const double progress = std::min(1.0, (k - warmup) / std::max(1.0, total - warmup));
             lr = c.param(6) +
                  0.5 * (base - c.param(6)) * (1 + std::cos(std::numbers::pi * progress));
           }
           c.region<float>(1)[0] = static_cast<float>(lr);
         },
         scalar_cycles});
  r.add({"OptimizerCoefficients",
         "out = [rate, factor (1 without one), then for Adam rate / (1 - beta1^step), "
         "sqrt(1 - beta2^step), for LAMB step]; params: kind (0 momentum, 1 Adam, 2 LAMB), beta1, "
         "beta2",
         {"rate", "step", "factor", "out"},
         [](const VertexContext& c) {
           const float rate = c.region<const float>(0)[0];
           auto out = c.region<float>(3);
           out[0] = rate;
           out[1] = c.regions(2) > 0 ? c.region<const float>(2)[0] : 1.f;
           const auto kind = static_cast<ops::UpdateKind>(c.size_param(0));
           if (kind == ops::UpdateKind::sgd_momentum) return;
           const double t = c.region<const float>(1)[0];
           if (kind == ops::UpdateKind::lamb) {
             out[2] = static_cast<float>(t);
             return;
           }
           out[2] = static_cast<float>(rate / (1 - std::pow(c.param(1), t)));
           out[3] = static_cast<float>(std::sqrt(1 - std::pow(c.param(2), t)));
         },
         scalar_cycles,
         {"out"}});
  r.add({"AdamUpdate",
         "Adam / AdamW in place; coefficients from OptimizerCoefficients; params: beta1, beta2, "
         "eps, weight decay, decoupled, gradient scale",
         {"param", "grad", "m", "v", "coefficients"},
         [](const VertexContext& c) {
           auto p = c.region<float>(0);
           auto g = c.region<const float>(1);
           auto m = c.region<float>(2);
           auto v = c.region<float>(3);
           auto k = c.region<const float>(4);
           const auto b1 = static_cast<float>(c.param(0)), b2 = static_cast<float>(c.param(1));
           const auto eps = static_cast<float>(c.param(2)), wd = static_cast<float>(c.param(3));
           const bool decoupled = c.param(4) != 0;
           const auto scale = static_cast<float>(c.param(5));
           const float rate = k[0], factor = k[1], step_size = k[2], bc2_sqrt = k[3];
           for (std::size_t i = 0; i < p.size(); ++i) {
             float gi = g[i] * scale * factor;  // exact when both are 1
             if (decoupled)
               p[i] *= 1 - rate * wd;
             else if (wd != 0)
               gi += wd * p[i];
             m[i] = m[i] * b1 + (1 - b1) * gi;
             v[i] = v[i] * b2 + (1 - b2) * gi * gi;
             p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
           }
         },
         [](const Vertex& v, const ArchPreset& a) {
           return vector_cycles(a, v.fields[0][0].elements(), kAdamInstructions);
         }});
  r.add({"SgdMomentumUpdate",
         "SGD with momentum in place; coefficients from OptimizerCoefficients; params: momentum, "
         "weight decay, nesterov, gradient scale",
         {"param", "grad", "velocity", "coefficients"},
         [](const VertexContext& c) {
           auto p = c.region<float>(0);
           auto g = c.region<const float>(1);
           auto vel = c.region<float>(2);
           auto k = c.region<const float>(3);
           const auto mu = static_cast<float>(c.param(0)), wd = static_cast<float>(c.param(1));
           const bool nesterov = c.param(2) != 0;
           const auto scale = static_cast<float>(c.param(3));
           const float rate = k[0], factor = k[1];
           for (std::size_t i = 0; i < p.size(); ++i) {
             float gi = g[i] * scale * factor + wd * p[i];
             vel[i] = mu * vel[i] + gi;
             gi = nesterov ? gi + mu * vel[i] : vel[i];
             p[i] -= rate * gi;
           }
         },
         [](const Vertex& v, const ArchPreset& a) {
           return vector_cycles(a, v.fields[0][0].elements(), kMomentumInstructions);
         }});
}

namespace ops {
namespace {
constexpr std::size_t kMinElementsPerWorker = 64;

void check_scalar(const Tensor& t, const std::string& what, const std::string& name) {
  if (t.elements() != 1)
    throw std::invalid_argument(name + ": " + what + " must be a scalar, got " +
                                std::to_string(t.elements()) + " elements");
}

// t itself if it lies on `tile`, else a copy of it there (added to prog).
Tensor on_tile(Graph& graph, Program& prog, const Tensor& t, unsigned tile,
               const std::string& name) {
  if (graph.tile_of(t) == tile) return t;
  Tensor local = graph.add_variable(t.dtype(), t.shape(), name);
  graph.set_tile_mapping(local, tile);
  prog.add(Program::copy(t, local));
  return local;
}

// One vertex per worker piece of param, each connected to the same element range of the
// per-element operands and to the step's coefficients on its own tile.
void per_element_update(Graph& graph, Program& prog, const std::string& codelet,
                        const Tensor& param, std::vector<Tensor> operands,
                        const TileCopies& coefficients, std::vector<double> params,
                        const std::string& name) {
  for (Tensor& t : operands) {
    if (t.shape() != param.shape())
      throw std::invalid_argument(name + ": operand of " + std::to_string(t.elements()) +
                                  " elements for a parameter of " +
                                  std::to_string(param.elements()));
    t = rearrange_like(graph, prog, t, param, name + "/operand");
  }
  ComputeSetId cs = graph.add_compute_set(name);
  const Tensor pf = param.flatten();
  for_each_worker_piece(graph, param, kMinElementsPerWorker,
                        [&](unsigned tile, std::size_t b, std::size_t e) {
                          Vertex v{codelet, tile, {{pf.slice(b, e)}}, params};
                          for (const Tensor& t : operands)
                            v.fields.push_back({t.flatten().slice(b, e)});
                          v.fields.push_back({coefficients.on(tile, name)});
                          graph.add_vertex(cs, std::move(v));
                        });
  prog.add(Program::execute(cs));
}
}  // namespace

Tensor TileCopies::on(unsigned tile, const std::string& name) const {
  const auto it = std::find(tiles.begin(), tiles.end(), tile);
  if (it == tiles.end())
    throw std::logic_error(name + ": the step's coefficients were not copied to tile " +
                           std::to_string(tile) + " (copy_to_tiles was given other tensors)");
  return copies.row(static_cast<std::size_t>(it - tiles.begin()));
}

TileCopies copy_to_tiles(Graph& graph, Program& prog, const Tensor& value,
                         const std::vector<Tensor>& targets, const std::string& name) {
  TileCopies out;
  for (const Tensor& t : targets)
    for (const auto& iv : graph.tile_mapping(t))
      if (std::find(out.tiles.begin(), out.tiles.end(), iv.tile) == out.tiles.end())
        out.tiles.push_back(iv.tile);
  const std::size_t width = value.elements();
  out.copies = graph.add_variable(value.dtype(), {out.tiles.size(), width}, name);
  std::vector<std::pair<Tensor, Tensor>> pairs;
  for (std::size_t i = 0; i < out.tiles.size(); ++i) {
    graph.set_tile_mapping(out.copies.row(i), out.tiles[i]);
    pairs.emplace_back(value.flatten(), out.copies.row(i));
  }
  if (!pairs.empty()) prog.add(Program::copy(std::move(pairs)));
  return out;
}

void increment(Graph& graph, Program& prog, const Tensor& counter, const std::string& name) {
  check_scalar(counter, "the counter", name);
  ComputeSetId cs = graph.add_compute_set(name);
  graph.add_vertex(cs, {"Increment", graph.tile_of(counter), {{counter.flatten()}}, {}});
  prog.add(Program::execute(cs));
}
Tensor lr_schedule(Graph& graph, Program& prog, const Tensor& step, const LrSchedule& s,
                   const std::string& name) {
  check_scalar(step, "the step", name);
  const unsigned tile = graph.tile_of(step);
  Tensor rate = graph.add_variable(DType::f32, {}, name);
  graph.set_tile_mapping(rate, tile);
  ComputeSetId cs = graph.add_compute_set(name);
  graph.add_vertex(cs, {"LrSchedule",
                        tile,
                        {{step.flatten()}, {rate.flatten()}},
                        {static_cast<double>(s.kind), s.base_lr,
                         static_cast<double>(s.warmup_steps), static_cast<double>(s.total_steps),
                         static_cast<double>(s.step_size), s.gamma, s.min_lr}});
  prog.add(Program::execute(cs));
  return rate;
}

Tensor step_coefficients(Graph& graph, Program& prog, UpdateKind kind, const Tensor& rate,
                         const std::optional<Tensor>& step, const std::optional<Tensor>& factor,
                         double beta1, double beta2, const std::string& name) {
  check_scalar(rate, "the learning rate", name);
  if (kind != UpdateKind::sgd_momentum && !step)
    throw std::invalid_argument(name + ": Adam and LAMB coefficients need the step counter");
  const unsigned tile = graph.tile_of(rate);
  std::vector<Tensor> step_field, factor_field;
  if (step) {
    check_scalar(*step, "the step", name);
    step_field.push_back(on_tile(graph, prog, *step, tile, name + "/step"));
  }
  if (factor) {
    check_scalar(*factor, "the gradient factor", name);
    factor_field.push_back(on_tile(graph, prog, *factor, tile, name + "/factor"));
  }
  const std::size_t width = kind == UpdateKind::sgd_momentum ? 2 : kind == UpdateKind::lamb ? 3 : 4;
  Tensor out = graph.add_variable(DType::f32, {width}, name);
  graph.set_tile_mapping(out, tile);
  ComputeSetId cs = graph.add_compute_set(name);
  graph.add_vertex(cs, {"OptimizerCoefficients",
                        tile,
                        {{rate.flatten()}, step_field, factor_field, {out}},
                        {static_cast<double>(kind), beta1, beta2}});
  prog.add(Program::execute(cs));
  return out;
}

void adam_update(Graph& graph, Program& prog, const Tensor& param, const Tensor& grad,
                 const Tensor& m, const Tensor& v, const TileCopies& coefficients,
                 const AdamOptions& o, const std::string& name) {
  per_element_update(
      graph, prog, "AdamUpdate", param, {grad, m, v}, coefficients,
      {o.beta1, o.beta2, o.eps, o.weight_decay, o.decoupled ? 1.0 : 0.0, o.grad_scale}, name);
}

void sgd_momentum_update(Graph& graph, Program& prog, const Tensor& param, const Tensor& grad,
                         const Tensor& velocity, const TileCopies& coefficients,
                         const MomentumOptions& o, const std::string& name) {
  per_element_update(graph, prog, "SgdMomentumUpdate", param, {grad, velocity}, coefficients,
                     {o.momentum, o.weight_decay, o.nesterov ? 1.0 : 0.0, o.grad_scale}, name);
}

}  // namespace ops
}  // namespace ipupod::ipu
