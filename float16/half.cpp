// float16 <-> float32 by bit manipulation, so the result does not depend on the compiler's
// or the CPU's half-precision support. widen() and narrow() use the x86 F16C instructions when
// the CPU has them (8 values an instruction), with results bitwise identical to the scalar
// conversions, which remain the fallback (and the reference the tests compare them with).
#include "float16/half.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define IPUPOD_HALF_F16C 1
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>

namespace ipupod::float16 {
namespace {

constexpr std::uint32_t kFloatSignBit = 0x80000000U;
constexpr std::uint32_t kFloatInfinity = 0x7F800000U;
constexpr std::uint32_t kFloatMantissa = 0x007FFFFFU;
constexpr std::uint32_t kFloatImplicitOne = 0x00800000U;
constexpr int kFloatMantissaBits = 23;
constexpr int kHalfMantissaBits = 10;
constexpr int kMantissaShift = kFloatMantissaBits - kHalfMantissaBits;  // 13
constexpr std::uint32_t kHalfInfinity = 0x7C00U;
constexpr std::uint32_t kHalfQuietBit = 0x0200U;
constexpr std::uint32_t kHalfMantissa = 0x03FFU;
// Bias difference (127 - 15) placed in the float exponent field.
constexpr std::uint32_t kRebias = 112U << kFloatMantissaBits;
// 65520 = the midpoint between the largest float16 (65504) and 2^16: from here up, infinity.
constexpr std::uint32_t kHalfOverflow = 0x477FF000U;
// 2^-14, the smallest normal float16.
constexpr std::uint32_t kHalfSmallestNormal = 0x38800000U;
// 2^16: the first magnitude stochastic rounding sends to infinity whatever the draw.
constexpr std::uint32_t kHalfAlwaysInfinite = 0x47800000U;
// 2^-25, half the smallest subnormal: at or below it (tie to even = 0) the result is zero.
constexpr std::uint32_t kHalfUnderflow = 0x33000000U;

// Shifts `value` right by `shift` bits, rounding to nearest with ties to even.
std::uint32_t shift_right_rounding_to_even(std::uint32_t value, int shift) {
  const std::uint32_t kept = value >> shift;
  const std::uint32_t dropped = value & ((1U << shift) - 1U);
  const std::uint32_t halfway = 1U << (shift - 1);
  if (dropped > halfway || (dropped == halfway && (kept & 1U) != 0)) return kept + 1U;
  return kept;
}

#if defined(IPUPOD_HALF_F16C)
bool cpu_has_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return yes;
}

// A signalling NaN (exponent all ones, quiet bit clear, mantissa not zero) among 8 float16 values:
// vcvtph2ps makes it quiet, the scalar conversion keeps it as it is.
__attribute__((target("avx,f16c"))) bool any_signalling_nan(__m128i h) {
  const __m128i quiet_and_exponent = _mm_and_si128(h, _mm_set1_epi16(0x7E00));
  const __m128i signalling = _mm_cmpeq_epi16(quiet_and_exponent, _mm_set1_epi16(0x7C00));
  const __m128i mantissa = _mm_and_si128(h, _mm_set1_epi16(0x01FF));
  const __m128i nonzero =
      _mm_xor_si128(_mm_cmpeq_epi16(mantissa, _mm_setzero_si128()), _mm_set1_epi16(-1));
  return _mm_movemask_epi8(_mm_and_si128(signalling, nonzero)) != 0;
}

__attribute__((target("avx,f16c"))) std::size_t widen_f16c(const Half* from, float* to,
                                                           std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i));
    if (any_signalling_nan(h)) {
      for (std::size_t j = i; j < i + 8; ++j) to[j] = to_float(from[j]);
      continue;
    }
    _mm256_storeu_ps(to + i, _mm256_cvtph_ps(h));
  }
  return i;
}

// vcvtps2ph rounds to nearest even (imm 0), quiets NaNs keeping their sign and top mantissa
// bits, overflows to infinity and makes subnormals exactly as to_half does.
__attribute__((target("avx,f16c"))) std::size_t narrow_f16c(const float* from, Half* to,
                                                            std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(from + i), _MM_FROUND_TO_NEAREST_INT));
  return i;
}
#endif

}  // namespace

