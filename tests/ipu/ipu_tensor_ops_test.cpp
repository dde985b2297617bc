// The general tensor op library against plain CPU references, on awkward shapes (primes,
// fewer elements than tiles, more data than one tile holds) and awkward layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "ipu_process/engine.hpp"
#include "ipu_process/ops/tensor_ops.hpp"
#include "tests/ipu/device_data.hpp"

namespace ipupod::ipu {
namespace {

using Shape = std::vector<std::size_t>;

std::vector<std::size_t> coords(std::size_t flat, const Shape& s) {
  std::vector<std::size_t> c(s.size());
  for (std::size_t d = s.size(); d-- > 0;) c[d] = flat % s[d], flat /= s[d];
  return c;
}

std::size_t flat_of(const std::vector<std::size_t>& c, const Shape& s) {
  std::size_t f = 0;
  for (std::size_t d = 0; d < s.size(); ++d) f = f * s[d] + c[d];
  return f;
}

// Index into `in` of output coordinates c under NumPy broadcasting.
std::size_t broadcast_index(const std::vector<std::size_t>& c, const Shape& in) {
  std::vector<std::size_t> ci(in.size());
  const std::size_t lead = c.size() - in.size();
  for (std::size_t d = 0; d < in.size(); ++d) ci[d] = in[d] == 1 ? 0 : c[lead + d];
  return flat_of(ci, in);
}

// A device graph on the tiny architecture with host-accessible inputs laid out awkwardly.
struct Fixture {
  Graph g{ArchPreset::get("tiny")};
  Program prog;
  std::vector<std::pair<Tensor, std::vector<float>>> inputs;

