// The normalisation op library against plain CPU references written here, on awkward shapes
// (primes, fewer rows than tiles, more than one tile's memory) on the tiny IPU, each run with 1
// and 2 engine threads and required to give bitwise identical results.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "ipu_process/engine.hpp"
#include "ipu_process/ops/norm.hpp"
#include "ipu_process/ops/softmax.hpp"
#include "tests/ipu/op_run.hpp"

namespace ipupod::ipu {
namespace {

// ---- CPU references (double precision) ----

// Element indices of every normalisation set of x.
std::vector<std::vector<std::size_t>> norm_sets(const std::vector<std::size_t>& shape,
                                                ops::NormKind kind, std::size_t groups) {
  const std::size_t total = product(shape);
  std::vector<std::vector<std::size_t>> sets;
  if (kind == ops::NormKind::batch) {
    const std::size_t n = shape[0], c = shape[1], sp = total / (n * c);
    sets.resize(c);
    for (std::size_t i = 0; i < total; ++i) sets[(i / sp) % c].push_back(i);
    return sets;
  }
  const std::size_t count =
      kind == ops::NormKind::layer ? shape.back() : total / (shape[0] * groups);
  sets.resize(total / count);
  for (std::size_t i = 0; i < total; ++i) sets[i / count].push_back(i);
  return sets;
}

std::pair<double, double> mean_var(const Floats& x, const std::vector<std::size_t>& set) {
  double m = 0, v = 0;
  for (auto i : set) m += x[i];
  m /= double(set.size());
  for (auto i : set) v += (x[i] - m) * (x[i] - m);
  return {m, v / double(set.size())};
}

std::vector<double> ref_normalize(const Floats& x, const std::vector<std::size_t>& shape,
                                  const ops::NormParams& p) {
  std::vector<double> y(x.size());
  for (const auto& set : norm_sets(shape, p.kind, p.groups)) {
    const auto [m, v] = mean_var(x, set);
    for (auto i : set) y[i] = (x[i] - m) / std::sqrt(v + p.eps);
  }
  return y;
}

std::vector<double> ref_normalize_grad(const Floats& dy, const Floats& x,
                                       const std::vector<std::size_t>& shape,
                                       const ops::NormParams& p) {
  std::vector<double> dx(x.size());
  for (const auto& set : norm_sets(shape, p.kind, p.groups)) {
    const auto [m, v] = mean_var(x, set);
    const double inv = 1 / std::sqrt(v + p.eps);
    double mdy = 0, mdyx = 0;
    for (auto i : set) mdy += dy[i], mdyx += dy[i] * (x[i] - m) * inv;
    mdy /= double(set.size());
    mdyx /= double(set.size());
    for (auto i : set) dx[i] = inv * (dy[i] - mdy - (x[i] - m) * inv * mdyx);
  }
  return dx;
}

// ---- normalisation ----

struct NormCase {
  std::vector<std::size_t> shape;
  ops::NormParams params;
  Layout layout;
};

class NormTest : public ::testing::TestWithParam<NormCase> {};

TEST_P(NormTest, ForwardAndGradientMatchReference) {
  const auto& [shape, params, layout] = GetParam();
  const std::size_t total = product(shape);
  OpRun op;
  // An offset keeps the mean away from zero, which a one-pass variance would get wrong.
  op.input_values = {random_floats(total, 3, 2.f, 5.f), random_floats(total, 4)};
  op.build = [&](Graph& g, Program& p, auto& in, auto& out) {
    Tensor x = input(g, shape, "x", layout);
    Tensor dy = input(g, shape, "dy", {2, 1, 13});
    in = {x, dy};
    out = {ops::normalize(g, p, x, params, "norm"),
           ops::normalize_grad(g, p, dy, x, params, "norm_grad")};
  };
  const auto out = op.run_checked();
  const std::string kind = ops::norm_kind_name(params.kind);
  expect_near_all(out[0], ref_normalize(op.input_values[0], shape, params), 2e-4, kind);
  expect_near_all(out[1], ref_normalize_grad(op.input_values[1], op.input_values[0], shape, params),
                  2e-4, kind + " grad");
}

ops::NormParams norm(ops::NormKind kind, double eps, std::size_t groups = 1) {
  return {kind, eps, groups};
}

INSTANTIATE_TEST_SUITE_P(
    AwkwardShapes, NormTest,
    ::testing::Values(
        NormCase{{3, 5, 7, 11}, norm(ops::NormKind::batch, 1e-5), {1, 0, 0}},
        NormCase{{13, 17}, norm(ops::NormKind::batch, 1e-3), {5, 2, 9}},       // channels strided
        NormCase{{2, 3, 20011}, norm(ops::NormKind::batch, 1e-5), {1, 0, 0}},  // > one tile
        NormCase{{5, 3, 97}, norm(ops::NormKind::layer, 1e-5), {1, 0, 0}},
        NormCase{{3, 40009}, norm(ops::NormKind::layer, 1e-6), {1, 0, 0}},  // row > one tile
        NormCase{{1, 2}, norm(ops::NormKind::layer, 1e-5), {1, 31, 1}},
        NormCase{{3, 6, 5, 7}, norm(ops::NormKind::group, 1e-5, 3), {7, 1, 0}},
        NormCase{{2, 4, 17}, norm(ops::NormKind::group, 1e-5, 4), {1, 0, 3}},
        NormCase{{2, 5, 3}, norm(ops::NormKind::group, 1e-5, 1), {1, 0, 0}}));

TEST(BatchNorm, InferenceAndRunningStatisticsMatchReference) {
  const std::vector<std::size_t> shape = {5, 7, 3, 11};
  const std::size_t total = product(shape), c = 7, sp = 33;
  const double eps = 1e-3, momentum = 0.1;
  OpRun op;
  op.input_values = {random_floats(total, 5, -2.f, 3.f), random_floats(c, 6, -1.f, 1.f),
                     random_floats(c, 7, 0.5f, 2.f)};
  op.build = [&](Graph& g, Program& p, auto& in, auto& out) {
    Tensor x = input(g, shape, "x", {1, 0, 0});
    Tensor mean = input(g, {c}, "running_mean", {1, 20, 3});
    Tensor var = input(g, {c}, "running_var", {2, 5, 2});
    for (Tensor* t : {&mean, &var}) *t = t->reshape({c});
    Tensor y = ops::batch_norm_inference(g, p, x, mean, var, eps, "bn_inference");
    ops::batch_norm_stats_update(g, p, x, mean, var, momentum, "bn_update");
    in = {x, mean, var};
    out = {y, mean, var};
  };
  const auto out = op.run_checked();
  const Floats &x = op.input_values[0], &rm = op.input_values[1], &rv = op.input_values[2];
  std::vector<double> y(total), mean(c), var(c);
  const auto sets = norm_sets(shape, ops::NormKind::batch, 1);
  for (std::size_t ch = 0; ch < c; ++ch) {
    for (auto i : sets[ch]) y[i] = (x[i] - rm[ch]) / std::sqrt(rv[ch] + eps);
    const auto [m, v] = mean_var(x, sets[ch]);
    const double n = double(sets[ch].size());
    mean[ch] = (1 - momentum) * rm[ch] + momentum * m;
    var[ch] = (1 - momentum) * rv[ch] + momentum * v * n / (n - 1);
  }
  ASSERT_EQ(sets[0].size(), 5 * sp);
  expect_near_all(out[0], y, 1e-5, "batch_norm_inference");
  expect_near_all(out[1], mean, 1e-5, "running mean");
  expect_near_all(out[2], var, 1e-5, "running var");
}

// Predicted compute cycles of layer normalisation with its rows on the given tiles.
std::uint64_t layer_norm_compute_cycles(std::size_t rows, std::size_t length, unsigned tiles) {
  Graph g(ArchPreset::get("tiny"));
  Tensor x = g.add_variable(DType::f32, {rows, length}, "x");
  g.map_linearly(x, length, 0, tiles);
  Program p;
  ops::normalize(g, p, x, norm(ops::NormKind::layer, 1e-5), "ln");
  Engine e(g, {{"p", p}});
  e.run("p");
  return e.cycles().compute;
}

TEST(Norm, CycleEstimatesScaleWithWorkAndTiles) {
  const double one = double(layer_norm_compute_cycles(32, 200, 1));
  const double twice_the_work = double(layer_norm_compute_cycles(64, 200, 1));
  const double twice_the_tiles = double(layer_norm_compute_cycles(64, 200, 2));
  std::cout << "layer norm [32,200] on 1 tile: " << one
            << " cycles; [64,200] on 1 tile: " << twice_the_work
            << "; on 2 tiles: " << twice_the_tiles << "\n";
  EXPECT_GT(twice_the_work / one, 1.7);
  EXPECT_LT(twice_the_work / one, 2.3);
  EXPECT_GT(twice_the_tiles / twice_the_work, 0.4);
  EXPECT_LT(twice_the_tiles / twice_the_work, 0.65);
}

TEST(Norm, BadInputsGetClearErrors) {
  Graph g(ArchPreset::get("tiny"));
  Program p;
  Tensor x = input(g, {4, 6, 5}, "x", {});
  Tensor v = input(g, {6}, "v", {});
  Tensor wrong = input(g, {5}, "wrong", {});
  const auto message = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              ops::normalize(g, p, x, norm(ops::NormKind::group, 1e-5, 4), "gn");
            }).find("6 channels into 4 groups"),
            std::string::npos);
  EXPECT_NE(message([&] {
              ops::normalize(g, p, v, norm(ops::NormKind::batch, 1e-5), "bn");
            }).find("needs x [n, c, ...], got shape [6]"),
            std::string::npos);
  EXPECT_NE(message([&] {
              ops::batch_norm_inference(g, p, x, v, wrong, 1e-5, "bni");
            }).find("must be float32[6]"),
            std::string::npos);
  EXPECT_NE(message([&] { ops::softmax_grad(g, p, v, x, "sg"); }).find("dy shaped like y"),
            std::string::npos);
}

}  // namespace
}  // namespace ipupod::ipu
