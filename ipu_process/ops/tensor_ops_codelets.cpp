// The tensor op library's codelets: MapAffine (strided elementwise maps), unary functions and
// their gradients, casts, random masks, and their cycle estimators.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>

#include "float16/half.hpp"
#include "ipu_process/codelets.hpp"
#include "ipu_process/ops/common.hpp"
#include "ipu_process/ops/elementwise.hpp"
#include "ipu_process/ops/tensor_ops.hpp"
#include "ipu_process/ops/tensor_ops_internal.hpp"
#include "ipu_process/ops/vec4.hpp"

namespace ipupod::ipu {
namespace {

using namespace tensor_ops_impl;  // NOLINT(google-build-using-namespace): shared with its codelets

using ops::load4;
using ops::store4;
using ops::Vec4;

// dst[j] = f(a[j * sa], b[j * sb]) for j in [0, n); f takes floats or Vec4s.
template <class F>
void map_run(float* dst, std::size_t n, const float* a, Index sa, const float* b, Index sb, F f) {
  if (sa == 1 && sb == 1) {
    std::size_t j = 0;
    for (; j + 4 <= n; j += 4) store4(dst + j, f(load4(a + j), load4(b + j)));
    for (; j < n; ++j) dst[j] = f(a[j], b[j]);
  } else if (sa == 1 && sb == 0) {
    const float bv = b[0];
    std::size_t j = 0;
    for (; j + 4 <= n; j += 4) store4(dst + j, f(load4(a + j), Vec4{} + bv));
    for (; j < n; ++j) dst[j] = f(a[j], bv);
  } else if (sa == 0 && sb == 1) {
    const float av = a[0];
    std::size_t j = 0;
    for (; j + 4 <= n; j += 4) store4(dst + j, f(Vec4{} + av, load4(b + j)));
    for (; j < n; ++j) dst[j] = f(av, b[j]);
  } else {
    for (std::size_t j = 0; j < n; ++j)
      dst[j] = f(a[static_cast<Index>(j) * sa], b[static_cast<Index>(j) * sb]);
  }
}

void map_affine(const VertexContext& c) {
  const int op = static_cast<int>(c.param(kMapOp));
  const float scale = static_cast<float>(c.param(kMapScale));
  const std::size_t inputs = c.size_param(kMapInputs), rank = c.size_param(kMapRank);
  const std::size_t waxis = c.size_param(kMapWindow), wb = c.size_param(kMapWindow + 1),
                    we = c.size_param(kMapWindow + 2);
  // Per-thread scratch: no allocation per call once the largest rank has been seen.
  thread_local std::vector<std::size_t> shape, coord;
  thread_local std::vector<Index> stride[2];
  shape.resize(rank);
  for (std::size_t d = 0; d < rank; ++d) shape[d] = c.size_param(kMapHeader + d);
  const float* in[2] = {nullptr, nullptr};
  Index offset[2] = {0, 0};
  stride[0].assign(rank, 0);
  stride[1].assign(rank, 0);
  std::size_t p = kMapHeader + rank;
  for (std::size_t i = 0; i < inputs; ++i) {
    in[i] = c.region<const float>(i).data();
    offset[i] = static_cast<Index>(c.param(kMapOffsets + i));
    for (std::size_t d = 0; d < rank; ++d) stride[i][d] = static_cast<Index>(c.param(p++));
  }
  if (inputs == 1) in[1] = in[0];
  auto out = c.region<float>(inputs);
  coord.resize(rank);
  for (std::size_t d = rank, rem = c.size_param(kMapPieceBegin); d-- > 0;)
    coord[d] = rem % shape[d], rem /= shape[d];
  const std::size_t last = rank - 1;
  for (std::size_t o = 0; o < out.size();) {
    const std::size_t run = std::min(shape[last] - coord[last], out.size() - o);
    std::size_t lo = 0, hi = run;
    if (waxis == last) {
      lo = wb > coord[last] ? wb - coord[last] : 0;
      hi = std::min(run, we > coord[last] ? we - coord[last] : 0);
    } else if (waxis < rank && (coord[waxis] < wb || coord[waxis] >= we)) {
      hi = 0;
    }
    if (lo < hi) {
      Index pos[2] = {offset[0], offset[1]};
      for (std::size_t i = 0; i < 2; ++i)
        for (std::size_t d = 0; d < rank; ++d)
          pos[i] += static_cast<Index>(coord[d] + (d == last ? lo : 0)) * stride[i][d];
      const float* a = in[0] + pos[0];
      const float* b = in[1] + (inputs == 1 ? pos[0] : pos[1]);
      const Index sa = stride[0][last], sb = inputs == 1 ? sa : stride[1][last];
      float* dst = out.data() + o + lo;
      const std::size_t n = hi - lo;
      switch (op) {
        case kCopyScaled:
          map_run(dst, n, a, sa, b, sb, [scale](auto x, auto) { return x * scale; });
          break;
        case kAdd:
          map_run(dst, n, a, sa, b, sb, [](auto x, auto y) { return x + y; });
          break;
        case kSub:
          map_run(dst, n, a, sa, b, sb, [](auto x, auto y) { return x - y; });
          break;
        case kMul:
          map_run(dst, n, a, sa, b, sb, [](auto x, auto y) { return x * y; });
          break;
        case kDiv:
          map_run(dst, n, a, sa, b, sb, [](auto x, auto y) { return x / y; });
          break;
        default:
          throw std::logic_error("MapAffine: unknown op " + std::to_string(op));
      }
    }
    o += run;
    coord[last] += run;
    for (std::size_t d = last; d > 0 && coord[d] >= shape[d]; --d)
      coord[d] -= shape[d], ++coord[d - 1];
  }
}

constexpr float kSqrt1_2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
constexpr float k2OverSqrtPi = 1.12837916709551257390f;  // erf'(x) = 2 / sqrt(pi) e^(-x^2)

float sigmoid(float x) {
  return 1.f / (1.f + std::exp(-x));
}

float unary_value(ops::UnaryOp fn, float x, float alpha) {
  using ops::UnaryOp;
  switch (fn) {
    case UnaryOp::gelu:
      return 0.5f * x * (1.f + std::erf(x * kSqrt1_2));
    case UnaryOp::silu:
      return x * sigmoid(x);
    case UnaryOp::sigmoid:
      return sigmoid(x);
    case UnaryOp::tanh:
      return std::tanh(x);
    case UnaryOp::leaky_relu:
      return x > 0 ? x : alpha * x;
    case UnaryOp::sqrt:
      return std::sqrt(x);
    case UnaryOp::rsqrt:
      return 1.f / std::sqrt(x);
    case UnaryOp::exp:
      return std::exp(x);
    case UnaryOp::log:
      return std::log(x);
    case UnaryOp::square:
      return x * x;
    case UnaryOp::abs:
      return std::abs(x);
    case UnaryOp::neg:
      return -x;
    case UnaryOp::erf:
      return std::erf(x);
  }
  return 0;
}

float unary_derivative(ops::UnaryOp fn, float x, float alpha) {
  using ops::UnaryOp;
  switch (fn) {
    case UnaryOp::gelu:
      return 0.5f * (1.f + std::erf(x * kSqrt1_2)) + x * kInvSqrt2Pi * std::exp(-0.5f * x * x);
    case UnaryOp::silu: {
      const float s = sigmoid(x);
      return s * (1.f + x * (1.f - s));
    }
    case UnaryOp::sigmoid: {
      const float s = sigmoid(x);
      return s * (1.f - s);
    }
    case UnaryOp::tanh: {
      const float t = std::tanh(x);
      return 1.f - t * t;
    }
    case UnaryOp::leaky_relu:
      return x > 0 ? 1.f : alpha;
    case UnaryOp::sqrt:
      return 0.5f / std::sqrt(x);
    case UnaryOp::rsqrt:
      return -0.5f / (x * std::sqrt(x));
    case UnaryOp::exp:
      return std::exp(x);
    case UnaryOp::log:
      return 1.f / x;
    case UnaryOp::square:
      return 2.f * x;
    case UnaryOp::abs:
      return x > 0 ? 1.f : (x < 0 ? -1.f : 0.f);
    case UnaryOp::neg:
      return -1.f;
    case UnaryOp::erf:
      return k2OverSqrtPi * std::exp(-x * x);
  }
  return 0;
}

// Instructions per vector a unary function costs: transcendental ones go through the
// multi-instruction function units, the rest are single ALU operations.
std::size_t unary_instructions(ops::UnaryOp fn) {
  using ops::UnaryOp;
  switch (fn) {
    case UnaryOp::gelu:
    case UnaryOp::erf:
    case UnaryOp::silu:
    case UnaryOp::sigmoid:
    case UnaryOp::tanh:
    case UnaryOp::exp:
    case UnaryOp::log:
      return 4;
    case UnaryOp::sqrt:
    case UnaryOp::rsqrt:
      return 2;
    default:
      return 1;
  }
}

// The key of this invocation of a counter-based draw: the seed (params seed_param and
// seed_param + 1, high and low 32 bits) and the tile's invocation counter (field counter_field).
std::uint64_t invocation_key(const VertexContext& c, std::size_t seed_param,
                             std::size_t counter_field) {
  const std::uint64_t seed =
      (static_cast<std::uint64_t>(c.size_param(seed_param)) << 32) | c.size_param(seed_param + 1);
  const std::uint64_t invocation = c.region<const std::uint32_t>(counter_field)[0];
  return counter_hash(seed ^ counter_hash(invocation + 0x51ed27));
}

// Cycles of a cast vertex: `instructions` per float16 vector of its input.
std::uint64_t cast_cycles(const Vertex& v, const ArchPreset& a, std::size_t instructions) {
  return vector_cycles(a, v.fields[0][0].elements(), instructions, DType::f16);
}

// A codelet that converts its "in" field into its "out" field with float16::widen or narrow
// (8 values an instruction where the CPU has F16C), float16 seen as its 16-bit storage.
template <class From, class To, class Convert>
Codelet cast_codelet(std::string name, std::string doc, Convert convert) {
  return {std::move(name),
          std::move(doc),
          {"in", "out"},
          [convert](const VertexContext& c) {
            auto in = c.region<const From>(0);
            auto out = c.region<To>(1);
            convert(in, out);
          },
          [](const Vertex& v, const ArchPreset& a) { return cast_cycles(v, a, 1); },
          {"out"},
          true,
          {"in", "out"}};
}

std::uint64_t out_field_cycles(const Vertex& v, const ArchPreset& a, std::size_t field,
                               std::size_t instructions) {
  return vector_cycles(a, v.fields[field][0].elements(), instructions, v.fields[field][0].dtype());
}

}  // namespace

void register_tensor_codelets(CodeletRegistry& r) {
  const auto map_cycles = [](const Vertex& v, const ArchPreset& a) {
    const std::size_t inputs = static_cast<std::size_t>(v.params[kMapInputs]);
    return out_field_cycles(v, a, inputs, inputs + 1);
  };
  // Without a window every element of the out piece is written; with one, only those inside
  // it (a concat's other inputs fill the rest), so liveness may not take `out` as overwritten.
  for (const bool windowed : {false, true})
    r.add({windowed ? "MapAffineWindow" : "MapAffine",
           "out = scale * in[affine(o)] over the out piece (broadcast, slice, or, "
           "windowed, concat and slice-gradient windows); params: piece begin, offset of in, 0, "
           "op, scale, inputs (1), rank, window, shape, strides of in; piece begin and offset "
           "by worker slice",
           {"in", "out"},
           map_affine,
           map_cycles,
           windowed ? std::vector<std::string>{} : std::vector<std::string>{"out"},
           false,
           {"in", "out"},
           {kMapPieceBegin, kMapOffsets},
           Codelet::kSharedToEnd,
           kMapOp});
  r.add({"MapAffineBinary",
         "out = a[affine(o)] op b[affine(o)] over the out piece (NumPy broadcasting); params: "
         "piece begin, offsets of a and b, op, scale, inputs (2), rank, window, shape, strides of "
         "a and b; piece begin and offsets by worker slice",
         {"a", "b", "out"},
         map_affine,
         map_cycles,
         {"out"},
         false,
         {"a", "b", "out"},
         {kMapPieceBegin, kMapOffsets, kMapOffsets + 1},
         Codelet::kSharedToEnd,
         kMapOp});
  r.add({"Unary",
         "out = f(x); params: function, alpha",
         {"x", "out"},
         [](const VertexContext& c) {
           const auto fn = static_cast<ops::UnaryOp>(c.size_param(0));
           const float alpha = static_cast<float>(c.param(1));
           auto x = c.region<const float>(0);
           auto out = c.region<float>(1);
           for (std::size_t i = 0; i < x.size(); ++i) out[i] = unary_value(fn, x[i], alpha);
         },
         [](const Vertex& v, const ArchPreset& a) {
           return out_field_cycles(v, a, 1,
                                   unary_instructions(static_cast<ops::UnaryOp>(v.params[0])));
         },
         {"out"},
         false,
         {"x", "out"}});
  r.add({"UnaryGrad",
         "dx = dy * f'(x); params: function, alpha",
         {"dy", "x", "dx"},
         [](const VertexContext& c) {
           const auto fn = static_cast<ops::UnaryOp>(c.size_param(0));
           const float alpha = static_cast<float>(c.param(1));
           auto dy = c.region<const float>(0);
           auto x = c.region<const float>(1);
           auto dx = c.region<float>(2);
           for (std::size_t i = 0; i < x.size(); ++i)
             dx[i] = dy[i] * unary_derivative(fn, x[i], alpha);
         },
         [](const Vertex& v, const ArchPreset& a) {
           return out_field_cycles(v, a, 2,
                                   1 + unary_instructions(static_cast<ops::UnaryOp>(v.params[0])));
         },
         {"dx"},
         false,
         {"dy", "x", "dx"}});
  r.add({"ReducePartial",
         "partial[out(x) - lo] += x over the piece (partial zeroed first); params: rank, piece "
         "begin, lo (per worker slice), shape, output strides (0 on reduced axes)",
         {"x", "partial"},
         [](const VertexContext& c) {
           auto x = c.region<const float>(0);
           auto partial = c.region<float>(1);
           const std::size_t rank = c.size_param(0);
           const Index lo = static_cast<Index>(c.param(2));
           std::vector<std::size_t> shape(rank), coord(rank);
           std::vector<Index> stride(rank);
           for (std::size_t d = 0; d < rank; ++d) {
             shape[d] = c.size_param(3 + d);
             stride[d] = static_cast<Index>(c.param(3 + rank + d));
           }
           std::size_t rem = c.size_param(1);
           for (std::size_t d = rank; d-- > 0;) coord[d] = rem % shape[d], rem /= shape[d];
           std::fill(partial.begin(), partial.end(), 0.f);
           const std::size_t last = rank - 1;
           for (std::size_t i = 0; i < x.size();) {
             const std::size_t run = std::min(shape[last] - coord[last], x.size() - i);
             Index pos = -lo;
             for (std::size_t d = 0; d < rank; ++d) pos += static_cast<Index>(coord[d]) * stride[d];
             float* dst = partial.data() + pos;
             if (stride[last] == 0) {
               float acc = 0.f;
               for (std::size_t j = 0; j < run; ++j) acc += x[i + j];
               dst[0] += acc;
             } else {
               for (std::size_t j = 0; j < run; ++j)
                 dst[static_cast<Index>(j) * stride[last]] += x[i + j];
             }
             i += run;
             coord[last] += run;
             for (std::size_t d = last; d > 0 && coord[d] >= shape[d]; --d)
               coord[d] -= shape[d], ++coord[d - 1];
           }
         },
         [](const Vertex& v, const ArchPreset& a) { return out_field_cycles(v, a, 0, 1); },
         {"partial"},
         false,
         {"x", "partial"},
         {1, 2}});
  r.add({"SumRegions",
         "out = scale * sum of the regions, region k added at out offset k; params: scale, "
         "offsets",
         {"regions", "out"},
         [](const VertexContext& c) {
           auto out = c.region<float>(1);
           std::fill(out.begin(), out.end(), 0.f);
           for (std::size_t k = 0; k < c.regions(0); ++k) {
             auto r = c.region<const float>(0, k);
             float* dst = out.data() + c.size_param(1 + k);
             for (std::size_t i = 0; i < r.size(); ++i) dst[i] += r[i];
           }
           const float scale = static_cast<float>(c.param(0));
           if (scale != 1.f)
             for (float& o : out) o *= scale;
         },
         [](const Vertex& v, const ArchPreset& a) {
           std::size_t n = 0;
           for (const auto& t : v.fields[0]) n += t.elements();
           return vector_cycles(a, n + v.fields[1][0].elements(), 1);
         },
         {"out"}});
  r.add({"RandomMask",
         "out[i] = u(seed, invocation, begin + i) >= p ? 1 / (1 - p) : 0 with a counter-based "
         "generator; params: p, seed high and low 32 bits, piece begin",
         {"out", "invocation"},
         [](const VertexContext& c) {
           auto out = c.region<float>(0);
           const double p = c.param(0);
           const std::uint64_t key = invocation_key(c, 1, 1);
           const std::uint64_t begin = c.size_param(3);
           const float keep = static_cast<float>(1.0 / (1.0 - p));
           for (std::size_t i = 0; i < out.size(); ++i) {
             const double u = static_cast<double>(counter_hash(key + begin + i) >> 11) * 0x1.0p-53;
             out[i] = u >= p ? keep : 0.f;
           }
         },
         [](const Vertex& v, const ArchPreset& a) { return out_field_cycles(v, a, 0, 4); }});
  r.add(cast_codelet<float16::Half, float>(
      "CastToFloat", "out = in, float16 widened to float32 (exact)",
      [](std::span<const float16::Half> in, std::span<float> out) { float16::widen(in, out); }));
  r.add(cast_codelet<float, float16::Half>(
      "CastToHalf", "out = in, float32 rounded to float16 to nearest, ties to even",
      [](std::span<const float> in, std::span<float16::Half> out) { float16::narrow(in, out); }));
  r.add({"CastToHalfStochastic",
         "out = in, float32 rounded to float16 stochastically (unbiased) by a counter-based "
         "generator keyed by (seed, invocation, begin + i); params: seed high and low 32 bits, "
         "piece begin",
         {"in", "out", "invocation"},
         [](const VertexContext& c) {
           auto in = c.region<const float>(0);
           auto out = c.region<std::uint16_t>(1);
           const std::uint64_t key = invocation_key(c, 0, 2);
           const std::uint64_t begin = c.size_param(2);
           for (std::size_t i = 0; i < in.size(); ++i)
             out[i] = float16::to_half_stochastic(in[i], counter_hash(key + begin + i)).bits;
         },
         // The draw costs about as much as the random mask's.
         [](const Vertex& v, const ArchPreset& a) { return cast_cycles(v, a, 4); },
         {"out"},
         true,
         {"in", "out"},
         {2}});
  r.add({"IncrementCounter",
         "counter += 1 (uint32)",
         {"counter"},
         [](const VertexContext& c) {
           for (auto& x : c.region<std::uint32_t>(0)) ++x;
         },
         [](const Vertex& v, const ArchPreset& a) { return out_field_cycles(v, a, 0, 1); }});
}

}  // namespace ipupod::ipu
