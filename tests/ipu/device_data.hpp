// Data helpers the device tests share: seeded random operands, and float32 transfers between
// a test and an engine's host-accessible tensors.
#pragma once

#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "ipu_process/engine.hpp"

namespace ipupod::ipu {

inline std::size_t count(const std::vector<std::size_t>& shape) {
  std::size_t n = 1;
  for (std::size_t d : shape) n *= d;
  return n;
}

// n values uniform in [lo, hi), the same for the same seed.
inline std::vector<float> random_floats(std::size_t n, unsigned seed, float lo = -1.f,
                                        float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

inline std::vector<float> read_floats(const Engine& e, const Tensor& t) {
  const auto bytes = e.read(t);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

inline void write_floats(Engine& e, const Tensor& t, const std::vector<float>& v) {
  e.write(t, std::as_bytes(std::span(v)));
}

}  // namespace ipupod::ipu
