// float16 on the device: casts that round like the fabric (to nearest even) or stochastically
// (unbiased, the same for any thread count), codelets that compute on float16 in float32 and
// round once, float32 accumulation in the matmul, and the halved bytes, exchanges and cycles.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "float16/half.hpp"
#include "ipu_process/engine.hpp"
#include "ipu_process/ops/conv.hpp"
#include "ipu_process/ops/elementwise.hpp"
#include "ipu_process/ops/matmul.hpp"
#include "ipu_process/ops/tensor_ops.hpp"
#include "tests/ipu/device_data.hpp"

namespace ipupod::ipu {
namespace {

using float16::Half;

std::vector<std::uint16_t> half_bits(const std::vector<float>& v) {
  std::vector<std::uint16_t> out;
  for (float x : v) out.push_back(float16::to_half(x).bits);
  return out;
}

std::vector<std::uint16_t> read_bits(const Engine& e, const Tensor& t) {
  const auto bytes = e.read(t);
  std::vector<std::uint16_t> v(bytes.size() / 2);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

std::vector<float> read_halves(const Engine& e, const Tensor& t) {
  std::vector<float> out;
  for (std::uint16_t b : read_bits(e, t)) out.push_back(float16::to_float(Half{b}));
  return out;
}

double mean(const std::vector<float>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// A host-accessible variable of n elements spread over `tiles` tiles of the tiny IPU.
Tensor spread_variable(Graph& g, DType dtype, std::size_t n, const std::string& name,
                       unsigned tiles = 5) {
  Tensor t = g.add_variable(dtype, {n}, name);
  g.map_linearly(t, 1, 3, tiles);
  g.set_host_access(t);
  return t;
}

bool is_nan_bits(std::uint16_t bits) {
  return (bits & 0x7C00U) == 0x7C00U && (bits & 0x03FFU) != 0;
}

TEST(Float16Cast, RoundsToNearestEvenBitwiseLikeTheFabricAndWidensExactly) {
  std::vector<float> values = {0.F,
                               -0.F,
                               1.F,
                               65504.F,
                               65519.99F,
                               65520.F,
                               1e9F,
                               -1e9F,
                               std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN(),
                               std::ldexp(1.F, -24),
                               std::ldexp(1.F, -25),
                               std::ldexp(1.5F, -25),
                               std::ldexp(2.5F, -24),  // subnormal tie: to 2
                               std::ldexp(3.5F, -24),  // subnormal tie: to 4
                               std::ldexp(1.F, -14),
                               1.F + std::ldexp(1.F, -11),     // tie: to 1
                               1.F + std::ldexp(3.F, -11),     // tie: up to even
                               -(1.F + std::ldexp(3.F, -11)),  // negative mirrors
                               std::ldexp(1023.5F, -24),       // to the smallest normal
                               1e-10F};
  for (float x : random_floats(500, 3, -70000.F, 70000.F)) values.push_back(x);
  for (float x : random_floats(500, 4, -1e-4F, 1e-4F)) values.push_back(x);
  Graph g(ArchPreset::get("tiny"));
  Tensor in = spread_variable(g, DType::f32, values.size(), "in");
  Program prog;
  Tensor half = ops::cast(g, prog, in, DType::f16, Rounding::nearest_even, 0, "to_half");
  Tensor back = ops::cast(g, prog, half, DType::f32, Rounding::nearest_even, 0, "to_float");
  EXPECT_EQ(half.dtype(), DType::f16);
  g.set_host_access(half);
  g.set_host_access(back);
  Engine e(g, {{"p", prog}});
  write_floats(e, in, values);
  e.run("p");
  const auto bits = read_bits(e, half);
  const auto widened = read_floats(e, back);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const Half want = float16::to_half(values[i]);
    if (is_nan_bits(want.bits)) {
      EXPECT_TRUE(is_nan_bits(bits[i])) << i;
      EXPECT_TRUE(std::isnan(widened[i])) << i;
      continue;
    }
    ASSERT_EQ(bits[i], want.bits) << "value " << values[i] << " at " << i;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(widened[i]),
              std::bit_cast<std::uint32_t>(float16::to_float(want)))
        << i;
  }
}

// A value 0.3 of the way from 1 to the next float16 (which rounding to nearest always drops).
constexpr float kBetween = 1.F + 0.3F * 0x1p-10F;
constexpr std::size_t kCopies = 6000;

TEST(Float16Cast, StochasticRoundingIsUnbiasedAndTheSameForAnyThreadCount) {
  const auto run = [](Rounding rounding, unsigned threads) {
    Graph g(ArchPreset::get("tiny"));
    Tensor in = spread_variable(g, DType::f32, kCopies, "in", 7);
    Program prog;
    Tensor half = ops::cast(g, prog, in, DType::f16, rounding, 1234, "to_half");
    g.set_host_access(half);
    Engine e(g, {{"p", prog}}, {.threads = threads});
    write_floats(e, in, std::vector<float>(kCopies, kBetween));
    std::vector<std::vector<std::uint16_t>> runs;
    for (int r = 0; r < 2; ++r) {
      e.run("p");
      runs.push_back(read_bits(e, half));
    }
    return runs;
  };
  const auto one = run(Rounding::stochastic, 1), two = run(Rounding::stochastic, 2);
  EXPECT_EQ(one, two) << "stochastic rounding must not depend on the engine's thread count";
  EXPECT_NE(one[0], one[1]) << "each run draws anew (the tiles' invocation counters advance)";
  const double step = 0x1p-10;
  const double five_sigma = 5 * step / (2 * std::sqrt(double(kCopies)));
  for (const auto& bits : one) {
    std::vector<float> v;
    for (auto b : bits) {
      v.push_back(float16::to_float(Half{b}));
      ASSERT_TRUE(v.back() == 1.F || v.back() == 1.F + 0x1p-10F) << "not a neighbour: " << v.back();
    }
    EXPECT_NEAR(mean(v), kBetween, five_sigma);
  }
  std::vector<float> nearest;
  const auto nearest_runs = run(Rounding::nearest_even, 1);
  for (auto b : nearest_runs[0]) nearest.push_back(float16::to_float(Half{b}));
  EXPECT_EQ(mean(nearest), 1.0) << "rounding to nearest is biased: always the lower neighbour";
}

TEST(Float16Cast, RejectsOtherTypes) {
  Graph g(ArchPreset::get("tiny"));
  Tensor i = spread_variable(g, DType::i32, 10, "i");
  Program prog;
  try {
    ops::cast(g, prog, i, DType::f16, Rounding::nearest_even, 0, "bad");
    FAIL() << "an int32 cast must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("int32 to float16"), std::string::npos) << e.what();
  }
}

// acc += factor * g on float16 tensors, with a float32 accumulator alongside: the codelet sees
// float32 values and each float16 result is rounded once.
struct ScaledAdd {
  Graph g{ArchPreset::get("tiny")};
  Program prog;
  Tensor acc16, g16, acc32;
  explicit ScaledAdd(std::size_t n) {
    acc16 = spread_variable(g, DType::f16, n, "acc16");
    g16 = spread_variable(g, DType::f16, n, "g16");
    acc32 = spread_variable(g, DType::f32, n, "acc32");
    ops::scaled_add_in_place(g, prog, acc16, g16, 0.375F, "half += half");
    ops::scaled_add_in_place(g, prog, acc32, g16, 0.375F, "float += half");
  }
};

TEST(Float16Codelets, ComputeInFloat32AndRoundOnceToNearestEven) {
  const std::size_t n = 700;
  ScaledAdd t(n);
  Engine e(t.g, {{"p", t.prog}});
  const auto acc = random_floats(n, 5, -3.F, 3.F), grad = random_floats(n, 6, -3.F, 3.F);
  const auto acc_bits = half_bits(acc), grad_bits = half_bits(grad);
  e.write(t.acc16, std::as_bytes(std::span(acc_bits)));
  e.write(t.g16, std::as_bytes(std::span(grad_bits)));
  write_floats(e, t.acc32, acc);
  e.run("p");
  const auto got16 = read_bits(e, t.acc16);
  const auto got32 = read_floats(e, t.acc32);
  const auto unchanged = read_bits(e, t.g16);
  for (std::size_t i = 0; i < n; ++i) {
    const float a = float16::to_float(Half{acc_bits[i]}), x = float16::to_float(Half{grad_bits[i]});
    ASSERT_EQ(got16[i], float16::to_half(a + 0.375F * x).bits) << i;
    ASSERT_EQ(got32[i], acc[i] + 0.375F * x) << "a float32 accumulator keeps float32 " << i;
    ASSERT_EQ(unchanged[i], grad_bits[i]) << "an input stays as it was " << i;
  }
}

TEST(Float16Codelets, StochasticStoresAreUnbiasedAndTheSameForAnyThreadCount) {
  const std::size_t n = kCopies;
  const auto run = [&](Rounding rounding, unsigned threads) {
    ScaledAdd t(n);
    Engine e(t.g, {{"p", t.prog}},
             {.threads = threads, .float16_stores = {.rounding = rounding, .seed = 77}});
    const auto ones = half_bits(std::vector<float>(n, 1.F));
    const auto grads = half_bits(std::vector<float>(n, (kBetween - 1.F) / 0.375F));
    e.write(t.acc16, std::as_bytes(std::span(ones)));
    e.write(t.g16, std::as_bytes(std::span(grads)));
    e.run("p");
    return read_halves(e, t.acc16);
  };
  const auto one = run(Rounding::stochastic, 1);
  EXPECT_EQ(one, run(Rounding::stochastic, 2));
  const float exact = 1.F + 0.375F * float16::to_float(float16::to_half((kBetween - 1.F) / 0.375F));
  EXPECT_NEAR(mean(one), exact, 5 * 0x1p-10 / (2 * std::sqrt(double(n))));
  EXPECT_EQ(mean(run(Rounding::nearest_even, 1)), 1.0) << "to nearest: the update is lost";
}

TEST(Float16Matmul, AccumulatesInFloat32AtTheFloat16Rate) {
  // 3000 products of 1: a float16 running sum would stall at 2048; float32 reaches 3000, which
  // float16 holds exactly.
  const std::size_t m = 6, k = 3000, n = 5;
  const auto run = [&](DType dtype, const std::vector<float>& a, const std::vector<float>& b) {
    Graph g(ArchPreset::get("tiny"));
    Tensor ta = g.add_variable(dtype, {m, k}, "a"), tb = g.add_variable(dtype, {k, n}, "b");
    g.map_linearly(ta, 7);
    g.map_linearly(tb, 11);
    g.set_host_access(ta);
    g.set_host_access(tb);
    Program prog;
    Tensor c = ops::matmul(g, prog, ta, tb, false, false, "c");
    EXPECT_EQ(c.dtype(), dtype);
    g.set_host_access(c);
    Engine e(g, {{"p", prog}});
    if (dtype == DType::f16) {
      const auto ha = half_bits(a), hb = half_bits(b);
      e.write(ta, std::as_bytes(std::span(ha)));
      e.write(tb, std::as_bytes(std::span(hb)));
    } else {
      write_floats(e, ta, a);
      write_floats(e, tb, b);
    }
    e.run("p");
    return std::pair{dtype == DType::f16 ? read_halves(e, c) : read_floats(e, c),
                     e.cycles().compute};
  };
  const auto [ones, cycles16] =
      run(DType::f16, std::vector<float>(m * k, 1.F), std::vector<float>(k * n, 1.F));
  for (float x : ones) ASSERT_EQ(x, 3000.F);
  const auto [ones32, cycles32] =
      run(DType::f32, std::vector<float>(m * k, 1.F), std::vector<float>(k * n, 1.F));
  EXPECT_LT(cycles16, cycles32) << "the AMP's float16 rate is higher than its float32 rate";

  const auto a = random_floats(m * k, 8), b = random_floats(k * n, 9);
  const auto got = run(DType::f16, a, b).first;
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double want = 0;
      for (std::size_t p = 0; p < k; ++p)
        want += double(float16::to_float(float16::to_half(a[i * k + p]))) *
                float16::to_float(float16::to_half(b[p * n + j]));
      // float32 sums, then one rounding to float16: within one float16 step of the exact sum.
      const double step = std::ldexp(1.0, std::ilogb(std::max(std::abs(want), 1e-3)) - 10);
      ASSERT_NEAR(got[i * n + j], want, step) << i << "," << j;
    }
}

// A convolution and its two gradients on float16 operands: the float32 results of the same
// (float16-exact) operands, each rounded once to float16.
TEST(Float16Conv, ForwardAndGradientsMatchFloat32RoundedOnce) {
  const std::vector<std::size_t> xs = {2, 3, 7, 6}, ws = {4, 3, 3, 3}, ys = {2, 4, 7, 6};
  const ops::ConvParams p{.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  const auto exact = [](std::vector<float> v) {
    for (float& x : v) x = float16::to_float(float16::to_half(x));
    return v;
  };
  const auto x = exact(random_floats(count(xs), 11)), w = exact(random_floats(count(ws), 12)),
             dy = exact(random_floats(count(ys), 13));
  const auto run = [&](DType dtype) {
    Graph g(ArchPreset::get("tiny"));
    const auto input = [&](const std::vector<std::size_t>& shape, const std::string& name) {
      Tensor t = g.add_variable(dtype, shape, name);
      g.map_linearly(t, 5);
      g.set_host_access(t);
      return t;
    };
    const Tensor tx = input(xs, "x"), tw = input(ws, "w"), tdy = input(ys, "dy");
    Program prog;
    const std::vector<Tensor> outs = {ops::conv2d(g, prog, tx, tw, p, "y"),
                                      ops::conv2d_grad_input(g, prog, tdy, tw, xs, p, "dx"),
                                      ops::conv2d_grad_weight(g, prog, tdy, tx, ws, p, "dw")};
    for (const Tensor& t : outs) {
      EXPECT_EQ(t.dtype(), dtype);
      g.set_host_access(t);
    }
    Engine e(g, {{"p", prog}});
    e.write_values(tx, x);
    e.write_values(tw, w);
    e.write_values(tdy, dy);
    e.run("p");
    std::vector<std::vector<float>> values;
    for (const Tensor& t : outs) values.push_back(e.read_values(t));
    return values;
  };
  const auto half = run(DType::f16), full = run(DType::f32);
  for (std::size_t k = 0; k < half.size(); ++k)
    for (std::size_t i = 0; i < half[k].size(); ++i)
      ASSERT_EQ(half[k][i], float16::to_float(float16::to_half(full[k][i])))
          << "output " << k << " element " << i;
  Graph g(ArchPreset::get("tiny"));
  Program prog;
  const Tensor a = g.add_variable(DType::f16, xs, "a"), b = g.add_variable(DType::f32, ws, "b");
  EXPECT_THROW(ops::conv2d(g, prog, a, b, p, "mixed"), std::invalid_argument);
}

TEST(Float16Cycles, AmpAndVectorRatesFollowThePreset) {
  const ArchPreset& mk2 = ArchPreset::get("mk2");
  const double macs = 1e6;
  const auto amp = [&](DType d, bool half_partials) {
    return double(mac_cycles(mk2, macs, d, {0, 0, half_partials}) - mk2.vertex_overhead_cycles);
  };
  // float16 with float16 partials at the FP16.16 rate, with float32 partials at the slower
  // FP16.32 rate; float32 products ignore the partials type.
  EXPECT_NEAR(amp(DType::f16, true) / amp(DType::f32, false),
              mk2.fp32_flops_per_cycle_per_tile / mk2.fp16_flops_per_cycle_per_tile, 1e-3);
  EXPECT_NEAR(amp(DType::f16, false) / amp(DType::f32, false),
              mk2.fp32_flops_per_cycle_per_tile / mk2.fp16_fp32_partials_flops_per_cycle_per_tile,
              1e-3);
  EXPECT_EQ(amp(DType::f32, true), amp(DType::f32, false));
  const auto vec = [&](DType d) {
    return vector_cycles(mk2, 4096, 3, d) - mk2.vertex_overhead_cycles;
  };
  EXPECT_EQ(2 * vec(DType::f16), vec(DType::f32)) << "a vector holds twice as many float16";
}

TEST(AmpCycles, ShapesThatDoNotFillTheUnitRunSlowerAndDepthwiseTakesTheVectorPath) {
  const ArchPreset& mk2 = ArchPreset::get("mk2");
  const double macs = 1e6;
  const auto rate = [&](DType d, AmpShape shape) {
    return macs / double(mac_cycles(mk2, macs, d, shape) - mk2.vertex_overhead_cycles) *
           mk2.workers_per_tile;  // multiply-accumulates per tile cycle
  };
  // float32: 16 MACs per cycle (62.5 TFLOPS), in 8 engines of depth 8.
  EXPECT_NEAR(rate(DType::f32, {}), 16, 0.01);
  EXPECT_NEAR(rate(DType::f32, {64, 64}), 16, 0.01);
  EXPECT_NEAR(rate(DType::f32, {4, 64}), 8, 0.01) << "half the depth of a load chunk";
  EXPECT_NEAR(rate(DType::f32, {12, 64}), 12, 0.01) << "depth padded to 16";
  EXPECT_NEAR(rate(DType::f32, {64, 4}), 8, 0.01) << "half the engines idle";
  // float16, half partials: 64 MACs per cycle in 16 engines of depth 16; a 3-channel input
  // (an RGB image) fills 3/16 of the depth.
  EXPECT_NEAR(rate(DType::f16, {0, 0, true}), 64, 0.01);
  EXPECT_NEAR(rate(DType::f16, {3, 64, true}), 12, 0.01);
  // Depthwise (one channel in, one out per group): the vector unit's lanes, 2 float32 or
  // 4 float16 multiply-adds per cycle, beat the nearly empty AMP.
  EXPECT_NEAR(rate(DType::f32, {1, 1}), 2, 0.01);
  EXPECT_NEAR(rate(DType::f16, {1, 1, true}), 4, 0.01);
}

TEST(Float16Memory, HalfTheBytesOnTilesAndInExchanges) {
  const std::size_t n = 4000;
  const auto run = [&](DType dtype) {
    Graph g(ArchPreset::get("tiny"));
    Tensor src = g.add_variable(dtype, {n}, "src"), dst = g.add_variable(dtype, {n}, "dst");
    g.set_tile_mapping(src, 1);
    g.set_tile_mapping(dst, 2);
    g.set_host_access(src);
    g.set_host_access(dst);
    Engine e(g, {{"p", Program::copy(src, dst)}});
    const auto values = random_floats(n, 10);
    const auto bits = half_bits(values);
    if (dtype == DType::f16)
      e.write(src, std::as_bytes(std::span(bits)));
    else
      write_floats(e, src, values);
    e.run("p");
    if (dtype == DType::f16) {
      EXPECT_EQ(read_bits(e, dst), bits);
    }
    return std::pair{e.memory().tiles[1].not_always_live, e.cycles().exchange};
  };
  const auto [bytes16, exchange16] = run(DType::f16);
  const auto [bytes32, exchange32] = run(DType::f32);
  EXPECT_EQ(bytes16, n * 2);
  EXPECT_EQ(bytes32, n * 4);
  const auto latency = ArchPreset::get("tiny").exchange_latency_cycles;
  EXPECT_EQ(2 * (exchange16 - latency), exchange32 - latency) << "bytes move, not elements";
}

}  // namespace
}  // namespace ipupod::ipu
