// What the tensor op library's codelets (tensor_ops_codelets.cpp) and its lowering
// (tensor_ops.cpp) agree on: the MapAffine vertex's operations and parameter layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ipupod::ipu::tensor_ops_impl {

using Index = std::int64_t;

// MapAffine: out[o] = f(in0[pos0(o)], in1[pos1(o)]) where pos_i is affine in o's coordinates.
enum MapOp : int { kCopyScaled = 0, kAdd, kSub, kMul, kDiv };
// Parameter layout: [piece_begin, offset of input 0, offset of input 1 (0 with one input), op,
// scale, inputs, rank, window_axis, window_begin, window_end, shape[rank], then per input:
// strides[rank]]. The piece begin and the offsets vary with the worker slice, and come first:
// the rest, the same for every vertex of a map, is kept once per compute set
// (Codelet::shared_from).
constexpr std::size_t kMapPieceBegin = 0, kMapOffsets = 1, kMapOp = 3, kMapScale = 4,
                      kMapInputs = 5, kMapRank = 6, kMapWindow = 7, kMapHeader = 10;

// Row-major coordinates of flat element `flat` of `shape`.
inline std::vector<std::size_t> coords_of(std::size_t flat, const std::vector<std::size_t>& shape) {
  std::vector<std::size_t> c(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) c[d] = flat % shape[d], flat /= shape[d];
  return c;
}

}  // namespace ipupod::ipu::tensor_ops_impl