  Tensor input(const Shape& shape, unsigned seed, std::size_t grain = 3, float lo = -1.f,
               float hi = 1.f) {
    Tensor t = g.add_variable(DType::f32, shape, "in" + std::to_string(inputs.size()));
    g.map_linearly(t, grain, static_cast<unsigned>(inputs.size() * 5 % g.tiles()));
    g.set_host_access(t);
    inputs.emplace_back(t, random_floats(count(shape), seed, lo, hi));
    return t;
  }
  // Runs the program on an engine with `threads` and returns the outputs' values.
  std::vector<std::vector<float>> run(const std::vector<Tensor>& outputs, unsigned threads = 1,
                                      unsigned runs = 1) {
    for (const auto& t : outputs) g.set_host_access(t);
    Engine e(g, {{"p", prog}}, {.threads = threads});
    for (const auto& [t, v] : inputs) e.write(t, std::as_bytes(std::span(v)));
    for (unsigned r = 0; r < runs; ++r) e.run("p");
    std::vector<std::vector<float>> out;
    for (const auto& t : outputs) {
      const auto bytes = e.read(t);
      out.emplace_back(bytes.size() / 4);
      std::memcpy(out.back().data(), bytes.data(), bytes.size());
    }
    return out;
  }
};

void expect_near_all(const std::vector<float>& got, const std::vector<double>& want, double tol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " at " << i;
}

struct BinaryCase {
  Shape a, b;
};

class BinaryTest : public ::testing::TestWithParam<BinaryCase> {};

TEST_P(BinaryTest, BroadcastsLikeNumPy) {
  const auto& [sa, sb] = GetParam();
  const std::pair<ops::BinaryOp, std::function<double(double, double)>> fns[] = {
      {ops::BinaryOp::add, [](double x, double y) { return x + y; }},
      {ops::BinaryOp::sub, [](double x, double y) { return x - y; }},
      {ops::BinaryOp::mul, [](double x, double y) { return x * y; }},
      {ops::BinaryOp::div, [](double x, double y) { return x / y; }}};
  for (const auto& [op, fn] : fns) {
    Fixture f;
    Tensor a = f.input(sa, 1);
    Tensor b = f.input(sb, 2, 5, 0.5f, 2.f);  // away from zero for division
    Tensor c = ops::binary(f.g, f.prog, op, a, b, "c");
    Shape out(std::max(sa.size(), sb.size()));
    for (std::size_t i = 0; i < out.size(); ++i) {
      const std::size_t da = i < sa.size() ? sa[sa.size() - 1 - i] : 1;
      const std::size_t db = i < sb.size() ? sb[sb.size() - 1 - i] : 1;
      out[out.size() - 1 - i] = std::max(da, db);
    }
    ASSERT_EQ(c.shape(), out);
    const auto got = f.run({c})[0];
    std::vector<double> want(count(out));
    for (std::size_t o = 0; o < want.size(); ++o) {
      const auto co = coords(o, out);
      want[o] = fn(f.inputs[0].second[broadcast_index(co, sa)],
                   f.inputs[1].second[broadcast_index(co, sb)]);
    }
    expect_near_all(got, want, 1e-6, "binary op " + std::to_string(static_cast<int>(op)));
  }
}

INSTANTIATE_TEST_SUITE_P(
    AwkwardShapes, BinaryTest,
    ::testing::Values(BinaryCase{{3, 5, 7, 2}, {5, 1, 2}},  // channel-style broadcast of b
                      BinaryCase{{1, 7}, {11, 1}},          // neither operand has the result shape
                      BinaryCase{{13}, {13}}, BinaryCase{{}, {4, 3}},  // scalar operand
                      BinaryCase{{2, 3, 1, 1}, {2, 3, 17, 19}},
                      BinaryCase{{64, 1031}, {1031}}));  // more than one tile holds

// An operand laid out unlike the output is copied onto each tile only where that tile's pieces
// read it: a piece that crosses a sample or channel boundary reads two stretches, not
// everything between them, so no operand costs more copied elements than the output has.
TEST(BinaryTest, CopiesOnlyTheOperandRangesThePiecesRead) {
  Fixture f;
  const Shape shape{3, 5, 16, 16};
  Tensor a = f.input(shape, 1, 7), b = f.input(shape, 2, 11);
  Tensor c = ops::binary(f.g, f.prog, ops::BinaryOp::add, a, b, "c");
  std::size_t copied[2] = {0, 0};
  for (const Variable& v : f.g.variables())
    for (std::size_t i = 0; i < 2; ++i)
      if (v.name.rfind("c/in" + std::to_string(i), 0) == 0) copied[i] += v.elements;
  EXPECT_GT(copied[0] + copied[1], 0u) << "the layouts differ: some elements must move";
  EXPECT_LE(copied[0], c.elements());
  EXPECT_LE(copied[1], c.elements());
  const auto got = f.run({c})[0];
  std::vector<double> want(count(shape));
  for (std::size_t i = 0; i < want.size(); ++i)
    want[i] = double(f.inputs[0].second[i]) + f.inputs[1].second[i];
  expect_near_all(got, want, 1e-6, "a + b");
}

TEST(BinaryTest, RejectsShapesThatDoNotBroadcast) {
  Fixture f;
  Tensor a = f.input({3, 4}, 1), b = f.input({5}, 2);
  EXPECT_THROW(ops::binary(f.g, f.prog, ops::BinaryOp::add, a, b, "bad"), std::invalid_argument);
}

struct ReduceCase {
  Shape in;
  std::vector<std::size_t> axes;
  bool keepdims;
};

class ReduceTest : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(ReduceTest, MatchesReference) {
  const auto& [in, axes, keepdims] = GetParam();
  Fixture f;
  Tensor x = f.input(in, 3);
  Tensor y = ops::reduce_sum(f.g, f.prog, x, axes, keepdims, 0.5f, "y");
  Shape kept = in, out;
  for (auto a : axes) kept[a] = 1;
  for (std::size_t d = 0; d < in.size(); ++d) {
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!reduced || keepdims) out.push_back(kept[d]);
  }
  ASSERT_EQ(y.shape(), out);
  std::vector<double> want(count(kept), 0.0);
  const auto& xv = f.inputs[0].second;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    auto c = coords(i, in);
    for (auto a : axes) c[a] = 0;
    want[flat_of(c, kept)] += 0.5 * xv[i];
  }
  const auto one = f.run({y}, 1)[0];
  expect_near_all(one, want, 1e-5, "reduce_sum");
  // The summation order is fixed by the graph, not by the threads that run it.
  const auto two = f.run({y}, 2)[0];
  EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * 4));
}

