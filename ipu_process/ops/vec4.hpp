// Four floats in one SIMD register (GCC's vector extension), for codelet kernels: lane by lane
// the same IEEE operations as the scalar loops, so contiguous runs give the same bits four at a
// time.
#pragma once

#include <cstring>

namespace ipupod::ipu::ops {

using Vec4 = float __attribute__((vector_size(16)));

inline Vec4 load4(const float* p) {
  Vec4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store4(float* p, Vec4 v) {
  std::memcpy(p, &v, sizeof v);
}

}  // namespace ipupod::ipu::ops
