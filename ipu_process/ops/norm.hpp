// Normalisation op library: batch, layer and group normalisation without the affine part, their
// gradient, batch-norm inference with running statistics and the running statistics' update.
// Statistics are reduced in stages across the tiles that hold the data (ops/segments.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace ipupod::ipu::ops {

// Which elements share a mean and variance (the same kinds as the model IR's):
// batch: per channel over (n, spatial) of x [n, c, ...]; layer: per row over the last axis;
// group: per (sample, group of c / groups channels) of x [n, c, ...].
enum class NormKind : std::uint8_t { batch, layer, group };
const char* norm_kind_name(NormKind kind);

struct NormParams {
  NormKind kind = NormKind::layer;
  double eps = 1e-5;
  std::size_t groups = 1;  // group normalisation only
};

// (x - mean) / sqrt(var + eps), biased variance; out is laid out like x.
Tensor normalize(Graph& graph, Program& prog, const Tensor& x, const NormParams& params,
                 const std::string& name);
// dx = (dy - mean(dy) - xhat * mean(dy * xhat)) / sqrt(var + eps), statistics recomputed from x.
Tensor normalize_grad(Graph& graph, Program& prog, const Tensor& dy, const Tensor& x,
                      const NormParams& params, const std::string& name);
// (x - mean[c]) / sqrt(var[c] + eps) for x [n, c, ...] and running statistics mean, var [c].
Tensor batch_norm_inference(Graph& graph, Program& prog, const Tensor& x, const Tensor& mean,
                            const Tensor& var, double eps, const std::string& name);
// In place: mean = (1 - momentum) * mean + momentum * batch mean;
// var = (1 - momentum) * var + momentum * unbiased batch variance (biased if n * spatial is 1).
void batch_norm_stats_update(Graph& graph, Program& prog, const Tensor& x, const Tensor& mean,
                             const Tensor& var, double momentum, const std::string& name);

}  // namespace ipupod::ipu::ops
