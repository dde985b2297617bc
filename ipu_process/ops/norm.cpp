// Normalisation ops over the set-statistics plan: mean, then the sum of squared deviations
// from it (two passes, as stable as the reference's), then the normalising vertices.
#include "ipu_process/ops/norm.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "ipu_process/codelets.hpp"
#include "ipu_process/ops/common.hpp"
#include "ipu_process/ops/segments.hpp"
#include "ipu_process/ops/vec4.hpp"

namespace ipupod::ipu {

namespace {
using ops::load4;
using ops::store4;
using ops::Vec4;

// out[i] = (x[i] - mean) * inv for i in [0, n).
inline void apply_run(float* out, const float* x, std::size_t n, float mean, float inv) {
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) store4(out + i, (load4(x + i) - mean) * inv);
  for (; i < n; ++i) out[i] = (x[i] - mean) * inv;
}

// dx[i] = inv * (dy[i] - mdy - xhat * mdyx), xhat = (x[i] - mean) * inv, for i in [0, n).
inline void grad_apply_run(float* dx, const float* dy, const float* x, std::size_t n, float mean,
                           float inv, float mdy, float mdyx) {
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const Vec4 xhat = (load4(x + i) - mean) * inv;
    store4(dx + i, inv * (load4(dy + i) - mdy - xhat * mdyx));
  }
  for (; i < n; ++i) {
    const float xhat = (x[i] - mean) * inv;
    dx[i] = inv * (dy[i] - mdy - xhat * mdyx);
  }
}

std::uint64_t first_field_cycles(const Vertex& v, const ArchPreset& a, std::size_t instructions) {
  return vector_cycles(a, v.fields[0][0].elements(), instructions);
}
}  // namespace