INSTANTIATE_TEST_SUITE_P(
    AwkwardShapes, ReduceTest,
    ::testing::Values(ReduceCase{{5, 3, 7, 11}, {0, 2, 3}, false},
                      ReduceCase{{5, 3, 7, 11}, {0, 2, 3}, true}, ReduceCase{{13, 257}, {1}, false},
                      ReduceCase{{13, 257}, {0}, true}, ReduceCase{{97}, {0}, false},
                      ReduceCase{{3, 5}, {}, false}, ReduceCase{{64, 1031}, {0, 1}, false}));

TEST(ShapeOpsTest, PermuteMatchesReference) {
  const std::pair<Shape, std::vector<std::size_t>> cases[] = {{{2, 3, 5, 7}, {0, 2, 3, 1}},
                                                              {{2, 3, 5, 7}, {3, 2, 1, 0}},
                                                              {{61, 67}, {1, 0}},
                                                              // The last axes kept: moved as rows.
                                                              {{2, 3, 5, 7}, {2, 0, 1, 3}},
                                                              {{3, 2, 4, 5, 6}, {2, 0, 3, 1, 4}},
                                                              {{4, 3, 2, 5, 6}, {1, 0, 2, 3, 4}},
                                                              {{2, 3, 5, 7}, {0, 1, 2, 3}},
                                                              {{1, 5, 1}, {2, 1, 0}}};
  for (const auto& [in, perm] : cases) {
    Fixture f;
    Tensor x = f.input(in, 4);
    Tensor y = ops::permute(f.g, f.prog, x, perm, "y");
    Shape out;
    for (auto p : perm) out.push_back(in[p]);
    ASSERT_EQ(y.shape(), out);
    const auto got = f.run({y})[0];
    std::vector<double> want(count(out));
    for (std::size_t o = 0; o < want.size(); ++o) {
      const auto co = coords(o, out);
      std::vector<std::size_t> ci(in.size());
      for (std::size_t d = 0; d < perm.size(); ++d) ci[perm[d]] = co[d];
      want[o] = f.inputs[0].second[flat_of(ci, in)];
    }
    expect_near_all(got, want, 0, "permute");
  }
}

// Permutes are copies of the permuted input (Poplar copies a dimShuffle'd tensor): each tile
// receives the elements it holds and no more, as rows where the last axes stay (an attention's
// heads moved in front of its tokens: [n, t, 3, h, dh] to [3, n, h, t, dh]), else one by one (a
// channels-last image). As MapAffines, their pieces brought every input element between the
// first and last they read onto their tile: nearly the whole input on each.
TEST(ShapeOpsTest, APermuteMovesOnlyTheElementsEachTileHolds) {
  Fixture f;
  const Shape in = {2, 64, 3, 4, 16};
  Tensor x = f.input(in, 6);
  const std::vector<std::vector<std::size_t>> perms = {
      {2, 0, 3, 1, 4},   // [n, t, 3, h, dh] to [3, n, h, t, dh]
      {0, 2, 1, 3, 4},   // the kept axes already [3, h, dh]
      {0, 2, 3, 4, 1}};  // the tokens last: one element at a time
  std::vector<Tensor> ys;
  for (std::size_t k = 0; k < perms.size(); ++k)
    ys.push_back(ops::permute(f.g, f.prog, x, perms[k], "y" + std::to_string(k)));
  for (const auto& v : f.g.variables())
    EXPECT_TRUE(v.name == "in0" || v.name == "y0" || v.name == "y1" || v.name == "y2")
        << v.name << ": a tile's copy of the input's spans";
  EXPECT_TRUE(f.g.compute_sets().empty());
  const auto got = f.run(ys);
  const auto& xv = f.inputs[0].second;
  for (std::size_t k = 0; k < perms.size(); ++k)
    for (std::size_t i = 0; i < xv.size(); ++i) {
      const auto c = coords(i, in);
      std::vector<std::size_t> o;
      for (std::size_t p : perms[k]) o.push_back(c[p]);
      ASSERT_EQ(got[k][flat_of(o, ys[k].shape())], xv[i]) << k << ": " << i;
    }
}

