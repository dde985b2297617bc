// IEEE 754 binary16 (float16) as stored in gradient buffers, and its conversions to float32.
// Collectives widen float16 to float32, reduce, and round back once (round to nearest even).
#pragma once

#include <cstdint>
#include <span>

namespace ipupod::fabric {

// The 16 bits of one float16 value: sign, 5-bit exponent (bias 15), 10-bit mantissa.
struct Half {
  std::uint16_t bits = 0;
  friend bool operator==(Half, Half) = default;
};

// Exact (every float16 is a float32).
float to_float(Half value);
// Round to nearest, ties to even; overflow goes to infinity, float32 values below half the
// smallest float16 subnormal go to zero, NaN stays NaN (quiet) with its sign.
Half to_half(float value);

void widen(std::span<const Half> from, std::span<float> to);   // sizes must agree
void narrow(std::span<const float> from, std::span<Half> to);  // sizes must agree

}  // namespace ipupod::fabric
