// Softmax and normalisation op libraries against plain CPU references written here, on awkward
// shapes (primes, fewer rows than tiles, a row longer than one tile's memory) on the tiny IPU,
// each run with 1 and 2 engine threads and required to give bitwise identical results.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "ipu_process/engine.hpp"
#include "ipu_process/ops/norm.hpp"
#include "ipu_process/ops/softmax.hpp"

namespace ipupod::ipu {
namespace {

using Floats = std::vector<float>;

Floats random_floats(std::size_t n, unsigned seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Floats v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// Builds a graph on the tiny IPU, writes the inputs, runs once and reads the outputs (raw
// bytes), for a given number of engine threads.
struct OpRun {
  std::function<void(Graph&, Program&, std::vector<Tensor>& inputs, std::vector<Tensor>& outputs)>
      build;
  std::vector<Floats> input_values;

  std::vector<Floats> run(unsigned threads) const {
    Graph g(ArchPreset::get("tiny"));
    Program p;
    std::vector<Tensor> inputs, outputs;
    build(g, p, inputs, outputs);
    for (const Tensor& t : inputs) g.set_host_access(t);
    for (const Tensor& t : outputs) g.set_host_access(t);
    Engine e(g, {{"p", p}}, {.threads = threads});
    for (std::size_t i = 0; i < inputs.size(); ++i)
      e.write(inputs[i], std::as_bytes(std::span(input_values.at(i))));
    e.run("p");
    EXPECT_GT(e.cycles().compute, 0u);
    std::vector<Floats> out;
    for (const Tensor& t : outputs) {
      const auto bytes = e.read(t);
      Floats v(bytes.size() / sizeof(float));
      std::memcpy(v.data(), bytes.data(), bytes.size());
      out.push_back(std::move(v));
    }
    return out;
  }
  // Runs with 1 and 2 threads, requires identical bits, returns the outputs.
  std::vector<Floats> run_checked() const {
    const auto one = run(1), two = run(2);
    EXPECT_EQ(one.size(), two.size());
    for (std::size_t i = 0; i < one.size() && i < two.size(); ++i)
      EXPECT_EQ(0, std::memcmp(one[i].data(), two[i].data(), one[i].size() * sizeof(float)))
          << "output " << i << " differs between 1 and 2 engine threads";
    return one;
  }
};

void expect_near_all(const Floats& got, const std::vector<double>& want, double tol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " at " << i;
}

std::size_t product(const std::vector<std::size_t>& s) {
  std::size_t p = 1;
  for (auto d : s) p *= d;
  return p;
}

// A variable spread over the tiles: grain, first tile and tile count pick awkward layouts.
struct Layout {
  std::size_t grain = 1;
  unsigned first_tile = 0, tile_count = 0;
};

Tensor input(Graph& g, std::vector<std::size_t> shape, const std::string& name, Layout l) {
  Tensor t = g.add_variable(DType::f32, std::move(shape), name);
  g.map_linearly(t, l.grain, l.first_tile, l.tile_count);
  return t;
}

// ---- CPU references (double precision) ----

std::vector<double> ref_softmax(const Floats& x, std::size_t n) {
  std::vector<double> y(x.size());
  for (std::size_t r = 0; r * n < x.size(); ++r) {
    double mx = -INFINITY, s = 0;
    for (std::size_t c = 0; c < n; ++c) mx = std::max<double>(mx, x[r * n + c]);
    for (std::size_t c = 0; c < n; ++c) s += std::exp(x[r * n + c] - mx);
    for (std::size_t c = 0; c < n; ++c) y[r * n + c] = std::exp(x[r * n + c] - mx) / s;
  }
  return y;
}

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

// ---- softmax ----

struct SoftmaxCase {
  std::vector<std::size_t> shape;
  Layout layout;
};

class SoftmaxTest : public ::testing::TestWithParam<SoftmaxCase> {};

TEST_P(SoftmaxTest, ForwardAndGradientMatchReference) {
  const auto& [shape, layout] = GetParam();
  const std::size_t total = product(shape), n = shape.back();
  OpRun op;
  op.input_values = {random_floats(total, 1, -4.f, 4.f), random_floats(total, 2)};
  op.build = [&](Graph& g, Program& p, auto& in, auto& out) {
    Tensor x = input(g, shape, "x", layout);
    // dy laid out differently from y: softmax_grad must rearrange it
    Tensor dy = input(g, shape, "dy", {3, 5, 7});
    Tensor y = ops::softmax(g, p, x, "softmax");
    Tensor dx = ops::softmax_grad(g, p, dy, y, "softmax_grad");
    in = {x, dy};
    out = {y, dx};
  };
  const auto out = op.run_checked();
  const auto y = ref_softmax(op.input_values[0], n);
  expect_near_all(out[0], y, 1e-5, "softmax");
  std::vector<double> dx(total);
  const Floats& dy = op.input_values[1];
  for (std::size_t r = 0; r * n < total; ++r) {
    double dot = 0;
    for (std::size_t c = 0; c < n; ++c) dot += dy[r * n + c] * double(out[0][r * n + c]);
    for (std::size_t c = 0; c < n; ++c) dx[r * n + c] = out[0][r * n + c] * (dy[r * n + c] - dot);
  }
  expect_near_all(out[1], dx, 1e-5, "softmax_grad");
}

INSTANTIATE_TEST_SUITE_P(
    AwkwardShapes, SoftmaxTest,
    ::testing::Values(SoftmaxCase{{7, 13}, {1, 0, 0}},       // rows cut mid-way across tiles
                      SoftmaxCase{{1, 1}, {1, 0, 0}},        // one element
                      SoftmaxCase{{2, 3, 5}, {4, 9, 2}},     // rank 3 on two tiles
                      SoftmaxCase{{97, 3}, {1, 30, 1}},      // every row on one tile
                      SoftmaxCase{{2, 40009}, {1, 0, 0}}));  // a row > one tile's 128 KiB

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