TEST(ShapeOpsTest, SliceAndItsGradientAndConcat) {
  Fixture f;
  const Shape in = {3, 7, 11};
  Tensor x = f.input(in, 5);
  Tensor s = ops::slice(f.g, f.prog, x, 1, 2, 5, "s");
  Tensor back = ops::slice_grad(f.g, f.prog, s, in, 1, 2, 5, "back");
  Tensor head = ops::slice(f.g, f.prog, x, 1, 0, 2, "head");
  Tensor tail = ops::slice(f.g, f.prog, x, 1, 5, 7, "tail");
  Tensor joined = ops::concat(f.g, f.prog, {head, s, tail}, 1, "joined");
  Tensor last = ops::slice(f.g, f.prog, x, 2, 10, 11, "last");
  const auto got = f.run({s, back, joined, last});
  const auto& xv = f.inputs[0].second;
  std::vector<double> want_s, want_back(xv.size(), 0.0), want_last;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const auto c = coords(i, in);
    if (c[1] >= 2 && c[1] < 5) want_s.push_back(xv[i]), want_back[i] = xv[i];
    if (c[2] == 10) want_last.push_back(xv[i]);
  }
  expect_near_all(got[0], want_s, 0, "slice");
  expect_near_all(got[1], want_back, 0, "slice_grad");
  expect_near_all(got[2], std::vector<double>(xv.begin(), xv.end()), 0, "concat of the slices");
  expect_near_all(got[3], want_last, 0, "slice of the last axis");
  EXPECT_THROW(ops::slice(f.g, f.prog, x, 1, 5, 8, "bad"), std::invalid_argument);
  EXPECT_THROW(ops::concat(f.g, f.prog, {x, s}, 2, "bad"), std::invalid_argument);
}

TEST(ShapeOpsTest, BroadcastToScales) {
  Fixture f;
  Tensor x = f.input({3, 1}, 6);
  Tensor y = ops::broadcast_to(f.g, f.prog, x, {4, 3, 5}, 2.f, "y");
  const auto got = f.run({y})[0];
  std::vector<double> want(60);
  for (std::size_t o = 0; o < 60; ++o) want[o] = 2.0 * f.inputs[0].second[coords(o, {4, 3, 5})[1]];
  expect_near_all(got, want, 0, "broadcast_to");
}

