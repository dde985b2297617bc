// The matmul op library: the host kernel against a plain loop, the planner's inner-dimension
// split, the whole op against a CPU reference on awkward shapes, thread-count independence and
// how its predicted cycles scale with work and tiles.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>

#include "ipu_process/engine.hpp"
#include "ipu_process/ops/matmul.hpp"
#include "tests/ipu/device_data.hpp"

namespace ipupod::ipu {
namespace {

// Small integers: every product and partial sum is exact in float32, so any summation order
// gives the same bits and the kernel can be compared exactly with a plain loop.
std::vector<float> small_integers(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(-4, 4);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(d(gen));
  return v;
}

struct KernelCase {
  std::size_t bm, k, n, r0, rows;
};

TEST(MatMulKernel, MatchesAPlainLoopOnEveryRemainderAndLayout) {
  // Rows and columns that do not fill a register tile (of any of the host's kernels), depths
  // across the depth blocks.
  const KernelCase cases[] = {{1, 1, 1, 0, 1},      {7, 3, 5, 2, 5},     {13, 300, 33, 0, 13},
                              {6, 257, 16, 0, 6},   {9, 513, 47, 4, 5},  {31, 64, 64, 1, 29},
                              {5, 17, 100, 0, 5},   {12, 256, 32, 6, 6}, {114, 114, 57, 19, 19},
                              {25, 40, 130, 0, 25}, {8, 9, 65, 0, 7}};
  const auto isas = ops::matmul_kernel_isas();
  ASSERT_FALSE(isas.empty());
  for (const std::string& isa : isas)
    for (const auto& [bm, k, n, r0, rows] : cases)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const auto a = small_integers(bm * k, 1), b = small_integers(k * n, 2);
          std::vector<float> c(rows * n, -7.f);  // garbage the kernel must overwrite
          std::vector<float*> out(rows);
          for (std::size_t i = 0; i < rows; ++i) out[i] = c.data() + i * n;
          ops::matmul_block_rows(a.data(), b.data(), out.data(), bm, k, n, ta, tb, r0, rows, isa);
          for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t j = 0; j < n; ++j) {
              float ref = 0;
              for (std::size_t p = 0; p < k; ++p)
                ref += (ta ? a[p * bm + r0 + i] : a[(r0 + i) * k + p]) *
                       (tb ? b[j * k + p] : b[p * n + j]);
              ASSERT_EQ(c[i * n + j], ref)
                  << isa << " bm=" << bm << " k=" << k << " n=" << n << " ta=" << ta << " tb=" << tb
                  << " at " << i << "," << j;
            }
        }
}

TEST(MatMulKernel, EveryHostKernelGivesTheSameBitsOnRealValues) {
  // Rounded sums: the kernels must add the same terms in the same order. (The portable kernel
  // rounds after each multiply where the others fuse, so it is compared only with itself.)
  const std::size_t bm = 19, k = 300, n = 70;
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> a(bm * k), b(k * n);
  for (auto& x : a) x = d(gen);
  for (auto& x : b) x = d(gen);
  const auto run = [&](const std::string& isa) {
    std::vector<float> c(bm * n);
    std::vector<float*> out(bm);
    for (std::size_t i = 0; i < bm; ++i) out[i] = c.data() + i * n;
    ops::matmul_block_rows(a.data(), b.data(), out.data(), bm, k, n, false, false, 0, bm, isa);
    return c;
  };
  const auto isas = ops::matmul_kernel_isas();
  std::vector<std::string> fused(isas.begin(), isas.end() - 1);  // all but the portable one
  for (const auto& isa : fused) EXPECT_EQ(run(isa), run(fused.front())) << isa;
  EXPECT_THROW(run("no-such-isa"), std::invalid_argument);
}

TEST(MatMulReduce, AddsThePartialsInOrderLikeAPlainLoop) {
  // Rounded sums of values of very different sizes, so that another order would change bits;
  // lengths on both sides of every host vector width.
  std::mt19937 gen(4);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (std::size_t count : {1u, 2u, 9u})
    for (std::size_t n : {0u, 1u, 3u, 4u, 7u, 8u, 15u, 16u, 17u, 31u, 57u, 64u, 100u}) {
      std::vector<std::vector<float>> parts(count, std::vector<float>(n));
      for (std::size_t g = 0; g < count; ++g)
        for (auto& x : parts[g]) x = d(gen) * std::ldexp(1.f, static_cast<int>(g % 3) * 12);
      std::vector<const float*> pointers;
      for (const auto& p : parts) pointers.push_back(p.data());
      std::vector<float> ref(n);
      for (std::size_t j = 0; j < n; ++j) {
        ref[j] = parts[0][j];
        for (std::size_t g = 1; g < count; ++g) ref[j] += parts[g][j];
      }
      std::vector<float> out(n, -7.f);
      ops::add_partials(pointers.data(), count, out.data(), n);
      ASSERT_EQ(out, ref) << count << " partials, n=" << n;
      // Every instruction set this host runs gives the same bits.
      for (const std::string& isa : ops::matmul_kernel_isas()) {
        std::fill(out.begin(), out.end(), -7.f);
        ops::add_partials(pointers.data(), count, out.data(), n, isa);
        ASSERT_EQ(out, ref) << isa << ", " << count << " partials, n=" << n;
      }
    }
}