void register_norm_codelets(CodeletRegistry& r) {
  r.add(ops::set_piece_codelet(
      {"NormPartialSum",
       "partial[w] = sum of x over the piece's elements in set w of its window",
       {"x", "partial"},
       [](const VertexContext& c) {
         auto x = c.region<const float>(0);
         auto part = c.region<float>(1);
         std::fill(part.begin(), part.end(), 0.f);
         ops::for_each_set_run(c, x.size(), [&](std::size_t w, std::size_t i0, std::size_t i1) {
           float s = part[w];  // in a register: the same additions in the same order
           for (std::size_t i = i0; i < i1; ++i) s += x[i];
           part[w] = s;
         });
       },
       [](const Vertex& v, const ArchPreset& a) { return first_field_cycles(v, a, 1); },
       {"partial"}}));
  r.add(ops::set_piece_codelet(
      {"NormPartialSquaredDeviation",
       "partial[w] = sum of (x - mean[w])^2 over the piece's elements in set w",
       {"x", "mean", "partial"},
       [](const VertexContext& c) {
         auto x = c.region<const float>(0);
         auto mean = c.region<const float>(1);
         auto part = c.region<float>(2);
         std::fill(part.begin(), part.end(), 0.f);
         ops::for_each_set_run(c, x.size(), [&](std::size_t w, std::size_t i0, std::size_t i1) {
           const float m = mean[w];
           float s = part[w];
           for (std::size_t i = i0; i < i1; ++i) {
             const float d = x[i] - m;
             s += d * d;
           }
           part[w] = s;
         });
       },
       [](const Vertex& v, const ArchPreset& a) { return first_field_cycles(v, a, 2); },
       {"partial"}}));
  r.add(ops::set_piece_codelet(
      {"NormApply",
       "out = (x - mean[w]) * inv_std[w]",
       {"x", "mean", "inv_std", "out"},
       [](const VertexContext& c) {
         auto x = c.region<const float>(0);
         auto mean = c.region<const float>(1);
         auto inv = c.region<const float>(2);
         auto out = c.region<float>(3);
         ops::for_each_set_run(c, x.size(), [&](std::size_t w, std::size_t i0, std::size_t i1) {
           apply_run(out.data() + i0, x.data() + i0, i1 - i0, mean[w], inv[w]);
         });
       },
       [](const Vertex& v, const ArchPreset& a) { return first_field_cycles(v, a, 2); },
       {"out"}}));
  r.add(ops::set_piece_codelet(
      {"NormGradPartial",
       "partial[w] = (sum of dy, sum of dy * (x - mean[w]) * inv_std[w]) over set w",
       {"dy", "x", "mean", "inv_std", "partial"},
       [](const VertexContext& c) {
         auto dy = c.region<const float>(0);
         auto x = c.region<const float>(1);
         auto mean = c.region<const float>(2);
         auto inv = c.region<const float>(3);
         auto part = c.region<float>(4);
         std::fill(part.begin(), part.end(), 0.f);
         ops::for_each_set_run(c, x.size(), [&](std::size_t w, std::size_t i0, std::size_t i1) {
           const float m = mean[w], s = inv[w];
           float sum = part[2 * w], dot = part[2 * w + 1];
           for (std::size_t i = i0; i < i1; ++i) {
             sum += dy[i];
             dot += dy[i] * (x[i] - m) * s;
           }
           part[2 * w] = sum;
           part[2 * w + 1] = dot;
         });
       },
       [](const Vertex& v, const ArchPreset& a) { return first_field_cycles(v, a, 4); },
       {"partial"}}));
  r.add(ops::set_piece_codelet(
      {"NormGradApply",
       "dx = inv_std[w] * (dy - mean_dy[w] - xhat * mean_dy_xhat[w]), xhat = (x - mean[w]) * "
       "inv_std[w]; means interleaved in one window",
       {"dy", "x", "mean", "inv_std", "means", "dx"},
       [](const VertexContext& c) {
         auto dy = c.region<const float>(0);
         auto x = c.region<const float>(1);
         auto mean = c.region<const float>(2);
         auto inv = c.region<const float>(3);
         auto means = c.region<const float>(4);
         auto dx = c.region<float>(5);
         ops::for_each_set_run(c, x.size(), [&](std::size_t w, std::size_t i0, std::size_t i1) {
           grad_apply_run(dx.data() + i0, dy.data() + i0, x.data() + i0, i1 - i0, mean[w], inv[w],
                          means[2 * w], means[2 * w + 1]);
         });
       },
       [](const Vertex& v, const ArchPreset& a) { return first_field_cycles(v, a, 5); },
       {"dx"}}));
  r.add(ops::set_piece_codelet(
      {"BatchNormInferenceApply",
       "out = (x - mean[w]) / sqrt(var[w] + eps); param after the set walk: eps",
       {"x", "mean", "var", "out"},
       [](const VertexContext& c) {
         auto x = c.region<const float>(0);
         auto mean = c.region<const float>(1);
         auto var = c.region<const float>(2);
         auto out = c.region<float>(3);
         const float eps = static_cast<float>(c.param(4));
         ops::for_each_set_run(c, x.size(), [&](std::size_t w, std::size_t i0, std::size_t i1) {
           const float inv = 1.f / std::sqrt(var[w] + eps);
           apply_run(out.data() + i0, x.data() + i0, i1 - i0, mean[w], inv);
         });
       },
       [](const Vertex& v, const ArchPreset& a) { return first_field_cycles(v, a, 2); },
       {"out"}}));
  r.add({"MovingAverageInPlace",
         "running = (1 - momentum) * running + momentum * batch; param: momentum",
         {"running", "batch"},
         [](const VertexContext& c) {
           auto running = c.region<float>(0);
           auto batch = c.region<const float>(1);
           const double m = c.param(0);
           for (std::size_t i = 0; i < running.size(); ++i)
             running[i] = static_cast<float>((1 - m) * running[i] + m * batch[i]);
         },
         [](const Vertex& v, const ArchPreset& a) { return first_field_cycles(v, a, 2); }});
}

