// IEEE 754 binary16 (float16) as stored in gradient buffers and tile memory, and its conversions
// to float32: round to nearest even (collectives, the device's default) or stochastic rounding.
#pragma once

#include <cstdint>
#include <span>

namespace ipupod::float16 {

// The 16 bits of one float16 value: sign, 5-bit exponent (bias 15), 10-bit mantissa.
struct Half {
  std::uint16_t bits = 0;
  friend bool operator==(Half, Half) = default;
};
static_assert(sizeof(Half) == 2, "spans of Half are float16 arrays");

// Exact (every float16 is a float32).
float to_float(Half value);
// Round to nearest, ties to even; overflow goes to infinity, float32 values below half the
// smallest float16 subnormal go to zero, NaN stays NaN (quiet) with its sign.
Half to_half(float value);
// Stochastic rounding: a value between two neighbouring float16 values lo < |value| < hi goes to
// hi with probability (|value| - lo) / (hi - lo), so the rounding is unbiased on average. The
// low bits of `random` (uniform) decide; float16 values and NaN convert exactly as to_half.
// Magnitudes from 65504 up to 2^16 may round to infinity, 2^16 and above always do.
Half to_half_stochastic(float value, std::uint64_t random);

// Sizes must agree (std::invalid_argument otherwise).
void widen(std::span<const Half> from, std::span<float> to);
void narrow(std::span<const float> from, std::span<Half> to);

}  // namespace ipupod::float16
