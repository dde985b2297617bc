// The convolution op library against plain CPU references on awkward shapes (primes, odd
// sizes with stride 2, asymmetric padding, dilation, groups and depthwise, outputs smaller
// than the tile count, layers larger than one tile), plus out-of-memory, thread-count and
// cycle behaviour.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "ipu_process/engine.hpp"
#include "ipu_process/ops/conv.hpp"
#include "tests/ipu/device_data.hpp"

namespace ipupod::ipu {
namespace {

using Shape = std::vector<std::size_t>;

// A reference value and the sum of the magnitudes of its terms (the scale of rounding error).
struct Ref {
  std::vector<double> value, magnitude;
  explicit Ref(std::size_t n) : value(n, 0.0), magnitude(n, 0.0) {}
  void add(std::size_t i, double a, double b) {
    value[i] += a * b;
    magnitude[i] += std::abs(a * b);
  }
};

void expect_close(const std::vector<float>& got, const Ref& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.value.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], ref.value[i], 1e-5 * ref.magnitude[i] + 1e-6) << what << " element " << i;
}

// Calls f(y index, w index, x index) for every tap of a convolution that lands inside the
// input, straight from the definition.
template <class F>
void for_each_tap(const Shape& x, const Shape& w, const Shape& y, const ops::ConvParams& p, F&& f) {
  const std::size_t cig = w[1], cog = w[0] / p.groups;
  for (std::size_t b = 0; b < y[0]; ++b)
    for (std::size_t oc = 0; oc < y[1]; ++oc)
      for (std::size_t oy = 0; oy < y[2]; ++oy)
        for (std::size_t ox = 0; ox < y[3]; ++ox)
          for (std::size_t c = 0; c < cig; ++c)
            for (std::size_t i = 0; i < w[2]; ++i)
              for (std::size_t j = 0; j < w[3]; ++j) {
                const long iy = long(oy * p.stride_h + i * p.dilation_h) - long(p.pad_top);
                const long ix = long(ox * p.stride_w + j * p.dilation_w) - long(p.pad_left);
                if (iy < 0 || ix < 0 || iy >= long(x[2]) || ix >= long(x[3])) continue;
                const std::size_t ic = oc / cog * cig + c;
                f(((b * y[1] + oc) * y[2] + oy) * y[3] + ox, ((oc * cig + c) * w[2] + i) * w[3] + j,
                  ((b * x[1] + ic) * x[2] + std::size_t(iy)) * x[3] + std::size_t(ix));
              }
}

struct ConvCase {
  const char* label;
  Shape x, w;
  ops::ConvParams p;
};

ops::ConvParams geometry(std::size_t stride_h, std::size_t stride_w, std::size_t top,
                         std::size_t bottom, std::size_t left, std::size_t right,
                         std::size_t dilation = 1, std::size_t groups = 1) {
  ops::ConvParams p;
  p.stride_h = stride_h, p.stride_w = stride_w;
  p.pad_top = top, p.pad_bottom = bottom, p.pad_left = left, p.pad_right = right;
  p.dilation_h = p.dilation_w = dilation;
  p.groups = groups;
  return p;
}

struct ConvRun {
  std::vector<float> y, dx, dw;
  CycleBreakdown forward;
  MemoryReport memory;
};

