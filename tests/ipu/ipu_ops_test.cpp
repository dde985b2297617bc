// Op libraries against plain CPU references, on awkward shapes (primes, fewer rows than tiles,
// more data than one tile holds).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "ipu_process/engine.hpp"
#include "ipu_process/ops/elementwise.hpp"
#include "ipu_process/ops/loss.hpp"
#include "ipu_process/ops/matmul.hpp"
#include "ipu_process/ops/reduce.hpp"
#include "tests/ipu/device_data.hpp"

namespace ipupod::ipu {
namespace {

struct MatMulCase {
  std::size_t m, k, n;
  bool ta, tb;
  const char* arch;
};

class MatMulTest : public ::testing::TestWithParam<MatMulCase> {};

TEST_P(MatMulTest, MatchesReference) {
  const auto [m, k, n, ta, tb, arch_name] = GetParam();
  Graph g(ArchPreset::get(arch_name));
  Tensor a = g.add_variable(DType::f32, ta ? std::vector{k, m} : std::vector{m, k}, "a");
  Tensor b = g.add_variable(DType::f32, tb ? std::vector{n, k} : std::vector{k, n}, "b");
  g.map_linearly(a, 3);
  g.map_linearly(b, 5, 2);
  Program p;
  Tensor c = ops::matmul(g, p, a, b, ta, tb, "c");
  for (const Tensor& t : {a, b, c}) g.set_host_access(t);
  Engine e(g, {{"p", p}});
  const auto av = random_floats(m * k, 1), bv = random_floats(k * n, 2);
  write_floats(e, a, av);
  write_floats(e, b, bv);
  e.run("p");
  const auto cv = read_floats(e, c);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double ref = 0;
      for (std::size_t p2 = 0; p2 < k; ++p2)
        ref += double(ta ? av[p2 * m + i] : av[i * k + p2]) *
               double(tb ? bv[j * k + p2] : bv[p2 * n + j]);
      ASSERT_NEAR(cv[i * n + j], ref, 1e-4 * (1 + std::abs(ref))) << i << "," << j;
    }
  EXPECT_GT(e.cycles().compute, 0u);
  EXPECT_GT(e.cycles().exchange, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    AwkwardShapes, MatMulTest,
    ::testing::Values(
        MatMulCase{7, 13, 5, false, false, "tiny"}, MatMulCase{7, 13, 5, true, false, "tiny"},
        MatMulCase{7, 13, 5, false, true, "tiny"}, MatMulCase{7, 13, 5, true, true, "tiny"},
        MatMulCase{1, 1, 1, false, false, "tiny"}, MatMulCase{3, 257, 2, false, false, "tiny"},
        // more than a tile's 64 KiB of operands: the planner must spread it
        MatMulCase{61, 211, 67, true, false, "tiny"}, MatMulCase{31, 97, 53, false, true, "mk2"}));

TEST(Elementwise, AddBiasReluAndGradientsMatchReference) {
  Graph g(ArchPreset::get("tiny"));
  const std::size_t m = 9, n = 37;
  Tensor x = g.add_variable(DType::f32, {m, n}, "x");
  Tensor bias = g.add_variable(DType::f32, {n}, "bias");
  Tensor dy = g.add_variable(DType::f32, {m, n}, "dy");
  g.map_linearly(x, 1);
  g.set_tile_mapping(bias, 15);
  g.map_linearly(dy, 11, 3, 5);  // a different layout from x: relu_grad must rearrange it
  Program p;
  Tensor y = ops::add_bias(g, p, x, bias, "y");
  Tensor r = ops::relu(g, p, y, "r");
  Tensor dx = ops::relu_grad(g, p, dy, r, "dx");
  Tensor db = ops::column_sum(g, p, dy, "db");
  for (const Tensor& t : {x, bias, dy, r, dx, db}) g.set_host_access(t);
  Engine e(g, {{"p", p}});
  const auto xv = random_floats(m * n, 3), bv = random_floats(n, 4), dyv = random_floats(m * n, 5);
  write_floats(e, x, xv);
  write_floats(e, bias, bv);
  write_floats(e, dy, dyv);
  e.run("p");
  const auto rv = read_floats(e, r), dxv = read_floats(e, dx), dbv = read_floats(e, db);
  for (std::size_t i = 0; i < m * n; ++i) {
    const float yr = xv[i] + bv[i % n];
    EXPECT_EQ(rv[i], std::max(yr, 0.f));
    EXPECT_EQ(dxv[i], yr > 0 ? dyv[i] : 0.f);
  }
  for (std::size_t j = 0; j < n; ++j) {
    float s = 0;
    for (std::size_t i = 0; i < m; ++i) s += dyv[i * n + j];
    EXPECT_NEAR(dbv[j], s, 1e-5);
  }
}

TEST(Loss, SoftmaxCrossEntropyAndGradientMatchReference) {
  Graph g(ArchPreset::get("tiny"));
  const std::size_t m = 19, c = 7;
  Tensor logits = g.add_variable(DType::f32, {m, c}, "logits");
  Tensor labels = g.add_variable(DType::i32, {m}, "labels");
  Tensor dloss = g.add_variable(DType::f32, {}, "dloss");
  g.map_linearly(logits);
  g.map_linearly(labels);
  g.set_tile_mapping(dloss, 2);
  Program p;
  Tensor loss = ops::softmax_cross_entropy(g, p, logits, labels, "loss");
  Tensor grad = ops::softmax_cross_entropy_grad(g, p, logits, labels, dloss, "grad");
  for (const Tensor& t : {logits, labels, dloss, loss, grad}) g.set_host_access(t);
  Engine e(g, {{"p", p}});
  const auto lv = random_floats(m * c, 6);
  std::vector<std::int32_t> yv(m);
  for (std::size_t i = 0; i < m; ++i) yv[i] = static_cast<std::int32_t>((i * 5) % c);
  write_floats(e, logits, lv);
  e.write(labels, std::as_bytes(std::span(yv)));
  write_floats(e, dloss, {2.0f});
  e.run("p");
  double ref_loss = 0;
  const auto gv = read_floats(e, grad);
  for (std::size_t i = 0; i < m; ++i) {
    double mx = -1e30, s = 0;
    for (std::size_t j = 0; j < c; ++j) mx = std::max<double>(mx, lv[i * c + j]);
    for (std::size_t j = 0; j < c; ++j) s += std::exp(lv[i * c + j] - mx);
    ref_loss += mx + std::log(s) - lv[i * c + yv[i]];
    for (std::size_t j = 0; j < c; ++j) {
      const double sm = std::exp(lv[i * c + j] - mx) / s;
      const double ref = (sm - (static_cast<std::int32_t>(j) == yv[i])) * 2.0 / m;
      EXPECT_NEAR(gv[i * c + j], ref, 1e-6);
    }
  }
  EXPECT_NEAR(read_floats(e, loss)[0], ref_loss / m, 1e-5);
}

TEST(Elementwise, ScaledAddInPlaceAndZero) {
  Graph g(ArchPreset::get("tiny"));
  Tensor acc = g.add_variable(DType::f32, {1001}, "acc");
  Tensor x = g.add_variable(DType::f32, {1001}, "x");
  g.map_linearly(acc, 4);
  g.map_linearly(x, 9);
  Program p, z;
  ops::scaled_add_in_place(g, p, acc, x, -0.5f, "axpy");
  ops::zero(g, z, acc, "zero");
  g.set_host_access(acc);
  g.set_host_access(x);
  Engine e(g, {{"p", p}, {"z", z}});
  const auto xv = random_floats(1001, 7);
  write_floats(e, x, xv);
  e.run("p");
  e.run("p");
  const auto av = read_floats(e, acc);
  for (std::size_t i = 0; i < av.size(); ++i) EXPECT_FLOAT_EQ(av[i], -xv[i]);
  e.run("z");
  for (float v : read_floats(e, acc)) EXPECT_EQ(v, 0.f);
}

}  // namespace
}  // namespace ipupod::ipu