TEST(UnaryTest, FunctionsAndGradientsMatchReference) {
  using ops::UnaryOp;
  struct Fn {
    UnaryOp op;
    std::function<double(double)> f, df;
  };
  const double alpha = 0.1;
  const auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  const Fn fns[] = {
      {UnaryOp::gelu, [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); },
       [](double x) {
         return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) +
                x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
       }},
      {UnaryOp::silu, [&](double x) { return x * sig(x); },
       [&](double x) { return sig(x) * (1 + x * (1 - sig(x))); }},
      {UnaryOp::sigmoid, sig, [&](double x) { return sig(x) * (1 - sig(x)); }},
      {UnaryOp::tanh, [](double x) { return std::tanh(x); },
       [](double x) { return 1 - std::tanh(x) * std::tanh(x); }},
      {UnaryOp::leaky_relu, [&](double x) { return x > 0 ? x : alpha * x; },
       [&](double x) { return x > 0 ? 1 : alpha; }},
      {UnaryOp::sqrt, [](double x) { return std::sqrt(x); },
       [](double x) { return 0.5 / std::sqrt(x); }},
      {UnaryOp::rsqrt, [](double x) { return 1 / std::sqrt(x); },
       [](double x) { return -0.5 / (x * std::sqrt(x)); }},
      {UnaryOp::exp, [](double x) { return std::exp(x); }, [](double x) { return std::exp(x); }},
      {UnaryOp::log, [](double x) { return std::log(x); }, [](double x) { return 1 / x; }},
      {UnaryOp::square, [](double x) { return x * x; }, [](double x) { return 2 * x; }},
      {UnaryOp::abs, [](double x) { return std::abs(x); },
       [](double x) { return x > 0 ? 1.0 : -1.0; }},
      {UnaryOp::neg, [](double x) { return -x; }, [](double) { return -1.0; }},
      {UnaryOp::erf, [](double x) { return std::erf(x); },
       [](double x) { return 2 / std::sqrt(M_PI) * std::exp(-x * x); }}};
  for (const auto& fn : fns) {
    const bool positive =
        fn.op == UnaryOp::sqrt || fn.op == UnaryOp::rsqrt || fn.op == UnaryOp::log;
    Fixture f;
    Tensor x = f.input({7, 131}, 7, 3, positive ? 0.1f : -3.f, 3.f);
    Tensor dy = f.input({7, 131}, 8, 11);
    Tensor y = ops::unary(f.g, f.prog, fn.op, x, static_cast<float>(alpha), "y");
    Tensor dx = ops::unary_grad(f.g, f.prog, fn.op, dy, x, static_cast<float>(alpha), "dx");
    const auto got = f.run({y, dx});
    std::vector<double> want_y, want_dx;
    for (std::size_t i = 0; i < 7 * 131; ++i) {
      const double xv = f.inputs[0].second[i];
      want_y.push_back(fn.f(xv));
      want_dx.push_back(f.inputs[1].second[i] * fn.df(xv));
    }
    const std::string what = "unary function " + std::to_string(static_cast<int>(fn.op));
    expect_near_all(got[0], want_y, 1e-5, what);
    expect_near_all(got[1], want_dx, 1e-4, what + " gradient");
  }
}

TEST(RandomMaskTest, KeepsTheRightFractionAndDrawsAnewEachRun) {
  Fixture f;
  const double p = 0.3;
  Tensor m = ops::random_mask(f.g, f.prog, {50, 101}, p, 0x123456789abcull, "mask");
  const auto once = f.run({m}, 1, 1)[0];
  const auto twice = f.run({m}, 1, 2)[0];
  const auto twice_two_threads = f.run({m}, 2, 2)[0];
  std::size_t dropped = 0;
  const float keep = static_cast<float>(1 / (1 - p));
  for (float v : once) {
    ASSERT_TRUE(v == 0.f || v == keep) << v;
    dropped += v == 0.f;
  }
  const double fraction = static_cast<double>(dropped) / static_cast<double>(once.size());
  EXPECT_NEAR(fraction, p, 0.03);  // 5050 draws: the standard deviation is 0.0064
  EXPECT_NE(0, std::memcmp(once.data(), twice.data(), once.size() * 4)) << "second run repeated";
  EXPECT_EQ(0, std::memcmp(twice.data(), twice_two_threads.data(), twice.size() * 4));
  EXPECT_THROW(ops::random_mask(f.g, f.prog, {3}, 1.0, 1, "bad"), std::invalid_argument);
}

TEST(TensorOpsCycles, MoreWorkCostsMoreCycles) {
  const auto cycles_for = [](std::size_t rows) {
    Fixture f;
    Tensor x = f.input({rows, 64}, 9, 64 * rows);  // all on one tile
    ops::unary(f.g, f.prog, ops::UnaryOp::exp, x, 0.f, "y");
    Engine e(f.g, {{"p", f.prog}});
    e.run("p");
    return e.cycles().compute;
  };
  const auto small = cycles_for(64), large = cycles_for(128);
  EXPECT_GT(large, small * 17 / 10);
  EXPECT_LT(large, small * 23 / 10);
}

}  // namespace
}  // namespace ipupod::ipu