TEST(MatMulPlan, SplitsTheInnerDimensionWhenTheOutputIsTooSmallForTheTiles) {
  const ArchPreset& tiny = ArchPreset::get("tiny");
  const auto plan = ops::plan_matmul(tiny, 2, 4099, 3);
  EXPECT_GT(plan.k_splits, 1u);
  EXPECT_LE(plan.tiles(), tiny.tiles);
  // A large square output already fills the tiles and needs no split.
  const auto wide = ops::plan_matmul(tiny, 600, 8, 600);
  EXPECT_EQ(wide.k_splits, 1u);
  EXPECT_LE(wide.tiles(), tiny.tiles);
}

TEST(MatMulPlan, KeepsEveryTileWithinItsAvailableMemoryWhenAnOperandIsLargerThanATile) {
  const ArchPreset& tiny = ArchPreset::get("tiny");
  const std::size_t m = 9, k = 20011, n = 5;  // a alone is 720 KB, a tile 128 KiB
  ASSERT_GT(4 * m * k, tiny.bytes_per_tile);
  const auto plan = ops::plan_matmul(tiny, m, k, n);
  EXPECT_LE(static_cast<double>(plan.bytes_per_tile),
            kDefaultAvailableMemoryProportion * static_cast<double>(tiny.bytes_per_tile));
  EXPECT_GT(plan.k_splits, 1u);
}

TEST(MatMulPlan, AGraphsAvailableMemoryProportionBoundsItsMatmulsTiles) {
  // The fastest plan of this matmul holds about 3% of a tiny tile; at 2.5% the planner takes a
  // slower plan that splits the inner dimension more, and ops::matmul plans with the graph's share.
  const ArchPreset& tiny = ArchPreset::get("tiny");
  const std::size_t m = 2, k = 256, n = 64;
  const double low = 0.025, limit = low * static_cast<double>(tiny.bytes_per_tile);
  const auto roomy = ops::plan_matmul(tiny, m, k, n, kDefaultAvailableMemoryProportion);
  const auto tight = ops::plan_matmul(tiny, m, k, n, low);
  ASSERT_GT(static_cast<double>(roomy.bytes_per_tile), limit);
  EXPECT_LE(static_cast<double>(tight.bytes_per_tile), limit);
  EXPECT_GT(tight.k_splits, roomy.k_splits);
  EXPECT_GE(tight.estimated_cycles, roomy.estimated_cycles);
  const auto busiest = [&](double proportion) {
    Graph g(tiny);
    g.set_available_memory_proportion(proportion);
    Tensor a = g.add_variable(DType::f32, {m, k}, "a", MemoryCategory::weight);
    Tensor b = g.add_variable(DType::f32, {k, n}, "b", MemoryCategory::weight);
    g.map_linearly(a);
    g.map_linearly(b);
    Program p;
    ops::matmul(g, p, a, b, false, false, "ab");
    Engine e(g, {{"p", p}});
    std::size_t most = 0;
    for (const auto& t : e.memory().tiles) most = std::max(most, t.not_always_live);
    return most;
  };
  EXPECT_LT(busiest(low), busiest(kDefaultAvailableMemoryProportion));
  Graph g(tiny);
  EXPECT_THROW(g.set_available_memory_proportion(0.0), std::invalid_argument);
  EXPECT_THROW(g.set_available_memory_proportion(1.5), std::invalid_argument);
}

// The budget a plan's busiest tile must keep within at the default available-memory proportion.
double default_budget(const ArchPreset& arch) {
  return kDefaultAvailableMemoryProportion * static_cast<double>(arch.bytes_per_tile);
}

