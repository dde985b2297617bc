// Deterministic random numbers for the converters: std::mt19937_64 is fully specified by the
// standard, its distributions are not, so the mappings to uniform and normal values live here.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <random>

namespace ipupod::datasets {

// A seed for stream `stream` of a run seeded with `seed` (SplitMix64 finaliser, so that
// neighbouring streams are uncorrelated); lets samples be generated in any order or thread.
inline std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t z = seed + (stream + 1) * 0x9E3779B97F4A7C15ULL;  // golden-ratio increment
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

class Random {
 public:
  explicit Random(std::uint64_t seed) : engine_(seed) {}

  // Uniform in [0, 1) from the top 53 bits (the mantissa of a double).
  double uniform() {
    constexpr int kMantissaBits = 53;
    return static_cast<double>(engine_() >> (64 - kMantissaBits)) * 0x1.0p-53;
  }
  double uniform(double low, double high) { return low + (high - low) * uniform(); }
  // Uniform integer in [0, n); n > 0. The modulo bias is below 2^-40 for any n < 2^24.
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(engine_() % n); }
  // Standard normal (Box-Muller; the second value of each pair is kept for the next call).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = 0;
    while (u1 <= 0) u1 = uniform();
    const double u2 = uniform();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = radius * std::sin(2 * std::numbers::pi * u2);
    has_spare_ = true;
    return radius * std::cos(2 * std::numbers::pi * u2);
  }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace ipupod::datasets