float to_float(Half value) {
  const std::uint32_t sign = static_cast<std::uint32_t>(value.bits & 0x8000U) << 16;
  const std::uint32_t exponent = (value.bits >> kHalfMantissaBits) & 0x1FU;
  const std::uint32_t mantissa = value.bits & kHalfMantissa;
  if (exponent == 0) {
    // Zero or subnormal: mantissa x 2^-24, exact in float32.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 0x1F)
    return std::bit_cast<float>(sign | kFloatInfinity | (mantissa << kMantissaShift));
  return std::bit_cast<float>(sign | ((exponent << kFloatMantissaBits) + kRebias) |
                              (mantissa << kMantissaShift));
}

Half to_half(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits & kFloatSignBit) >> 16);
  const std::uint32_t magnitude = bits & ~kFloatSignBit;
  std::uint32_t result = 0;
  if (magnitude > kFloatInfinity) {
    result = kHalfInfinity | kHalfQuietBit | ((magnitude & kFloatMantissa) >> kMantissaShift);
  } else if (magnitude >= kHalfOverflow) {
    result = kHalfInfinity;
  } else if (magnitude >= kHalfSmallestNormal) {
    // A carry out of the mantissa correctly bumps the exponent (up to infinity).
    result = shift_right_rounding_to_even(magnitude - kRebias, kMantissaShift);
  } else if (magnitude > kHalfUnderflow) {
    // Subnormal: value / 2^-24 = full mantissa x 2^(exponent - 126), rounded to an integer.
    const int exponent = static_cast<int>(magnitude >> kFloatMantissaBits);
    const std::uint32_t full = (magnitude & kFloatMantissa) | kFloatImplicitOne;
    result = shift_right_rounding_to_even(full, 126 - exponent);
  }
  return Half{static_cast<std::uint16_t>(sign | result)};
}

Half to_half_stochastic(float value, std::uint64_t random) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t magnitude = bits & ~kFloatSignBit;
  if (magnitude > kFloatInfinity) return to_half(value);  // NaN
  const auto sign = static_cast<std::uint16_t>((bits & kFloatSignBit) >> 16);
  std::uint64_t result = kHalfInfinity;
  if (magnitude < kHalfSmallestNormal) {
    // Subnormal or zero: value / 2^-24 = full mantissa x 2^-shift; the dropped bits plus as many
    // random bits carry into the kept ones with exactly the dropped fraction's probability.
    const std::uint32_t exponent = std::max<std::uint32_t>(magnitude >> kFloatMantissaBits, 1);
    const std::uint64_t full =
        (magnitude & kFloatMantissa) | (magnitude >= kFloatImplicitOne ? kFloatImplicitOne : 0);
    const std::uint32_t shift = 126 - exponent;
    // Below 2^-88 the chance of rounding up is under 2^-64: zero.
    result = shift >= 64 ? 0 : (full + (random & ((std::uint64_t{1} << shift) - 1U))) >> shift;
  } else if (magnitude < kHalfAlwaysInfinite) {
    // A carry out of the mantissa bumps the exponent, up to infinity from just below 2^16.
    const std::uint32_t dropped_bits = (1U << kMantissaShift) - 1U;
    result = ((magnitude - kRebias) + (static_cast<std::uint32_t>(random) & dropped_bits)) >>
             kMantissaShift;
  }
  return Half{static_cast<std::uint16_t>(sign | result)};
}

void widen(std::span<const Half> from, std::span<float> to) {
  if (from.size() != to.size()) {
    throw std::invalid_argument("widen: " + std::to_string(from.size()) + " float16 values into " +
                                std::to_string(to.size()) + " float32 slots; sizes must agree");
  }
  std::size_t done = 0;
#if defined(IPUPOD_HALF_F16C)
  if (cpu_has_f16c()) done = widen_f16c(from.data(), to.data(), from.size());
#endif
  for (std::size_t i = done; i < from.size(); ++i) to[i] = to_float(from[i]);
}

void narrow(std::span<const float> from, std::span<Half> to) {
  if (from.size() != to.size()) {
    throw std::invalid_argument("narrow: " + std::to_string(from.size()) + " float32 values into " +
                                std::to_string(to.size()) + " float16 slots; sizes must agree");
  }
  std::size_t done = 0;
#if defined(IPUPOD_HALF_F16C)
  if (cpu_has_f16c()) done = narrow_f16c(from.data(), to.data(), from.size());
#endif
  for (std::size_t i = done; i < from.size(); ++i) to[i] = to_half(from[i]);
}

}  // namespace ipupod::float16
