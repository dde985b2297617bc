// Op parameter translation: IR attributes -> the device op libraries' parameter structs.
#include "pod/compiler/op_params.hpp"

#include <stdexcept>

namespace ipupod::pod {

using models::OpKind;

ipu::DType device_dtype(models::DType d) {
  return d == models::DType::f32 ? ipu::DType::f32 : ipu::DType::i32;
}

std::vector<std::size_t> sizes(const std::vector<std::int64_t>& list) {
  return {list.begin(), list.end()};
}

ipu::ops::ConvParams conv_params(const models::Op& op) {
  const auto g = models::Conv2dGeometry::read(op);
  ipu::ops::ConvParams p{.stride_h = g.stride_h,
                         .stride_w = g.stride_w,
                         .pad_top = g.pad_top,
                         .pad_bottom = g.pad_bottom,
                         .pad_left = g.pad_left,
                         .pad_right = g.pad_right,
                         .dilation_h = g.dilation_h,
                         .dilation_w = g.dilation_w,
                         .groups = g.groups};
  if (op.attrs.lists.count("output_padding")) {
    const auto& o = op.list("output_padding");
    p.output_padding_h = static_cast<std::size_t>(o[0]);
    p.output_padding_w = static_cast<std::size_t>(o[1]);
  }
  return p;
}

ipu::ops::PoolParams pool_params(const models::Op& op) {
  const auto g = models::Pool2dGeometry::read(op);
  return {.kernel_h = g.kernel_h,
          .kernel_w = g.kernel_w,
          .stride_h = g.stride_h,
          .stride_w = g.stride_w,
          .pad_h = g.pad_h,
          .pad_w = g.pad_w,
          .count_include_pad = g.count_include_pad,
          .adaptive = g.adaptive,
          .out_h = g.out_h,
          .out_w = g.out_w};
}

ipu::ops::NormParams norm_params(const models::Op& op) {
  ipu::ops::NormParams p;
  switch (static_cast<models::NormKind>(op.i("norm"))) {
    case models::NormKind::batch:
      p.kind = ipu::ops::NormKind::batch;
      break;
    case models::NormKind::layer:
      p.kind = ipu::ops::NormKind::layer;
      break;
    case models::NormKind::group:
      p.kind = ipu::ops::NormKind::group;
      break;
  }
  p.eps = op.r("eps");
  p.groups = static_cast<std::size_t>(op.i("groups"));
  return p;
}

ipu::ops::UnaryOp unary_op(const models::Op& op) {
  using models::UnaryFn;
  using U = ipu::ops::UnaryOp;
  switch (static_cast<UnaryFn>(op.i("fn"))) {
    case UnaryFn::gelu:
      return U::gelu;
    case UnaryFn::silu:
      return U::silu;
    case UnaryFn::sigmoid:
      return U::sigmoid;
    case UnaryFn::tanh:
      return U::tanh;
    case UnaryFn::leaky_relu:
      return U::leaky_relu;
    case UnaryFn::sqrt:
      return U::sqrt;
    case UnaryFn::rsqrt:
      return U::rsqrt;
    case UnaryFn::exp:
      return U::exp;
    case UnaryFn::log:
      return U::log;
    case UnaryFn::square:
      return U::square;
    case UnaryFn::abs:
      return U::abs;
    case UnaryFn::neg:
      return U::neg;
    case UnaryFn::erf:
      return U::erf;
  }
  throw std::invalid_argument("op '" + op.name + "': unknown unary function");
}

ipu::ops::BinaryOp binary_op(const models::Op& op) {
  switch (static_cast<models::BinaryFn>(op.i("fn"))) {
    case models::BinaryFn::add:
      return ipu::ops::BinaryOp::add;
    case models::BinaryFn::sub:
      return ipu::ops::BinaryOp::sub;
    case models::BinaryFn::mul:
      return ipu::ops::BinaryOp::mul;
    case models::BinaryFn::div:
      return ipu::ops::BinaryOp::div;
  }
  throw std::invalid_argument("op '" + op.name + "': unknown binary function");
}

bool is_update(OpKind kind) {
  return kind == OpKind::adam_step || kind == OpKind::sgd_momentum_step ||
         kind == OpKind::lamb_step;
}

// The ops that make float16 results under --precision fp16 (every float input cast to
// float16), and those that also read float16 but make float32 (bias gradients, summed in
// float32); reshapes and stop_gradient are views of their input.
bool makes_float16(OpKind kind) {
  return kind == OpKind::matmul || kind == OpKind::add || kind == OpKind::add_bias ||
         kind == OpKind::relu || kind == OpKind::relu_grad || kind == OpKind::conv2d ||
         kind == OpKind::conv2d_grad_input || kind == OpKind::conv2d_grad_weight;
}
bool reads_float16(OpKind kind) {
  return makes_float16(kind) || kind == OpKind::column_sum;
}

}  // namespace ipupod::pod
