// Finite-difference gradient checking for IR graphs: the loss sum(y * w) with fixed random w,
// analytic gradients from build_backward, central differences from fresh interpreters.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "models/autodiff.hpp"
#include "models/interpreter.hpp"

namespace ipupod::models::testing {

inline Buffer random_buffer(const TensorInfo& info, std::uint32_t seed, float lo = -1.f,
                            float hi = 1.f) {
  Buffer b = Buffer::zeros(info);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  for (auto& v : b.f) v = d(gen);
  return b;
}

struct GradCheckOptions {
  double eps = 1e-2;
  double abs_tol = 2e-3;
  double rel_tol = 2e-2;
  std::size_t max_elements_per_param = 48;
  float lo = -1.f, hi = 1.f;  // parameter values are drawn from [lo, hi]
};

// Checks d(sum(y * w))/d(every parameter) of `graph` against central differences.
// `setup` sets the graph's other inputs (indices, labels, masks) on each interpreter.
inline void check_gradients(Graph& graph, ValueId y, const GradCheckOptions& o = {},
                            const std::function<void(Interpreter&)>& setup = {}) {
  const ValueId w = graph.input("grad_check/weights", graph.info(y));
  std::vector<std::size_t> axes(graph.info(y).shape.size());
  for (std::size_t i = 0; i < axes.size(); ++i) axes[i] = i;
  ValueId prod = graph.binary(BinaryFn::mul, y, w, "grad_check/product");
  const ValueId loss =
      axes.empty() ? prod : graph.reduce_sum(prod, axes, false, 1.0, "grad_check/loss");
  const auto grads = build_backward(graph, loss);
  const Buffer weights = random_buffer(graph.info(w), 99);
  std::map<ValueId, Buffer> values;
  std::uint32_t seed = 1;
  for (ValueId p : graph.parameters()) values[p] = random_buffer(graph.info(p), seed++, o.lo, o.hi);

  const auto make = [&](const std::map<ValueId, Buffer>& ps) {
    auto interp = std::make_unique<Interpreter>(graph, 5);
    for (const auto& [p, v] : ps) interp->set(p, v);
    interp->set(w, weights);
    if (setup) setup(*interp);
    return interp;
  };
  auto interp = make(values);
  interp->run({Phase::forward, Phase::backward});
  std::size_t checked = 0;
  for (const auto& [p, g] : grads) {
    const Buffer analytic = interp->get(g);
    const std::size_t n = values[p].f.size();
    const std::size_t stride = std::max<std::size_t>(1, n / o.max_elements_per_param);
    for (std::size_t i = 0; i < n; i += stride) {
      double losses[2];
      for (int s = 0; s < 2; ++s) {
        auto probe_values = values;
        probe_values[p].f[i] += static_cast<float>(s ? -o.eps : o.eps);
        auto probe = make(probe_values);
        probe->run({Phase::forward});
        losses[s] = probe->get(loss).f[0];
      }
      const double numeric = (losses[0] - losses[1]) / (2 * o.eps);
      EXPECT_NEAR(analytic.f[i], numeric, o.abs_tol + o.rel_tol * std::abs(numeric))
          << graph.value(p).name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 0u);
}

}  // namespace ipupod::models::testing