// Runs the forward pass and both gradients of one convolution on the named architecture.
ConvRun run_conv(const ConvCase& c, const char* arch, unsigned threads,
                 const std::vector<float>& xv, const std::vector<float>& wv,
                 const std::vector<float>& dyv) {
  Graph g(ArchPreset::get(arch));
  Tensor x = g.add_variable(DType::f32, c.x, "x");
  Tensor w = g.add_variable(DType::f32, c.w, "w", MemoryCategory::weight);
  const Shape ys = ops::conv2d_output_shape(c.x, c.w, c.p, "conv");
  Tensor dy = g.add_variable(DType::f32, ys, "dy");
  g.map_linearly(x, 7);
  g.map_linearly(w, 5, 3);
  g.map_linearly(dy, 3, 1);
  Program fwd, gi, gw;
  Tensor y = ops::conv2d(g, fwd, x, w, c.p, "conv");
  Tensor dx = ops::conv2d_grad_input(g, gi, dy, w, c.x, c.p, "conv.dx");
  Tensor dw = ops::conv2d_grad_weight(g, gw, dy, x, c.w, c.p, "conv.dw");
  EXPECT_EQ(y.shape(), ys);
  for (const Tensor& t : {x, dy, y, dx, dw}) g.set_host_access(t);
  Engine e(g, {{"fwd", fwd}, {"gi", gi}, {"gw", gw}}, {.threads = threads});
  e.write(x, std::as_bytes(std::span(xv)));
  e.write(w, std::as_bytes(std::span(wv)));
  e.write(dy, std::as_bytes(std::span(dyv)));
  ConvRun r;
  e.run("fwd");
  r.forward = e.cycles();
  e.run("gi");
  e.run("gw");
  r.y = read_floats(e, y);
  r.dx = read_floats(e, dx);
  r.dw = read_floats(e, dw);
  r.memory = e.memory();
  return r;
}

