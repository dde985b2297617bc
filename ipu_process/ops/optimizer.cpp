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
// LAMB's first pass is Adam's plus the two squares it sums; its second recomputes the update.
constexpr std::size_t kLambMomentsInstructions = 14, kLambUpdateInstructions = 10;

// LAMB's update direction of element i: Adam's step without the rate, plus the weight decay.
double lamb_direction(float m, float v, float p, double bc1, double bc2, double eps, double wd) {
  return (m / bc1) / (std::sqrt(v / bc2) + eps) + wd * p;
}

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
  r.add({"SumOfSquares",
         "out = sum over every region of (scale * x)^2, or of x when square is 0, summed in "
         "double; params: scale, square",
         {"in", "out"},
         [](const VertexContext& c) {
           const auto scale = static_cast<float>(c.param(0));
           const bool square = c.param(1) != 0;
           double s = 0;
           for (std::size_t r = 0; r < c.regions(0); ++r)
             for (float x : c.region<const float>(0, r)) {
               const float y = x * scale;
               s += square ? static_cast<double>(y) * y : static_cast<double>(x);
             }
           c.region<float>(1)[0] = static_cast<float>(s);
         },
         [](const Vertex& v, const ArchPreset& a) { return field_vector_cycles(v, a, 0, 2); },
         {"out"}});
  r.add({"ClipFactor",
         "out = min(1, max_norm / (sqrt(sum of the squared norms) + 1e-6)) * scale, or scale "
         "when max_norm <= 0; params: max_norm, scale",
         {"squared_norms", "out"},
         [](const VertexContext& c) {
           double s = 0;
           for (std::size_t r = 0; r < c.regions(0); ++r)
             for (float x : c.region<const float>(0, r)) s += x;
           const double max_norm = c.param(0);
           const auto norm = static_cast<float>(std::sqrt(s));
           const double f =
               max_norm > 0 ? std::min(1.0, max_norm / (static_cast<double>(norm) + 1e-6)) : 1.0;
           c.region<float>(1)[0] = static_cast<float>(f * c.param(1));
         },
         scalar_cycles,
         {"out"}});
  r.add({"LambMoments",
         "LAMB's first pass: moments in place, then out = [sum param^2, sum u^2] of the piece "
         "(u: the update direction); coefficients from OptimizerCoefficients; params: beta1, "
         "beta2, eps, weight decay, gradient scale",
         {"param", "grad", "m", "v", "coefficients", "out"},
         [](const VertexContext& c) {
           auto p = c.region<const float>(0);
           auto g = c.region<const float>(1);
           auto m = c.region<float>(2);
           auto v = c.region<float>(3);
           auto k = c.region<const float>(4);
           const auto b1 = static_cast<float>(c.param(0)), b2 = static_cast<float>(c.param(1));
           const auto scale = static_cast<float>(c.param(4));
           const float factor = k[1];
           const double t = k[2];
           const double bc1 = 1 - std::pow(c.param(0), t), bc2 = 1 - std::pow(c.param(1), t);
           double pn = 0, un = 0;
           for (std::size_t i = 0; i < p.size(); ++i) {
             const float gi = g[i] * scale * factor;
             m[i] = m[i] * b1 + (1 - b1) * gi;
             v[i] = v[i] * b2 + (1 - b2) * gi * gi;
             const double u = lamb_direction(m[i], v[i], p[i], bc1, bc2, c.param(2), c.param(3));
             pn += static_cast<double>(p[i]) * p[i];
             un += u * u;
           }
           auto out = c.region<float>(5);
           out[0] = static_cast<float>(pn);
           out[1] = static_cast<float>(un);
         },
         [](const Vertex& v, const ArchPreset& a) {
           return field_vector_cycles(v, a, 0, kLambMomentsInstructions);
         },
         {"out"}});
  r.add({"LambTrust",
         "out = sqrt(sum of param^2) / sqrt(sum of u^2) over the pieces' [param^2, u^2] regions, "
         "1 if either is 0",
         {"norms", "out"},
         [](const VertexContext& c) {
           double pn = 0, un = 0;
           for (std::size_t r = 0; r < c.regions(0); ++r) {
             auto n = c.region<const float>(0, r);
             pn += n[0];
             un += n[1];
           }
           c.region<float>(1)[0] =
               static_cast<float>(pn > 0 && un > 0 ? std::sqrt(pn) / std::sqrt(un) : 1.0);
         },
         scalar_cycles,
         {"out"}});
  r.add({"LambUpdate",
         "LAMB's second pass: param -= rate * trust * u; coefficients from OptimizerCoefficients; "
         "params: beta1, beta2, eps, weight decay",
         {"param", "m", "v", "coefficients", "trust"},
         [](const VertexContext& c) {
           auto p = c.region<float>(0);
           auto m = c.region<const float>(1);
           auto v = c.region<const float>(2);
           auto k = c.region<const float>(3);
           const double trust = c.region<const float>(4)[0];
           const float rate = k[0];
           const double t = k[2];
           const double bc1 = 1 - std::pow(c.param(0), t), bc2 = 1 - std::pow(c.param(1), t);
           for (std::size_t i = 0; i < p.size(); ++i) {
             const double u = lamb_direction(m[i], v[i], p[i], bc1, bc2, c.param(2), c.param(3));
             p[i] = static_cast<float>(p[i] - rate * trust * u);
           }
         },
         [](const Vertex& v, const ArchPreset& a) {
           return field_vector_cycles(v, a, 0, kLambUpdateInstructions);
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

Tensor sum_of_squares(Graph& graph, Program& prog, const std::vector<Tensor>& xs, double scale,
                      unsigned tile, const std::string& name) {
  std::vector<std::pair<unsigned, Tensor>> pieces;  // (tile, elements)
  for (const Tensor& x : xs) {
    const Tensor flat = x.flatten();
    for_each_worker_piece(graph, x, kMinElementsPerWorker,
                          [&](unsigned t, std::size_t b, std::size_t e) {
                            pieces.emplace_back(t, flat.slice(b, e));
                          });
  }
  Tensor out = graph.add_variable(DType::f32, {}, name);
  graph.set_tile_mapping(out, tile);
  if (pieces.empty()) {
    ComputeSetId cs = graph.add_compute_set(name);
    graph.add_vertex(cs, {"SumOfSquares", tile, {{}, {out}}, {1.0, 0.0}});
    prog.add(Program::execute(cs));
    return out;
  }
  // Stage 1: a partial per worker piece, on its tile; stage 2: their sum on `tile`.
  Tensor partials = graph.add_variable(DType::f32, {pieces.size()}, name + "/partials",
                                       MemoryCategory::temporary);
  Tensor gathered = graph.add_variable(DType::f32, {pieces.size()}, name + "/gathered",
                                       MemoryCategory::temporary);
  graph.set_tile_mapping(gathered, tile);
  ComputeSetId partial_cs = graph.add_compute_set(name + "/partials");
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Tensor slot = partials.slice(i, i + 1);
    graph.set_tile_mapping(slot, pieces[i].first);
    graph.add_vertex(partial_cs,
                     {"SumOfSquares", pieces[i].first, {{pieces[i].second}, {slot}}, {scale, 1.0}});
  }
  prog.add(Program::execute(partial_cs));
  prog.add(Program::copy(partials, gathered));
  ComputeSetId cs = graph.add_compute_set(name);
  graph.add_vertex(cs, {"SumOfSquares", tile, {{gathered}, {out}}, {1.0, 0.0}});
  prog.add(Program::execute(cs));
  return out;
}

Tensor clip_factor(Graph& graph, Program& prog, const std::vector<Tensor>& squared_norms,
                   double max_norm, double scale, const std::string& name) {
  if (squared_norms.empty())
    throw std::invalid_argument(name + ": the clip factor needs at least one squared norm");
  const unsigned tile = graph.tile_of(squared_norms[0]);
  std::vector<Tensor> local;
  for (std::size_t i = 0; i < squared_norms.size(); ++i)
    local.push_back(
        on_tile(graph, prog, squared_norms[i], tile, name + "/squared_norm" + std::to_string(i))
            .flatten());
  Tensor out = graph.add_variable(DType::f32, {}, name);
  graph.set_tile_mapping(out, tile);
  ComputeSetId cs = graph.add_compute_set(name);
  graph.add_vertex(cs, {"ClipFactor", tile, {local, {out}}, {max_norm, scale}});
  prog.add(Program::execute(cs));
  return out;
}

void lamb_update(Graph& graph, Program& prog, const std::vector<LambTensors>& params,
                 const TileCopies& coefficients, const LambOptions& o, const std::string& name) {
  ComputeSetId moments_cs = graph.add_compute_set(name + "/moments");
  ComputeSetId trust_cs = graph.add_compute_set(name + "/trust");
  ComputeSetId update_cs = graph.add_compute_set(name + "/update");
  std::vector<std::pair<Tensor, Tensor>> to_trust, from_trust;
  for (std::size_t j = 0; j < params.size(); ++j) {
    const LambTensors& t = params[j];
    const std::string pname = name + "/" + std::to_string(j);
    std::vector<Tensor> operands = {t.grad, t.m, t.v};
    for (Tensor& x : operands) {
      if (x.shape() != t.param.shape())
        throw std::invalid_argument(pname + ": operand of " + std::to_string(x.elements()) +
                                    " elements for a parameter of " +
                                    std::to_string(t.param.elements()));
      x = rearrange_like(graph, prog, x, t.param, pname + "/operand").flatten();
    }
    std::vector<std::pair<unsigned, std::pair<std::size_t, std::size_t>>> pieces;
    for_each_worker_piece(graph, t.param, kMinElementsPerWorker,
                          [&](unsigned tile, std::size_t b, std::size_t e) {
                            pieces.push_back({tile, {b, e}});
                          });
    const unsigned trust_tile = pieces.front().first;
    Tensor norms = graph.add_variable(DType::f32, {pieces.size(), 2}, pname + "/norms",
                                      MemoryCategory::temporary);
    Tensor gathered = graph.add_variable(DType::f32, {pieces.size(), 2}, pname + "/gathered",
                                         MemoryCategory::temporary);
    graph.set_tile_mapping(gathered, trust_tile);
    Tensor trust = graph.add_variable(DType::f32, {}, pname + "/trust", MemoryCategory::temporary);
    graph.set_tile_mapping(trust, trust_tile);
    std::vector<unsigned> tiles;
    for (const auto& piece : pieces)
      if (std::find(tiles.begin(), tiles.end(), piece.first) == tiles.end())
        tiles.push_back(piece.first);
    Tensor trust_copies = graph.add_variable(DType::f32, {tiles.size()}, pname + "/trust_copies",
                                             MemoryCategory::temporary);
    std::vector<Tensor> norm_rows;
    const Tensor pf = t.param.flatten();
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const auto [tile, range] = pieces[i];
      const auto [b, e] = range;
      graph.set_tile_mapping(norms.row(i), tile);
      graph.add_vertex(moments_cs, {"LambMoments",
                                    tile,
                                    {{pf.slice(b, e)},
                                     {operands[0].slice(b, e)},
                                     {operands[1].slice(b, e)},
                                     {operands[2].slice(b, e)},
                                     {coefficients.on(tile, pname)},
                                     {norms.row(i)}},
                                    {o.beta1, o.beta2, o.eps, o.weight_decay, o.grad_scale}});
      norm_rows.push_back(gathered.row(i));
      const std::size_t slot = std::find(tiles.begin(), tiles.end(), tile) - tiles.begin();
      graph.add_vertex(update_cs, {"LambUpdate",
                                   tile,
                                   {{pf.slice(b, e)},
                                    {operands[1].slice(b, e)},
                                    {operands[2].slice(b, e)},
                                    {coefficients.on(tile, pname)},
                                    {trust_copies.slice(slot, slot + 1)}},
                                   {o.beta1, o.beta2, o.eps, o.weight_decay}});
    }
    for (std::size_t i = 0; i < tiles.size(); ++i) {
      graph.set_tile_mapping(trust_copies.slice(i, i + 1), tiles[i]);
      from_trust.emplace_back(trust.flatten(), trust_copies.slice(i, i + 1));
    }
    to_trust.emplace_back(norms, gathered);
    graph.add_vertex(trust_cs, {"LambTrust", trust_tile, {norm_rows, {trust.flatten()}}, {}});
  }
  prog.add(Program::execute(moments_cs));
  prog.add(Program::copy(std::move(to_trust)));
  prog.add(Program::execute(trust_cs));
  prog.add(Program::copy(std::move(from_trust)));
  prog.add(Program::execute(update_cs));
}

}  // namespace ops
}  // namespace ipupod::ipu
