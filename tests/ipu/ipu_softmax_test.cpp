// The softmax op library against a plain CPU reference written here, on awkward shapes (primes,
// rows cut across tiles, a row over one tile's memory) on the tiny IPU, each run with 1 and 2
// engine threads and required to give bitwise identical results.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ipu_process/ops/softmax.hpp"
#include "tests/ipu/op_run.hpp"

namespace ipupod::ipu {
namespace {

// ---- CPU reference (double precision) ----

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

}  // namespace
}  // namespace ipupod::ipu