class ConvTest : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvTest, ForwardAndGradientsMatchReference) {
  const ConvCase& c = GetParam();
  const Shape ys = ops::conv2d_output_shape(c.x, c.w, c.p, "conv");
  const auto xv = random_floats(count(c.x), 1), wv = random_floats(count(c.w), 2),
             dyv = random_floats(count(ys), 3);
  const ConvRun r = run_conv(c, "tiny", 1, xv, wv, dyv);
  Ref y(count(ys)), dx(count(c.x)), dw(count(c.w));
  for_each_tap(c.x, c.w, ys, c.p, [&](std::size_t yi, std::size_t wi, std::size_t xi) {
    y.add(yi, wv[wi], xv[xi]);
    dx.add(xi, wv[wi], dyv[yi]);
    dw.add(wi, dyv[yi], xv[xi]);
  });
  expect_close(r.y, y, "y");
  expect_close(r.dx, dx, "dx");
  expect_close(r.dw, dw, "dw");
  EXPECT_GT(r.forward.compute, 0u);
  EXPECT_GT(r.forward.exchange, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    AwkwardShapes, ConvTest,
    ::testing::Values(
        ConvCase{"primes", {2, 3, 7, 11}, {5, 3, 3, 3}, geometry(1, 1, 1, 1, 1, 1)},
        ConvCase{"stride2_odd_asymmetric", {1, 2, 9, 13}, {3, 2, 3, 2}, geometry(2, 2, 1, 0, 2, 1)},
        ConvCase{"dilation2", {2, 2, 11, 10}, {4, 2, 3, 3}, geometry(1, 1, 2, 2, 2, 2, 2)},
        ConvCase{"groups2", {2, 4, 7, 9}, {6, 2, 3, 3}, geometry(1, 2, 1, 1, 1, 1, 1, 2)},
        ConvCase{"depthwise", {2, 5, 9, 8}, {5, 1, 5, 5}, geometry(2, 2, 2, 2, 2, 2, 1, 5)},
        ConvCase{
            "depthwise_multiplier", {1, 3, 6, 5}, {6, 1, 3, 3}, geometry(1, 1, 1, 1, 1, 1, 1, 3)},
        ConvCase{"output_1x1", {1, 1, 3, 3}, {1, 1, 3, 3}, geometry(1, 1, 0, 0, 0, 0)},
        ConvCase{"stride3_gaps", {2, 2, 10, 11}, {3, 2, 2, 2}, geometry(3, 3, 0, 0, 0, 0)},
        ConvCase{"padding_only_rows", {1, 2, 5, 4}, {2, 2, 2, 2}, geometry(1, 1, 3, 0, 0, 2)},
        ConvCase{"pointwise", {3, 7, 5, 5}, {11, 7, 1, 1}, geometry(1, 1, 0, 0, 0, 0)},
        // blocks of 16 channels x 1 row on the tiny IPU: computed in pieces, moved (remapped)
        ConvCase{"row_blocks_remapped", {1, 4, 32, 32}, {16, 4, 3, 3}, geometry(1, 1, 1, 1, 1, 1)},
        // 256 KiB of input and of output on a 128 KiB-per-tile IPU: must spread over tiles
        ConvCase{"larger_than_a_tile", {2, 8, 64, 64}, {8, 8, 3, 3}, geometry(1, 1, 1, 1, 1, 1)}),
    [](const auto& info) { return std::string(info.param.label); });

TEST(Conv, LargeLayerSpreadsOverTilesWithinMemory) {
  const ConvCase c{"big", {2, 8, 64, 64}, {8, 8, 3, 3}, geometry(1, 1, 1, 1, 1, 1)};
  const ArchPreset& tiny = ArchPreset::get("tiny");
  const ops::ConvPlan plan = ops::plan_conv2d(tiny, c.x, c.w, c.p);
  EXPECT_TRUE(plan.fits);
  EXPECT_GT(plan.tiles(), 4u);
  EXPECT_LE(plan.tiles(), tiny.tiles);
  const Shape ys = ops::conv2d_output_shape(c.x, c.w, c.p, "conv");
  const ConvRun r = run_conv(c, "tiny", 1, random_floats(count(c.x), 4),
                             random_floats(count(c.w), 5), random_floats(count(ys), 6));
  EXPECT_LE(r.memory.busiest().total(), tiny.bytes_per_tile);
}

// A plan whose blocks cut several channels' rows computes them in pieces and moves them onto
// even runs of whole rows: the output (and the input gradient) then has one interval per tile,
// not one per channel row of each block, and the ops after it inherit that.
TEST(Conv, BlocksThatAreNotRunsOfTheOutputAreMovedOntoOneRunPerTile) {
  const ConvCase c{"", {1, 4, 32, 32}, {16, 4, 3, 3}, geometry(1, 1, 1, 1, 1, 1)};
  const ArchPreset& tiny = ArchPreset::get("tiny");
  const ops::ConvPlan plan = ops::plan_conv2d(tiny, c.x, c.w, c.p);
  ASSERT_TRUE(plan.remap) << plan.channel_block << " channels x " << plan.row_block << " rows";
  ASSERT_GT(plan.channel_block * plan.row_blocks, 1u);
  Graph g(tiny);
  Tensor x = g.add_variable(DType::f32, c.x, "x");
  Tensor w = g.add_variable(DType::f32, c.w, "w", MemoryCategory::weight);
  g.map_linearly(x);
  g.map_linearly(w);
  Program p;
  const Tensor y = ops::conv2d(g, p, x, w, c.p, "conv");
  const auto intervals = g.tile_mapping(y);
  EXPECT_LE(intervals.size(), plan.tiles());
  std::set<unsigned> tiles;
  for (const auto& iv : intervals) EXPECT_TRUE(tiles.insert(iv.tile).second) << iv.tile;
  // Mapped where each block is computed, it had a run per channel row of every block.
  EXPECT_LT(intervals.size(), c.w[0] * plan.row_blocks);
}

TEST(Conv, BitwiseIdenticalWithOneAndTwoThreads) {
  const ConvCase c{"big", {2, 8, 64, 64}, {8, 8, 3, 3}, geometry(1, 1, 1, 1, 1, 1)};
  const Shape ys = ops::conv2d_output_shape(c.x, c.w, c.p, "conv");
  const auto xv = random_floats(count(c.x), 7), wv = random_floats(count(c.w), 8),
             dyv = random_floats(count(ys), 9);
  const ConvRun one = run_conv(c, "tiny", 1, xv, wv, dyv);
  const ConvRun two = run_conv(c, "tiny", 2, xv, wv, dyv);
  EXPECT_EQ(0, std::memcmp(one.y.data(), two.y.data(), one.y.size() * 4));
  EXPECT_EQ(0, std::memcmp(one.dx.data(), two.dx.data(), one.dx.size() * 4));
  EXPECT_EQ(0, std::memcmp(one.dw.data(), two.dw.data(), one.dw.size() * 4));
  EXPECT_EQ(one.forward.total(), two.forward.total());
}

TEST(Conv, LayerThatCannotFitIsOutOfMemory) {
  // One output channel's weights alone (4096 x 3 x 3 floats, 144 KiB) exceed a tiny tile, and
  // the planner does not split input channels: the engine must refuse it.
  Graph g(ArchPreset::get("tiny"));
  Tensor x = g.add_variable(DType::f32, {1, 4096, 3, 3}, "x");
  Tensor w = g.add_variable(DType::f32, {2, 4096, 3, 3}, "w", MemoryCategory::weight);
  g.map_linearly(x);
  g.map_linearly(w);
  Program p;
  ops::conv2d(g, p, x, w, {}, "huge");
  EXPECT_FALSE(ops::plan_conv2d(g.arch(), x.shape(), w.shape(), {}).fits);
  try {
    Engine e(g, {{"p", p}});
    FAIL() << "expected an out-of-memory error";
  } catch (const OutOfMemoryError& err) {
    EXPECT_NE(std::string(err.what()).find("Out of memory"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("huge"), std::string::npos) << err.what();
  }
}

TEST(Conv, MoreWorkCostsMoreCycles) {
  // A layer that fills every tile: twice the batch is about twice the compute.
  const auto forward_cycles = [](std::size_t batch) {
    const ConvCase c{"", {batch, 4, 32, 32}, {16, 4, 3, 3}, geometry(1, 1, 1, 1, 1, 1)};
    const Shape ys = ops::conv2d_output_shape(c.x, c.w, c.p, "conv");
    return run_conv(c, "tiny", 1, random_floats(count(c.x), 1), random_floats(count(c.w), 2),
                    random_floats(count(ys), 3))
        .forward.compute;
  };
  const double small = double(forward_cycles(4)), large = double(forward_cycles(8));
  EXPECT_GT(large, 1.5 * small);
  EXPECT_LT(large, 2.5 * small);
}

struct TransposeCase {
  const char* label;
  Shape x, w;  // w [ci, co/groups, kh, kw]
  ops::ConvParams p;
};

class ConvTransposeTest : public ::testing::TestWithParam<TransposeCase> {};

TEST_P(ConvTransposeTest, MatchesReference) {
  const TransposeCase& c = GetParam();
  const Shape ys = ops::conv_transpose2d_output_shape(c.x, c.w, c.p, "convT");
  Graph g(ArchPreset::get("tiny"));
  Tensor x = g.add_variable(DType::f32, c.x, "x");
  Tensor w = g.add_variable(DType::f32, c.w, "w", MemoryCategory::weight);
  g.map_linearly(x, 2);
  g.map_linearly(w, 3);
  Program p;
  Tensor y = ops::conv_transpose2d(g, p, x, w, c.p, "convT");
  ASSERT_EQ(y.shape(), ys);
  g.set_host_access(x);
  g.set_host_access(y);
  Engine e(g, {{"p", p}});
  const auto xv = random_floats(count(c.x), 11), wv = random_floats(count(c.w), 12);
  e.write(x, std::as_bytes(std::span(xv)));
  e.write(w, std::as_bytes(std::span(wv)));
  e.run("p");
  // y[b, oc, iy*s + i*d - pad, ...] += x[b, ic, iy, ix] * w[ic, oc within group, i, j]
  const std::size_t cin_g = c.x[1] / c.p.groups, cout_g = c.w[1];
  Ref ref(count(ys));
  for (std::size_t b = 0; b < c.x[0]; ++b)
    for (std::size_t ic = 0; ic < c.x[1]; ++ic)
      for (std::size_t iy = 0; iy < c.x[2]; ++iy)
        for (std::size_t ix = 0; ix < c.x[3]; ++ix)
          for (std::size_t o = 0; o < cout_g; ++o)
            for (std::size_t i = 0; i < c.w[2]; ++i)
              for (std::size_t j = 0; j < c.w[3]; ++j) {
                const long oy = long(iy * c.p.stride_h + i * c.p.dilation_h) - long(c.p.pad_top);
                const long ox = long(ix * c.p.stride_w + j * c.p.dilation_w) - long(c.p.pad_left);
                if (oy < 0 || ox < 0 || oy >= long(ys[2]) || ox >= long(ys[3])) continue;
                const std::size_t oc = ic / cin_g * cout_g + o;
                ref.add(((b * ys[1] + oc) * ys[2] + std::size_t(oy)) * ys[3] + std::size_t(ox),
                        xv[((b * c.x[1] + ic) * c.x[2] + iy) * c.x[3] + ix],
                        wv[((ic * cout_g + o) * c.w[2] + i) * c.w[3] + j]);
              }
  expect_close(read_floats(e, y), ref, c.label);
}

ops::ConvParams transpose_geometry(std::size_t stride, std::size_t pad, std::size_t dilation,
                                   std::size_t groups, std::size_t output_padding) {
  ops::ConvParams p = geometry(stride, stride, pad, pad, pad, pad, dilation, groups);
  p.output_padding_h = p.output_padding_w = output_padding;
  return p;
}

INSTANTIATE_TEST_SUITE_P(
    AwkwardShapes, ConvTransposeTest,
    ::testing::Values(
        TransposeCase{"stride2_output_padding",
                      {2, 3, 5, 7},
                      {3, 4, 3, 3},
                      transpose_geometry(2, 1, 1, 1, 1)},
        // output padding larger than the stride (allowed by the dilation): a row no tap reaches
        TransposeCase{
            "groups2_dilation2", {1, 4, 6, 5}, {4, 3, 3, 3}, transpose_geometry(1, 1, 2, 2, 1)},
        TransposeCase{
            "kernel5_stride2", {2, 2, 4, 4}, {2, 2, 5, 5}, transpose_geometry(2, 2, 1, 1, 1)},
        TransposeCase{"pointwise", {1, 5, 3, 7}, {5, 2, 1, 1}, transpose_geometry(1, 0, 1, 1, 0)}),
    [](const auto& info) { return std::string(info.param.label); });

TEST(Conv, BadInputsNameWhatIsWrong) {
  Graph g(ArchPreset::get("tiny"));
  Tensor x = g.add_variable(DType::f32, {1, 4, 5, 5}, "x");
  Tensor w = g.add_variable(DType::f32, {6, 3, 3, 3}, "w");
  Program p;
  const auto message = [&](auto&& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { ops::conv2d(g, p, x, w, {}, "c1"); }).find("expects 3 input channels"),
            std::string::npos);
  ops::ConvParams grouped;
  grouped.groups = 3;
  EXPECT_NE(message([&] { ops::conv2d(g, p, x, w, grouped, "c2"); }).find("divisible by groups"),
            std::string::npos);
  Tensor w7 = g.add_variable(DType::f32, {2, 4, 7, 7}, "w7");
  EXPECT_NE(message([&] { ops::conv2d(g, p, x, w7, {}, "c3"); }).find("does not fit"),
            std::string::npos);
  Tensor dy = g.add_variable(DType::f32, {1, 2, 4, 4}, "dy");
  Tensor w4 = g.add_variable(DType::f32, {2, 4, 3, 3}, "w4");
  EXPECT_NE(message([&] {
              ops::conv2d_grad_input(g, p, dy, w4, {1, 4, 5, 5}, {}, "c4");
            }).find("must be [1,2,3,3]"),
            std::string::npos);
  Tensor wt = g.add_variable(DType::f32, {4, 2, 3, 3}, "wt");
  ops::ConvParams op;
  op.output_padding_h = 1;
  EXPECT_NE(message([&] { ops::conv_transpose2d(g, p, x, wt, op, "c5"); }).find("output_padding"),
            std::string::npos);
  EXPECT_NE(
      message([&] { ops::conv_transpose2d(g, p, x, w4, {}, "c6"); }).find("weight must be [4"),
      std::string::npos);
}

}  // namespace
}  // namespace ipupod::ipu
