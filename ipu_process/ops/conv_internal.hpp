// What the convolution's codelets, planner and lowering share (nothing outside ops/conv_*.cpp
// includes this): the geometry the codelets read, one convolution's dimensions, the plans.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "ipu_process/codelets.hpp"
#include "ipu_process/ops/conv.hpp"

namespace ipupod::ipu::ops::conv_impl {

using Index = std::ptrdiff_t;

inline Index signed_of(std::size_t v) {
  return static_cast<Index>(v);
}

// The geometry every convolution codelet reads from its first parameters.
struct ConvGeometry {
  std::size_t h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl;
  // For the cycle estimates only: a group's input and output channels (how the convolution
  // fills the AMP) and whether its partial sums are float16.
  std::size_t cig, cog, half_partials;
  static constexpr std::size_t kParams = 15;
  static ConvGeometry read(const VertexContext& c) {
    ConvGeometry g{};
    std::size_t* f[] = {&g.h,  &g.w,  &g.oh, &g.ow, &g.kh,  &g.kw,  &g.sh,           &g.sw,
                        &g.dh, &g.dw, &g.pt, &g.pl, &g.cig, &g.cog, &g.half_partials};
    for (std::size_t i = 0; i < kParams; ++i) *f[i] = c.size_param(i);
    return g;
  }
  void append(std::vector<double>& p) const {
    for (std::size_t v : {h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl, cig, cog, half_partials})
      p.push_back(static_cast<double>(v));
  }
  // The AMP shape of each pass (see AmpShape), from a vertex's parameters.
  static AmpShape forward_shape(const Vertex& v) { return {v.params[12], v.params[13], half(v)}; }
  static AmpShape grad_input_shape(const Vertex& v) {
    return {v.params[13], v.params[12], half(v)};
  }
  // The weight update sums over the batch and the field (deep); each product feeds a group's
  // output channels.
  static AmpShape grad_weight_shape(const Vertex& v) { return {0, v.params[13], half(v)}; }

 private:
  static bool half(const Vertex& v) { return v.params[14] != 0; }
};

inline std::size_t ceil_div(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

// Whether a block of bn samples x bc channels x br rows of an [n, channels, rows, width]
// tensor is one run of its elements (NCHW): a block that cuts the rows must be of one channel
// of one sample, and one that cuts the channels of one sample.
inline bool block_is_one_run(std::size_t bn, std::size_t bc, std::size_t br, std::size_t channels,
                             std::size_t rows) {
  return (br >= rows || (bc == 1 && bn == 1)) && (bc >= channels || bn == 1);
}

// Everything about one convolution in the forward direction's terms (x -> y).
struct Dims {
  std::size_t n, ci, h, w, co, kh, kw, oh, ow, groups, cig, cog, taps;
  ConvParams p;
  // The operands' type and the partials', for the planner's cycles (as the vertices cost them).
  DType dtype = DType::f32;
  bool half_partials = false;
  ConvGeometry geometry(bool half_partials) const {
    return {h,         w,          oh,         ow,           kh,
            kw,        p.stride_h, p.stride_w, p.dilation_h, p.dilation_w,
            p.pad_top, p.pad_left, cig,        cog,          half_partials ? 1u : 0u};
  }
  // Input rows [first, end) that output rows [r0, r1) read, clipped to the image.
  std::pair<std::size_t, std::size_t> input_rows(std::size_t r0, std::size_t r1) const {
    const Index lo = signed_of(r0 * p.stride_h) - signed_of(p.pad_top);
    const Index hi =
        signed_of((r1 - 1) * p.stride_h + (kh - 1) * p.dilation_h + 1) - signed_of(p.pad_top);
    const Index b = std::clamp<Index>(lo, 0, signed_of(h)),
                e = std::clamp<Index>(hi, 0, signed_of(h));
    if (b >= e) return {0, std::min<std::size_t>(h, 1)};  // all padding: never read
    return {static_cast<std::size_t>(b), static_cast<std::size_t>(e)};
  }
  // Output rows [first, end) whose taps land in input rows [r0, r1).
  std::pair<std::size_t, std::size_t> output_rows(std::size_t r0, std::size_t r1) const {
    const Index s = signed_of(p.stride_h);
    const Index lo_num = signed_of(r0 + p.pad_top) - signed_of((kh - 1) * p.dilation_h);
    const Index lo = lo_num <= 0 ? 0 : (lo_num + s - 1) / s;
    const Index hi = (signed_of(r1 - 1 + p.pad_top)) / s + 1;
    const Index b = std::clamp<Index>(lo, 0, signed_of(oh)),
                e = std::clamp<Index>(hi, 0, signed_of(oh));
    if (b >= e) return {0, std::min<std::size_t>(oh, 1)};  // no tap lands here
    return {static_cast<std::size_t>(b), static_cast<std::size_t>(e)};
  }
  // Input channels of the groups that output channels [o0, o1) belong to.
  std::pair<std::size_t, std::size_t> input_channels(std::size_t o0, std::size_t o1) const {
    return {o0 / cog * cig, ((o1 - 1) / cog + 1) * cig};
  }
  std::pair<std::size_t, std::size_t> output_channels(std::size_t c0, std::size_t c1) const {
    return {c0 / cig * cog, ((c1 - 1) / cig + 1) * cog};
  }
  // Upper bounds over blocks of bc channels: input channels for an output block, and back.
  std::size_t input_channels_bound(std::size_t bc) const {
    const std::size_t g = (bc - 1) / cog + 1 + (cog > 1 && bc % cog != 0 ? 1 : 0);
    return std::min(groups, g) * cig;
  }
  std::size_t output_channels_bound(std::size_t bc) const {
    const std::size_t g = (bc - 1) / cig + 1 + (cig > 1 && bc % cig != 0 ? 1 : 0);
    return std::min(groups, g) * cog;
  }
};

// Defined in conv_planner.cpp.
std::string shape_str(const std::vector<std::size_t>& s);
// Throws std::invalid_argument("name: what") unless ok.
void expect(bool ok, const std::string& name, const std::string& what);
// The dimensions of a convolution of input shape x and weight shape wt, each checked.
Dims make_dims(const std::vector<std::size_t>& x, const std::vector<std::size_t>& wt,
               const ConvParams& p, const std::string& name);
// How each pass is spread over tiles: the forward pass (x -> y), the input gradient (dy -> dx),
// and the weight gradient (dy, x -> dw).
ConvPlan plan_forward(const ArchPreset& arch, double proportion, const Dims& d);
ConvPlan plan_grad_input(const ArchPreset& arch, double proportion, const Dims& d);
ConvPlan plan_grad_weight(const ArchPreset& arch, double proportion, const Dims& d);

}  // namespace ipupod::ipu::ops::conv_impl