TEST(MatMulPlan, TakesTheInnerDimensionInSerialPassesWhenNoParallelPlanFits) {
  // [2048,2048] x [2048,4096] in float32: 80 MB of operands and result, under a tenth of an
  // MK2, but every parallel plan gives a tile over 1 MB of operand pieces or partial sums.
  const ArchPreset& mk2 = ArchPreset::get("mk2");
  const auto plan = ops::plan_matmul(mk2, 2048, 2048, 4096);
  EXPECT_LE(static_cast<double>(plan.bytes_per_tile), default_budget(mk2));
  EXPECT_GT(plan.k_serial, 1u);
  EXPECT_EQ(plan.k_splits, 1u);
  EXPECT_LE(plan.tiles(), mk2.tiles);
  EXPECT_GT(plan.tiles(), mk2.tiles / 2);
  // A plan that fits without passes keeps that plan.
  EXPECT_EQ(ops::plan_matmul(mk2, 512, 512, 512).k_serial, 1u);
}

TEST(MatMulPlan, PlansEveryShapeWhoseOperandsTakeUpToFortyPercentOfAnMk2) {
  const ArchPreset& mk2 = ArchPreset::get("mk2");
  const double ipu = static_cast<double>(mk2.bytes_per_ipu());
  struct Shape {
    std::size_t m, k, n;
  };
  // Square, wide, deep and thin products from ~1% to ~40% of the IPU in float32 operands.
  const Shape shapes[] = {{1024, 1024, 1024},  {2048, 2048, 4096}, {4096, 4096, 4096},
                          {1, 65536, 1024},    {64, 16384, 4096},  {16384, 4096, 64},
                          {2048, 16384, 3584}, {8192, 8192, 2048}, {512, 81920, 512}};
  double largest = 0;
  for (const auto& [m, k, n] : shapes) {
    const double operands = 4.0 * static_cast<double>(m * k + k * n);
    ASSERT_LE(operands, 0.41 * ipu) << m << "x" << k << "x" << n;
    largest = std::max(largest, operands / ipu);
    const auto plan = ops::plan_matmul(mk2, m, k, n);
    EXPECT_LE(static_cast<double>(plan.bytes_per_tile), default_budget(mk2))
        << m << "x" << k << "x" << n << ": " << plan.row_blocks << "x" << plan.col_blocks << "x"
        << plan.k_splits << " serial " << plan.k_serial;
  }
  EXPECT_GT(largest, 0.38);
}

TEST(MatMulPlan, ThePlansCyclesFallAsTilesAreAdded) {
  for (const auto& [m, k, n] :
       {std::array<std::size_t, 3>{2048, 2048, 4096}, std::array<std::size_t, 3>{1024, 1024, 1024},
        std::array<std::size_t, 3>{16, 4096, 1000}}) {
    std::uint64_t before = std::numeric_limits<std::uint64_t>::max();
    for (unsigned tiles : {368u, 736u, 1472u}) {
      ArchPreset arch = ArchPreset::get("mk2");
      arch.tiles = tiles;
      const auto plan = ops::plan_matmul(arch, m, k, n);
      EXPECT_LE(static_cast<double>(plan.bytes_per_tile), default_budget(arch))
          << m << "x" << k << "x" << n << " on " << tiles << " tiles";
      EXPECT_LT(plan.estimated_cycles, before) << m << "x" << k << "x" << n << " on " << tiles;
      before = plan.estimated_cycles;
    }
  }
}

TEST(MatMulPlan, RejectsAnEmptyDimension) {
  EXPECT_THROW(ops::plan_matmul(ArchPreset::get("tiny"), 0, 4, 4), std::invalid_argument);
}

struct OpCase {
  std::size_t m, k, n;
  bool ta, tb;
};

// Builds op(a) x op(b) on `arch`, runs it and returns the result and the engine's cycles.
struct OpRun {
  std::vector<float> a, b, c;
  CycleBreakdown cycles;
};

OpRun run_matmul(const ArchPreset& arch, const OpCase& oc, unsigned threads = 1) {
  const auto [m, k, n, ta, tb] = oc;
  Graph g(arch);
  Tensor a = g.add_variable(DType::f32, ta ? std::vector{k, m} : std::vector{m, k}, "a");
  Tensor b = g.add_variable(DType::f32, tb ? std::vector{n, k} : std::vector{k, n}, "b");
  g.map_linearly(a, 3);
  g.map_linearly(b, 5, arch.tiles > 2 ? 2 : 0);  // a layout unlike a's
  Program p;
  Tensor c = ops::matmul(g, p, a, b, ta, tb, "c");
  for (const Tensor& t : {a, b, c}) g.set_host_access(t);
  Engine e(g, {{"p", p}}, {.threads = threads});
  OpRun r{random_floats(m * k, 1), random_floats(k * n, 2), {}, {}};
  e.write(a, std::as_bytes(std::span(r.a)));
  e.write(b, std::as_bytes(std::span(r.b)));
  e.run("p");
  const auto bytes = e.read(c);
  r.c.resize(m * n);
  std::memcpy(r.c.data(), bytes.data(), bytes.size());
  r.cycles = e.cycles();
  return r;
}

class MatMulOpTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(MatMulOpTest, MatchesADoublePrecisionReference) {
  const OpCase oc = GetParam();
  const auto [m, k, n, ta, tb] = oc;
  const OpRun r = run_matmul(ArchPreset::get("tiny"), oc);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double ref = 0, magnitude = 0;
      for (std::size_t p = 0; p < k; ++p) {
        const double t = double(ta ? r.a[p * m + i] : r.a[i * k + p]) *
                         double(tb ? r.b[j * k + p] : r.b[p * n + j]);
        ref += t;
        magnitude += std::abs(t);
      }
      // float32 accumulation of k terms: rounding errors grow like sqrt(k) ulps of the terms.
      ASSERT_NEAR(r.c[i * n + j], ref, 2e-6 * std::sqrt(double(k)) * (1 + magnitude))
          << "at " << i << "," << j;
    }
  EXPECT_GT(r.cycles.compute, 0u);
  EXPECT_GT(r.cycles.exchange, 0u);
}

std::vector<OpCase> op_cases() {
  std::vector<OpCase> cases;
  struct Shape {
    std::size_t m, k, n;
  };
  const Shape shapes[] = {
      {7, 13, 5},      // primes, fewer blocks than tiles
      {1, 1, 1},       // one element
      {3, 4099, 2},    // k much larger than m * n: the inner dimension is split
      {61, 1031, 67},  // operands of 250 KB and 270 KB, a tile 128 KiB
      {37, 2, 41},     // almost no depth
      {48, 96, 48},    // 8 output blocks, each split over 4 tiles that add up their partials
  };
  for (const auto& s : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) cases.push_back({s.m, s.k, s.n, ta, tb});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AwkwardShapes, MatMulOpTest, ::testing::ValuesIn(op_cases()),
                         [](const auto& info) {
                           const OpCase& c = info.param;
                           return std::to_string(c.m) + "x" + std::to_string(c.k) + "x" +
                                  std::to_string(c.n) + (c.ta ? "_ta" : "") + (c.tb ? "_tb" : "");
                         });

TEST(MatMulOp, ASplitInnerDimensionGivesBitwiseIdenticalResultsWithOneOrTwoThreads) {
  // One block over many tiles, and many blocks each over a few tiles (whose partial sums the
  // engine adds up block by block).
  for (const OpCase oc : {OpCase{5, 3001, 7, false, true}, OpCase{48, 96, 48, false, false}}) {
    ASSERT_GT(ops::plan_matmul(ArchPreset::get("tiny"), oc.m, oc.k, oc.n).k_splits, 1u);
    const OpRun one = run_matmul(ArchPreset::get("tiny"), oc, 1);
    const OpRun two = run_matmul(ArchPreset::get("tiny"), oc, 2);
    ASSERT_EQ(one.c.size(), two.c.size());
    EXPECT_EQ(std::memcmp(one.c.data(), two.c.data(), one.c.size() * sizeof(float)), 0) << oc.k;
    EXPECT_EQ(one.cycles.total(), two.cycles.total()) << oc.k;
  }
}

TEST(MatMulOp, SerialPassesMatchTheReferenceAndGiveTheSameBitsOnAnyThreadCount) {
  // On `tiny` no parallel plan of these fits in the default proportion of a tile.
  for (const OpCase oc :
       {OpCase{128, 1024, 128, false, false}, OpCase{128, 1023, 100, true, true}}) {
    const auto plan = ops::plan_matmul(ArchPreset::get("tiny"), oc.m, oc.k, oc.n);
    ASSERT_GT(plan.k_serial, 1u) << oc.k;
    const OpRun one = run_matmul(ArchPreset::get("tiny"), oc, 1);
    const OpRun two = run_matmul(ArchPreset::get("tiny"), oc, 2);
    ASSERT_EQ(one.c, two.c) << oc.k;
    EXPECT_EQ(one.cycles.total(), two.cycles.total());
    for (std::size_t i = 0; i < oc.m; i += 13)
      for (std::size_t j = 0; j < oc.n; j += 11) {
        double ref = 0, magnitude = 0;
        for (std::size_t p = 0; p < oc.k; ++p) {
          const double t = double(oc.ta ? one.a[p * oc.m + i] : one.a[i * oc.k + p]) *
                           double(oc.tb ? one.b[j * oc.k + p] : one.b[p * oc.n + j]);
          ref += t;
          magnitude += std::abs(t);
        }
        ASSERT_NEAR(one.c[i * oc.n + j], ref, 2e-6 * std::sqrt(double(oc.k)) * (1 + magnitude));
      }
  }
}

