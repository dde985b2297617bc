// The pooling op library against plain CPU references: max and average pooling and their
// gradients on odd sizes, padded windows (with and without the padding in the average),
// adaptive and global windows, ties in max pooling, and an input larger than one tile.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>

#include "ipu_process/engine.hpp"
#include "ipu_process/ops/pool.hpp"
#include "tests/ipu/device_data.hpp"

namespace ipupod::ipu {
namespace {

using Shape = std::vector<std::size_t>;

// Values on a coarse grid, so that windows often hold ties.
std::vector<float> grid_floats(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(-8, 8);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(d(gen)) * 0.25f;
  return v;
}

// Window of output index o along one axis, straight from PyTorch's definitions: the input
// indices it covers and the count an average divides by.
struct Span {
  std::size_t begin, end, divisor;
};

Span span_of(std::size_t o, std::size_t in, std::size_t out, const ops::PoolParams& p, bool rows) {
  const std::size_t k = rows ? p.kernel_h : p.kernel_w, s = rows ? p.stride_h : p.stride_w,
                    pad = rows ? p.pad_h : p.pad_w;
  if (p.adaptive) {
    const std::size_t b = std::size_t(std::floor(double(o * in) / double(out)));
    const std::size_t e = std::size_t(std::ceil(double((o + 1) * in) / double(out)));
    return {b, e, e - b};
  }
  // Padded coordinates: the window is [o*s, o*s + k) clipped to the padded input.
  const std::size_t pb = o * s, pe = std::min(o * s + k, in + 2 * pad);
  const std::size_t b = std::max(pb, pad) - pad, e = std::min(pe, in + pad) - pad;
  return {b, std::max(b, e), p.count_include_pad ? pe - pb : e - b};
}

struct PoolCase {
  const char* label;
  Shape x;
  ops::PoolParams p;
  bool max;
};

ops::PoolParams window(std::size_t k, std::size_t s, std::size_t pad, bool include_pad = true) {
  ops::PoolParams p;
  p.kernel_h = p.kernel_w = k;
  p.stride_h = p.stride_w = s;
  p.pad_h = p.pad_w = pad;
  p.count_include_pad = include_pad;
  return p;
}

ops::PoolParams adaptive(std::size_t oh, std::size_t ow) {
  ops::PoolParams p;
  p.adaptive = true;
  p.out_h = oh, p.out_w = ow;
  return p;
}

struct PoolRun {
  std::vector<float> y, dx;
};

PoolRun run_pool(const PoolCase& c, unsigned threads, const std::vector<float>& xv,
                 const std::vector<float>& dyv) {
  Graph g(ArchPreset::get("tiny"));
  const Shape ys = ops::pool2d_output_shape(c.x, c.p, "pool");
  Tensor x = g.add_variable(DType::f32, c.x, "x");
  Tensor dy = g.add_variable(DType::f32, ys, "dy");
  g.map_linearly(x, 5);
  g.map_linearly(dy, 3, 2);
  Program fwd, bwd;
  Tensor y =
      c.max ? ops::max_pool2d(g, fwd, x, c.p, "pool") : ops::avg_pool2d(g, fwd, x, c.p, "pool");
  Tensor dx = c.max ? ops::max_pool2d_grad(g, bwd, dy, x, c.p, "pool.dx")
                    : ops::avg_pool2d_grad(g, bwd, dy, c.x, c.p, "pool.dx");
  EXPECT_EQ(y.shape(), ys);
  EXPECT_EQ(dx.shape(), c.x);
  for (const Tensor& t : {x, dy, y, dx}) g.set_host_access(t);
  Engine e(g, {{"fwd", fwd}, {"bwd", bwd}}, {.threads = threads});
  e.write(x, std::as_bytes(std::span(xv)));
  e.write(dy, std::as_bytes(std::span(dyv)));
  e.run("fwd");
  e.run("bwd");
  EXPECT_GT(e.cycles().compute, 0u);
  return {read_floats(e, y), read_floats(e, dx)};
}

class PoolTest : public ::testing::TestWithParam<PoolCase> {};

TEST_P(PoolTest, ForwardAndGradientMatchReference) {
  const PoolCase& c = GetParam();
  const Shape ys = ops::pool2d_output_shape(c.x, c.p, "pool");
  const auto xv = grid_floats(count(c.x), 1), dyv = grid_floats(count(ys), 2);
  const PoolRun r = run_pool(c, 1, xv, dyv);
  std::vector<double> y(count(ys)), dx(count(c.x), 0.0);
  const std::size_t h = c.x[2], w = c.x[3];
  for (std::size_t pl = 0; pl < c.x[0] * c.x[1]; ++pl)
    for (std::size_t oy = 0; oy < ys[2]; ++oy)
      for (std::size_t ox = 0; ox < ys[3]; ++ox) {
        const Span sy = span_of(oy, h, ys[2], c.p, true), sx = span_of(ox, w, ys[3], c.p, false);
        const std::size_t o = (pl * ys[2] + oy) * ys[3] + ox;
        double best = -std::numeric_limits<double>::infinity(), sum = 0;
        std::size_t at = 0;
        for (std::size_t iy = sy.begin; iy < sy.end; ++iy)
          for (std::size_t ix = sx.begin; ix < sx.end; ++ix) {
            const std::size_t i = (pl * h + iy) * w + ix;
            sum += xv[i];
            if (xv[i] > best) best = xv[i], at = i;  // the first maximum
          }
        const double divisor = double(sy.divisor * sx.divisor);
        y[o] = c.max ? best : sum / divisor;
        if (c.max) {
          dx[at] += dyv[o];
        } else {
          for (std::size_t iy = sy.begin; iy < sy.end; ++iy)
            for (std::size_t ix = sx.begin; ix < sx.end; ++ix)
              dx[(pl * h + iy) * w + ix] += dyv[o] / divisor;
        }
      }
  for (std::size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(r.y[i], y[i], 1e-6) << "y " << i;
  for (std::size_t i = 0; i < dx.size(); ++i) ASSERT_NEAR(r.dx[i], dx[i], 1e-5) << "dx " << i;
}

INSTANTIATE_TEST_SUITE_P(
    AwkwardShapes, PoolTest,
    ::testing::Values(PoolCase{"max2_odd", {2, 3, 7, 9}, window(2, 2, 0), true},
                      PoolCase{"max3_stride2_pad1", {1, 5, 11, 8}, window(3, 2, 1), true},
                      PoolCase{"max_overlapping", {2, 2, 13, 6}, window(3, 1, 1), true},
                      PoolCase{"avg3_pad_included", {2, 3, 9, 7}, window(3, 2, 1, true), false},
                      PoolCase{"avg3_pad_excluded", {2, 3, 9, 7}, window(3, 2, 1, false), false},
                      PoolCase{"avg_stride_gaps", {1, 2, 11, 11}, window(2, 3, 0), false},
                      PoolCase{"adaptive_3x2", {2, 3, 7, 9}, adaptive(3, 2), false},
                      PoolCase{"adaptive_larger", {1, 2, 5, 3}, adaptive(7, 4), false},
                      PoolCase{"global_average", {3, 7, 6, 5}, adaptive(1, 1), false},
                      PoolCase{
                          "global_average_row_cut_blocks", {1, 20, 16, 16}, adaptive(1, 1), false},
                      PoolCase{"max2_row_cut_blocks", {1, 20, 16, 16}, window(2, 2, 0), true},
                      PoolCase{"single_plane", {1, 1, 4, 4}, window(2, 2, 0), true},
                      // 512 KiB on a 128 KiB-per-tile IPU
                      PoolCase{"larger_than_a_tile_max", {2, 16, 64, 64}, window(2, 2, 0), true},
                      PoolCase{"larger_than_a_tile_avg", {2, 16, 64, 64}, adaptive(1, 1), false}),
    [](const auto& info) { return std::string(info.param.label); });

// A pooling op whose blocks are several planes' first rows computes them in pieces (variable
// NAME/out) and moves them onto even runs of whole rows: its output has one interval per tile.
// Such cases are also among the reference cases above (the *_row_cut_blocks ones).
TEST(Pool, BlocksThatAreNotRunsOfTheOutputAreMovedOntoOneRunPerTile) {
  Graph g(ArchPreset::get("tiny"));
  Tensor dy = g.add_variable(DType::f32, {1, 20, 1, 1}, "dy");
  g.map_linearly(dy);
  Program p;
  // The global average's gradient: 20 planes of 16x16 on 32 tiles.
  const Tensor dx = ops::avg_pool2d_grad(g, p, dy, {1, 20, 16, 16}, adaptive(1, 1), "gap.dx");
  bool moved = false;
  for (const Variable& v : g.variables()) moved = moved || v.name == "gap.dx/out";
  ASSERT_TRUE(moved) << "the plan's blocks are runs of the output: pick another shape";
  const auto intervals = g.tile_mapping(dx);
  std::set<unsigned> tiles;
  for (const auto& iv : intervals) EXPECT_TRUE(tiles.insert(iv.tile).second) << iv.tile;
  EXPECT_LE(intervals.size(), g.tiles());
}

TEST(Pool, BitwiseIdenticalWithOneAndTwoThreads) {
  const PoolCase c{"", {2, 16, 33, 31}, window(3, 2, 1, false), false};
  const Shape ys = ops::pool2d_output_shape(c.x, c.p, "pool");
  const auto xv = grid_floats(count(c.x), 3), dyv = grid_floats(count(ys), 4);
  for (bool max : {true, false}) {
    PoolCase k = c;
    k.max = max;
    const PoolRun one = run_pool(k, 1, xv, dyv), two = run_pool(k, 2, xv, dyv);
    EXPECT_EQ(0, std::memcmp(one.y.data(), two.y.data(), one.y.size() * 4));
    EXPECT_EQ(0, std::memcmp(one.dx.data(), two.dx.data(), one.dx.size() * 4));
  }
}

TEST(Pool, BadInputsNameWhatIsWrong) {
  Graph g(ArchPreset::get("tiny"));
  Tensor x = g.add_variable(DType::f32, {1, 2, 5, 5}, "x");
  Program p;
  const auto message = [&](auto&& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      message([&] { ops::max_pool2d(g, p, x, window(3, 1, 2), "p1"); }).find("half the kernel"),
      std::string::npos);
  EXPECT_NE(message([&] { ops::avg_pool2d(g, p, x, window(7, 1, 0), "p2"); }).find("does not fit"),
            std::string::npos);
  EXPECT_NE(message([&] { ops::avg_pool2d(g, p, x, adaptive(0, 1), "p3"); }).find("at least 1x1"),
            std::string::npos);
  Tensor dy = g.add_variable(DType::f32, {1, 2, 3, 3}, "dy");
  EXPECT_NE(message([&] {
              ops::max_pool2d_grad(g, p, dy, x, window(2, 2, 0), "p4");
            }).find("must be [1,2,2,2]"),
            std::string::npos);
}

}  // namespace
}  // namespace ipupod::ipu