namespace ops {

const char* norm_kind_name(NormKind kind) {
  switch (kind) {
    case NormKind::batch:
      return "batch";
    case NormKind::layer:
      return "layer";
    case NormKind::group:
      return "group";
  }
  return "?";
}

namespace {

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

void expect_f32(const Tensor& t, const std::string& what, const std::string& name) {
  if (t.dtype() != DType::f32)
    throw std::invalid_argument(name + ": " + what + " must be float32, got " +
                                dtype_name(t.dtype()));
}

// x [n, c, spatial...]: n, c and the product of the rest.
std::size_t spatial_of(const Tensor& x) {
  return x.elements() / (x.dim(0) * x.dim(1));
}

SetLayout layout_of(const Tensor& x, const NormParams& p, const std::string& name) {
  expect_f32(x, "input", name);
  if (p.kind == NormKind::layer) {
    if (x.rank() == 0)
      throw std::invalid_argument(name + ": layer normalisation needs rank >= 1, got a scalar");
    const std::size_t n = x.shape().back();
    return SetLayout::rows(n ? x.elements() / n : 0, n);
  }
  if (x.rank() < 2)
    throw std::invalid_argument(name + ": " + norm_kind_name(p.kind) +
                                " normalisation needs x [n, c, ...], got shape " +
                                shape_text(x.shape()) + "; add the missing axes with a reshape");
  if (p.kind == NormKind::group) {
    if (p.groups == 0 || x.dim(1) % p.groups != 0)
      throw std::invalid_argument(name + ": group normalisation of " + std::to_string(x.dim(1)) +
                                  " channels into " + std::to_string(p.groups) +
                                  " groups: the channels must be a multiple of the groups");
    const std::size_t sets = x.dim(0) * p.groups;
    return SetLayout::rows(sets, sets ? x.elements() / sets : 0);
  }
  if (x.elements() == 0) return SetLayout::channels(x.dim(0), x.dim(1), 0);
  return SetLayout::channels(x.dim(0), x.dim(1), spatial_of(x));
}

void check_eps(double eps, const std::string& name) {
  if (!(eps >= 0))
    throw std::invalid_argument(name + ": eps must be >= 0, got " + std::to_string(eps));
}

struct Moments {
  Tensor mean, inv_std;
};

Moments moments(SetPlan& plan, Program& prog, const Tensor& x, double eps,
                const std::string& name) {
  const double inv_count = 1.0 / static_cast<double>(plan.layout().count);
  Moments m;
  m.mean = plan.reduce(prog, "NormPartialSum", 1, {x}, {}, {}, SetCombine::sum, SetFinish::scale,
                       inv_count, 0.0, name + "/mean");
  m.inv_std = plan.reduce(prog, "NormPartialSquaredDeviation", 1, {x}, {m.mean}, {1},
                          SetCombine::sum, SetFinish::rsqrt, inv_count, eps, name + "/inv_std");
  return m;
}

void check_channel_stats(const Tensor& x, const Tensor& mean, const Tensor& var,
                         const std::string& name) {
  if (x.rank() < 2)
    throw std::invalid_argument(name + ": expects x [n, c, ...], got shape " +
                                shape_text(x.shape()));
  expect_f32(x, "x", name);
  for (const Tensor* t : {&mean, &var}) {
    expect_f32(*t, "running statistics", name);
    if (t->elements() != x.dim(1))
      throw std::invalid_argument(name + ": running statistics must be float32[" +
                                  std::to_string(x.dim(1)) + "] (one per channel of x " +
                                  shape_text(x.shape()) + "), got shape " + shape_text(t->shape()));
  }
}

}  // namespace

Tensor normalize(Graph& graph, Program& prog, const Tensor& x, const NormParams& params,
                 const std::string& name) {
  const SetLayout layout = layout_of(x, params, name);
  check_eps(params.eps, name);
  Tensor out = clone_like(graph, x, name);
  if (x.elements() == 0) return out;
  SetPlan plan(graph, x, layout, name);
  const Moments m = moments(plan, prog, x, params.eps, name);
  plan.apply(prog, "NormApply", {x}, {m.mean, m.inv_std}, {1, 1}, out, name);
  return out;
}

Tensor normalize_grad(Graph& graph, Program& prog, const Tensor& dy, const Tensor& x,
                      const NormParams& params, const std::string& name) {
  const SetLayout layout = layout_of(x, params, name);
  check_eps(params.eps, name);
  expect_f32(dy, "dy", name);
  if (dy.shape() != x.shape())
    throw std::invalid_argument(name + ": dy of shape " + shape_text(dy.shape()) +
                                " must have x's shape " + shape_text(x.shape()));
  Tensor dx = clone_like(graph, x, name);
  if (x.elements() == 0) return dx;
  Tensor dy_local = rearrange_like(graph, prog, dy, x, name + "/dy");
  SetPlan plan(graph, x, layout, name);
  const Moments m = moments(plan, prog, x, params.eps, name);
  const double inv_count = 1.0 / static_cast<double>(layout.count);
  Tensor means = plan.reduce(prog, "NormGradPartial", 2, {dy_local, x}, {m.mean, m.inv_std}, {1, 1},
                             SetCombine::sum, SetFinish::scale, inv_count, 0.0, name + "/dy_means");
  plan.apply(prog, "NormGradApply", {dy_local, x}, {m.mean, m.inv_std, means}, {1, 1, 2}, dx, name);
  return dx;
}

Tensor batch_norm_inference(Graph& graph, Program& prog, const Tensor& x, const Tensor& mean,
                            const Tensor& var, double eps, const std::string& name) {
  check_channel_stats(x, mean, var, name);
  check_eps(eps, name);
  Tensor out = clone_like(graph, x, name);
  if (x.elements() == 0) return out;
  SetPlan plan(graph, x, SetLayout::channels(x.dim(0), x.dim(1), spatial_of(x)), name);
  plan.apply(prog, "BatchNormInferenceApply", {x}, {mean, var}, {1, 1}, out, name, {eps});
  return out;
}

void batch_norm_stats_update(Graph& graph, Program& prog, const Tensor& x, const Tensor& mean,
                             const Tensor& var, double momentum, const std::string& name) {
  check_channel_stats(x, mean, var, name);
  if (!(momentum >= 0 && momentum <= 1))
    throw std::invalid_argument(name + ": momentum must be in [0, 1], got " +
                                std::to_string(momentum));
  if (x.elements() == 0) return;
  const SetLayout layout = SetLayout::channels(x.dim(0), x.dim(1), spatial_of(x));
  SetPlan plan(graph, x, layout, name);
  const double inv_count = 1.0 / static_cast<double>(layout.count);
  // Bessel's correction for the running variance, as PyTorch's BatchNorm does.
  const double inv_dof = layout.count > 1 ? 1.0 / static_cast<double>(layout.count - 1) : inv_count;
  Tensor batch_mean = plan.reduce(prog, "NormPartialSum", 1, {x}, {}, {}, SetCombine::sum,
                                  SetFinish::scale, inv_count, 0.0, name + "/mean");
  Tensor batch_var = plan.reduce(prog, "NormPartialSquaredDeviation", 1, {x}, {batch_mean}, {1},
                                 SetCombine::sum, SetFinish::scale, inv_dof, 0.0, name + "/var");
  ComputeSetId cs = graph.add_compute_set(name + "/update");
  for (const auto& [running, batch] : {std::pair{mean, batch_mean}, std::pair{var, batch_var}}) {
    Tensor local =
        rearrange_like(graph, prog, batch.reshape(running.shape()), running, name + "/batch_stats");
    for_each_worker_piece(graph, running, 1, [&](unsigned tile, std::size_t b, std::size_t e) {
      graph.add_vertex(cs, {"MovingAverageInPlace",
                            tile,
                            {{running.flatten().slice(b, e)}, {local.flatten().slice(b, e)}},
                            {momentum}});
    });
  }
  prog.add(Program::execute(cs));
}

}  // namespace ops
}  // namespace ipupod::ipu