TEST(MatMulOp, TheLargeFloat32MatmulRunsOnOneMk2WithinItsTiles) {
  // The planner's case above, compiled and run: every tile within its memory.
  const ArchPreset& mk2 = ArchPreset::get("mk2");
  const std::size_t m = 2048, k = 2048, n = 4096;
  Graph g(mk2);
  Tensor a = g.add_variable(DType::f32, {m, k}, "a", MemoryCategory::weight);
  Tensor b = g.add_variable(DType::f32, {k, n}, "b", MemoryCategory::weight);
  g.map_linearly(a);
  g.map_linearly(b);
  Program p;
  Tensor c = ops::matmul(g, p, a, b, false, false, "c");
  for (const Tensor& t : {a, b, c}) g.set_host_access(t);
  Engine e(g, {{"p", p}});
  for (const auto& t : e.memory().tiles) ASSERT_LE(t.total(), mk2.bytes_per_tile);
  // Rows of small integers: every sum is exact, so each element is checked exactly.
  std::vector<float> av(m * k), bv(k * n);
  for (std::size_t i = 0; i < m * k; ++i) av[i] = static_cast<float>(int(i % 7) - 3);
  for (std::size_t i = 0; i < k * n; ++i) bv[i] = static_cast<float>(int(i % 5) - 2);
  e.write(a, std::as_bytes(std::span(av)));
  e.write(b, std::as_bytes(std::span(bv)));
  e.run("p");
  const auto bytes = e.read(c);
  std::vector<float> cv(m * n);
  std::memcpy(cv.data(), bytes.data(), bytes.size());
  for (std::size_t i = 0; i < m; i += 211)
    for (std::size_t j = 0; j < n; j += 97) {
      float ref = 0;
      for (std::size_t q = 0; q < k; ++q) ref += av[i * k + q] * bv[q * n + j];
      ASSERT_EQ(cv[i * n + j], ref) << i << "," << j;
    }
}

TEST(MatMulOp, RejectsMismatchedInnerDimensionsAndNonFloatOperands) {
  Graph g(ArchPreset::get("tiny"));
  Tensor a = g.add_variable(DType::f32, {4, 5}, "a");
  Tensor b = g.add_variable(DType::f32, {6, 3}, "b");
  Tensor h = g.add_variable(DType::i32, {5, 3}, "h");
  Program p;
  try {
    ops::matmul(g, p, a, b, false, false, "mm");
    FAIL() << "no error for [4,5] x [6,3]";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("inner dimensions differ"), std::string::npos);
  }
  try {
    ops::matmul(g, p, a, h, false, false, "mm");
    FAIL() << "no error for an int32 operand";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("float32"), std::string::npos);
  }
}

// An architecture like `tiny` with a given number of tiles and memory enough for any plan.
ArchPreset with_tiles(unsigned tiles) {
  ArchPreset arch = ArchPreset::get("tiny");
  arch.name = "tiny-" + std::to_string(tiles);
  arch.tiles = tiles;
  arch.bytes_per_tile = 16u << 20;
  return arch;
}

TEST(MatMulCycles, TwiceTheWorkOnOneTileCostsAboutTwiceTheComputeCycles) {
  const ArchPreset one_tile = with_tiles(1);
  const auto once = run_matmul(one_tile, {48, 96, 48, false, false}).cycles.compute;
  const auto twice = run_matmul(one_tile, {48, 192, 48, false, false}).cycles.compute;
  const double ratio = static_cast<double>(twice) / static_cast<double>(once);
  EXPECT_GT(ratio, 1.9);
  EXPECT_LT(ratio, 2.05);
}

TEST(MatMulCycles, TheSameWorkOnTwiceTheTilesCostsAboutHalfTheComputeCycles) {
  const ArchPreset one_tile = with_tiles(1), two_tiles = with_tiles(2);
  const OpCase oc{48, 96, 48, false, false};
  const auto one = run_matmul(one_tile, oc).cycles.compute;
  const auto two = run_matmul(two_tiles, oc).cycles.compute;
  const double ratio = static_cast<double>(two) / static_cast<double>(one);
  EXPECT_GT(ratio, 0.45);
  EXPECT_LT(ratio, 0.6);
}

}  // namespace
}  // namespace ipupod::ipu
