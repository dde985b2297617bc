// float16 conversions: exhaustive round trips, round-to-nearest-even at every midpoint, and
// stochastic rounding: exact on float16 values, always a neighbour, unbiased on average.
#include "float16/half.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace ipupod::float16 {
namespace {

bool is_nan_bits(std::uint16_t bits) {
  return (bits & 0x7C00U) == 0x7C00U && (bits & 0x03FFU) != 0;
}

TEST(Half, EveryFloat16SurvivesARoundTripThroughFloat32) {
  for (std::uint32_t bits = 0; bits <= 0xFFFFU; ++bits) {
    const Half h{static_cast<std::uint16_t>(bits)};
    const Half back = to_half(to_float(h));
    if (is_nan_bits(h.bits)) {
      EXPECT_TRUE(std::isnan(to_float(h))) << bits;
      EXPECT_TRUE(is_nan_bits(back.bits)) << bits;
      EXPECT_EQ(back.bits & 0x8000U, h.bits & 0x8000U) << "NaN keeps its sign";
    } else {
      EXPECT_EQ(back.bits, h.bits) << "float16 bits " << bits;
    }
  }
}

TEST(Half, KnownValues) {
  EXPECT_EQ(to_half(1.0F).bits, 0x3C00U);
  EXPECT_EQ(to_half(-2.0F).bits, 0xC000U);
  EXPECT_EQ(to_half(65504.0F).bits, 0x7BFFU);
  EXPECT_EQ(to_half(std::ldexp(1.0F, -24)).bits, 0x0001U);  // smallest subnormal
  EXPECT_EQ(to_half(std::ldexp(1.0F, -14)).bits, 0x0400U);  // smallest normal
  EXPECT_EQ(to_half(-0.0F).bits, 0x8000U);
  EXPECT_EQ(to_half(std::numeric_limits<float>::infinity()).bits, 0x7C00U);
  EXPECT_EQ(to_half(1e9F).bits, 0x7C00U);
  EXPECT_EQ(to_half(-1e9F).bits, 0xFC00U);
  EXPECT_EQ(to_half(65520.0F).bits, 0x7C00U) << "the midpoint above 65504 ties to even: infinity";
  EXPECT_EQ(to_half(65519.99F).bits, 0x7BFFU);
  EXPECT_EQ(to_half(std::ldexp(1.0F, -25)).bits, 0x0000U)
      << "half the smallest subnormal ties to 0";
  EXPECT_EQ(to_half(std::ldexp(1.5F, -25)).bits, 0x0001U);
  EXPECT_EQ(to_half(1e-10F).bits, 0x0000U);
  EXPECT_FLOAT_EQ(to_float(Half{0x3555U}), 0.333251953125F);
}

// Between two neighbouring float16 values a and b (b = next up), the float32 midpoint rounds
// to whichever has an even mantissa; one float32 step either side rounds to the nearer.
TEST(Half, RoundsToNearestEvenAtEveryMidpoint) {
  for (std::uint32_t bits = 0; bits < 0x7BFFU; ++bits) {
    const Half a{static_cast<std::uint16_t>(bits)};
    const Half b{static_cast<std::uint16_t>(bits + 1)};
    const float low = to_float(a);
    const float high = to_float(b);
    const float middle = low + (high - low) / 2.0F;  // exact: float32 has 13 more mantissa bits
    ASSERT_GT(middle, low);
    ASSERT_LT(middle, high);
    const Half even = (bits % 2 == 0) ? a : b;
    EXPECT_EQ(to_half(middle).bits, even.bits) << "midpoint above float16 bits " << bits;
    EXPECT_EQ(to_half(std::nextafter(middle, 0.0F)).bits, a.bits);
    EXPECT_EQ(to_half(std::nextafter(middle, 1e9F)).bits, b.bits);
    EXPECT_EQ(to_half(-middle).bits, even.bits | 0x8000U) << "negative values mirror";
  }
}

// The mean of n stochastic roundings of x, with uniform 64-bit draws.
double mean_of_stochastic(float x, int n, std::uint64_t seed) {
  std::mt19937_64 draw(seed);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += to_float(to_half_stochastic(x, draw()));
  return sum / n;
}

TEST(HalfStochastic, EveryFloat16StaysExactWhateverTheDraw) {
  std::mt19937_64 draw(7);
  for (std::uint32_t bits = 0; bits <= 0xFFFFU; ++bits) {
    const Half h{static_cast<std::uint16_t>(bits)};
    if (is_nan_bits(h.bits)) {
      EXPECT_TRUE(is_nan_bits(to_half_stochastic(to_float(h), draw()).bits)) << bits;
      continue;
    }
    for (std::uint64_t r : {std::uint64_t{0}, ~std::uint64_t{0}, draw()})
      ASSERT_EQ(to_half_stochastic(to_float(h), r).bits, h.bits) << "float16 bits " << bits;
  }
}

// Between neighbours lo < x < hi, every draw gives lo or hi: the smallest draw lo, the largest hi.
TEST(HalfStochastic, RoundsToOneOfTheTwoNeighbours) {
  std::mt19937_64 draw(11);
  for (std::uint32_t bits = 0; bits < 0x7BFFU; bits += 7) {
    const Half a{static_cast<std::uint16_t>(bits)}, b{static_cast<std::uint16_t>(bits + 1)};
    const float x = to_float(a) + (to_float(b) - to_float(a)) * 0.3F;
    ASSERT_EQ(to_half_stochastic(x, 0).bits, a.bits) << bits;
    ASSERT_EQ(to_half_stochastic(x, ~std::uint64_t{0}).bits, b.bits) << bits;
    ASSERT_EQ(to_half_stochastic(-x, ~std::uint64_t{0}).bits, b.bits | 0x8000U) << "sign mirrors";
    for (int i = 0; i < 8; ++i) {
      const std::uint16_t got = to_half_stochastic(x, draw()).bits;
      ASSERT_TRUE(got == a.bits || got == b.bits) << bits;
    }
  }
}

// The point of stochastic rounding: the mean of many roundings of a value between two float16
// neighbours converges to the value, where rounding to nearest always gives the same neighbour.
TEST(HalfStochastic, IsUnbiasedWhereRoundingToNearestIsNot) {
  const int n = 200000;
  // 1 + 0.3 ulp (normal); 0.3 and 43.2 times the smallest subnormal; 2^-30, far below it.
  for (const float x : {1.0F + 0.3F * std::ldexp(1.0F, -10), 0.3F * std::ldexp(1.0F, -24),
                        -43.2F * std::ldexp(1.0F, -24), std::ldexp(1.0F, -30)}) {
    const double low = to_float(to_half_stochastic(x, 0));
    const double high = to_float(to_half_stochastic(x, ~std::uint64_t{0}));
    // The standard error of the mean of a two-point draw is at most |high - low| / (2 sqrt(n)).
    const double five_sigma = 5 * std::abs(high - low) / (2 * std::sqrt(double(n)));
    EXPECT_NEAR(mean_of_stochastic(x, n, 99), x, five_sigma) << "x = " << x;
    EXPECT_GT(std::abs(to_float(to_half(x)) - x), five_sigma)
        << "rounding to nearest is biased at x = " << x;
  }
}

TEST(HalfStochastic, OverflowsOnlyFromTheTopBinade) {
  EXPECT_EQ(to_half_stochastic(65504.0F, ~std::uint64_t{0}).bits, 0x7BFFU);
  EXPECT_EQ(to_half_stochastic(65530.0F, 0).bits, 0x7BFFU);
  EXPECT_EQ(to_half_stochastic(65530.0F, ~std::uint64_t{0}).bits, 0x7C00U);
  EXPECT_EQ(to_half_stochastic(65536.0F, 0).bits, 0x7C00U);
  EXPECT_EQ(to_half_stochastic(-1e9F, 0).bits, 0xFC00U);
  EXPECT_EQ(to_half_stochastic(std::numeric_limits<float>::infinity(), 0).bits, 0x7C00U);
}

TEST(Half, WidenAndNarrowCheckSizes) {
  std::vector<Half> h(3);
  std::vector<float> f(2);
  EXPECT_THROW(widen(h, f), std::invalid_argument);
  EXPECT_THROW(narrow(f, h), std::invalid_argument);
  std::vector<float> values{1.0F, 0.5F, -3.25F};
  narrow(values, h);
  std::vector<float> back(3);
  widen(h, back);
  EXPECT_EQ(back, values);
}

// widen() and narrow() (8 values an instruction where the CPU has F16C) give exactly the bits
// of the scalar conversions: every float16, including signalling NaNs among ordinary values.
TEST(Half, WidenIsBitwiseTheScalarConversionForEveryFloat16) {
  std::vector<Half> all(1U << 16);
  for (std::uint32_t b = 0; b < all.size(); ++b) all[b].bits = static_cast<std::uint16_t>(b);
  // Lengths that end mid-block too, from every offset of an 8-value block.
  for (const std::size_t offset : {0U, 3U}) {
    const std::span<const Half> from = std::span(all).subspan(offset, all.size() - offset - 2);
    std::vector<float> to(from.size());
    widen(from, to);
    for (std::size_t i = 0; i < from.size(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(to[i]),
                std::bit_cast<std::uint32_t>(to_float(from[i])))
          << "float16 bits " << from[i].bits;
  }
}

// For every sign, float32 exponent and top 10 mantissa bits (what float16 keeps), with low bits
// at and around the rounding point's ties and random ones.
TEST(Half, NarrowIsBitwiseTheScalarConversionForEveryFloat32Neighbourhood) {
  std::mt19937 rng(16);
  std::vector<std::uint32_t> lows = {0, 1, 2, 0x0FFF, 0x1000, 0x1001, 0x1FFE, 0x1FFF};
  for (int i = 0; i < 8; ++i) lows.push_back(rng() & 0x1FFFU);
  std::vector<float> from(lows.size() << 10);
  std::vector<Half> to(from.size() + 5);
  for (std::uint32_t top = 0; top < (1U << 9); ++top) {  // sign and exponent
    for (std::uint32_t m = 0; m < (1U << 10); ++m)
      for (std::size_t l = 0; l < lows.size(); ++l)
        from[(m * lows.size()) + l] = std::bit_cast<float>((top << 23) | (m << 13) | lows[l]);
    const std::span<const float> in = std::span(from).subspan(top % 8);  // every alignment
    const std::span<Half> out = std::span(to).subspan(0, in.size());
    narrow(in, out);
    for (std::size_t i = 0; i < in.size(); ++i)
      ASSERT_EQ(out[i].bits, to_half(in[i]).bits)
          << "float32 bits " << std::bit_cast<std::uint32_t>(in[i]);
  }
}

}  // namespace
}  // namespace ipupod::float16
