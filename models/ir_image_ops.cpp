// IR builders for convolution, pooling and normalisation (NCHW), with shape inference.
// Output sizes follow PyTorch's formulas exactly.
#include <algorithm>

#include "models/ir.hpp"

namespace ipupod::models {

Conv2dGeometry Conv2dGeometry::same(std::size_t kh, std::size_t kw, std::size_t dilation) {
  Conv2dGeometry g;
  const std::size_t th = dilation * (kh - 1), tw = dilation * (kw - 1);
  g.pad_top = th / 2;
  g.pad_bottom = th - th / 2;
  g.pad_left = tw / 2;
  g.pad_right = tw - tw / 2;
  g.dilation_h = g.dilation_w = dilation;
  return g;
}

Conv2dGeometry Conv2dGeometry::symmetric(std::size_t stride, std::size_t padding,
                                         std::size_t dilation, std::size_t groups) {
  Conv2dGeometry g;
  g.stride_h = g.stride_w = stride;
  g.pad_top = g.pad_bottom = g.pad_left = g.pad_right = padding;
  g.dilation_h = g.dilation_w = dilation;
  g.groups = groups;
  return g;
}

void Conv2dGeometry::write(Attrs& a) const {
  const auto i = [](std::size_t v) { return static_cast<std::int64_t>(v); };
  a.lists["stride"] = {i(stride_h), i(stride_w)};
  a.lists["padding"] = {i(pad_top), i(pad_bottom), i(pad_left), i(pad_right)};
  a.lists["dilation"] = {i(dilation_h), i(dilation_w)};
  a.ints["groups"] = i(groups);
}

Conv2dGeometry Conv2dGeometry::read(const Op& op) {
  const auto u = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  const auto &s = op.list("stride"), &p = op.list("padding"), &d = op.list("dilation");
  Conv2dGeometry g;
  g.stride_h = u(s[0]), g.stride_w = u(s[1]);
  g.pad_top = u(p[0]), g.pad_bottom = u(p[1]), g.pad_left = u(p[2]), g.pad_right = u(p[3]);
  g.dilation_h = u(d[0]), g.dilation_w = u(d[1]);
  g.groups = u(op.i("groups"));
  return g;
}

void Pool2dGeometry::write(Attrs& a) const {
  const auto i = [](std::size_t v) { return static_cast<std::int64_t>(v); };
  a.lists["kernel"] = {i(kernel_h), i(kernel_w)};
  a.lists["stride"] = {i(stride_h), i(stride_w)};
  a.lists["padding"] = {i(pad_h), i(pad_w)};
  a.ints["count_include_pad"] = count_include_pad;
  a.ints["adaptive"] = adaptive;
  a.lists["output"] = {i(out_h), i(out_w)};
}

Pool2dGeometry Pool2dGeometry::read(const Op& op) {
  const auto u = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  Pool2dGeometry g;
  g.kernel_h = u(op.list("kernel")[0]), g.kernel_w = u(op.list("kernel")[1]);
  g.stride_h = u(op.list("stride")[0]), g.stride_w = u(op.list("stride")[1]);
  g.pad_h = u(op.list("padding")[0]), g.pad_w = u(op.list("padding")[1]);
  g.count_include_pad = op.i("count_include_pad") != 0;
  g.adaptive = op.i("adaptive") != 0;
  g.out_h = u(op.list("output")[0]), g.out_w = u(op.list("output")[1]);
  return g;
}

namespace {
// Output length of a strided, padded, dilated window; 0 when the window does not fit.
std::size_t conv_out(std::size_t in, std::size_t pad, std::size_t k, std::size_t dil,
                     std::size_t stride) {
  const std::size_t span = dil * (k - 1) + 1;
  if (in + pad < span) return 0;
  return (in + pad - span) / stride + 1;
}
}  // namespace

ValueId Graph::conv2d(ValueId x, ValueId w, const Conv2dGeometry& geo, const std::string& name) {
  const std::string n = auto_name(OpKind::conv2d, name);
  const TensorInfo &ix = info(x), &iw = info(w);
  expect_f32(x, OpKind::conv2d, n, "input 0 (x)");
  expect_f32(w, OpKind::conv2d, n, "input 1 (weight)");
  expect(ix.shape.size() == 4, OpKind::conv2d, n, "input 0 (x) must be [n,c,h,w], got " + ix.str());
  expect(iw.shape.size() == 4, OpKind::conv2d, n,
         "input 1 (weight) must be [out_channels, in_channels/groups, kh, kw], got " + iw.str());
  expect(geo.groups >= 1 && geo.stride_h >= 1 && geo.stride_w >= 1 && geo.dilation_h >= 1 &&
             geo.dilation_w >= 1,
         OpKind::conv2d, n, "groups, strides and dilations must be at least 1");
  expect(ix.shape[1] % geo.groups == 0 && iw.shape[0] % geo.groups == 0, OpKind::conv2d, n,
         "in_channels " + std::to_string(ix.shape[1]) + " and out_channels " +
             std::to_string(iw.shape[0]) + " must be divisible by groups " +
             std::to_string(geo.groups));
  expect(iw.shape[1] == ix.shape[1] / geo.groups, OpKind::conv2d, n,
         "input 1 (weight) " + iw.str() + " expects " + std::to_string(iw.shape[1] * geo.groups) +
             " input channels, input 0 (x) " + ix.str() + " has " + std::to_string(ix.shape[1]));
  const std::size_t oh = conv_out(ix.shape[2], geo.pad_top + geo.pad_bottom, iw.shape[2],
                                  geo.dilation_h, geo.stride_h);
  const std::size_t ow = conv_out(ix.shape[3], geo.pad_left + geo.pad_right, iw.shape[3],
                                  geo.dilation_w, geo.stride_w);
  expect(oh > 0 && ow > 0, OpKind::conv2d, n,
         "kernel " + info(w).str() + " does not fit input " + ix.str() + " with this padding");
  Attrs a;
  geo.write(a);
  return add_op(OpKind::conv2d, n, {x, w},
                TensorInfo{DType::f32, {ix.shape[0], iw.shape[0], oh, ow}}, false, false, 0,
                std::move(a));
}

ValueId Graph::conv_transpose2d(ValueId x, ValueId w, const Conv2dGeometry& geo, std::size_t oph,
                                std::size_t opw, const std::string& name) {
  const std::string n = auto_name(OpKind::conv_transpose2d, name);
  const TensorInfo &ix = info(x), &iw = info(w);
  expect_f32(x, OpKind::conv_transpose2d, n, "input 0 (x)");
  expect_f32(w, OpKind::conv_transpose2d, n, "input 1 (weight)");
  expect(ix.shape.size() == 4, OpKind::conv_transpose2d, n,
         "input 0 (x) must be [n,c,h,w], got " + ix.str());
  expect(iw.shape.size() == 4 && iw.shape[0] == ix.shape[1] && ix.shape[1] % geo.groups == 0,
         OpKind::conv_transpose2d, n,
         "input 1 (weight) must be [" + std::to_string(ix.shape[1]) +
             ", out_channels/groups, kh, kw] with in_channels divisible by groups " +
             std::to_string(geo.groups) + ", got " + iw.str());
  expect(
      oph < std::max(geo.stride_h, geo.dilation_h) && opw < std::max(geo.stride_w, geo.dilation_w),
      OpKind::conv_transpose2d, n, "output_padding must be smaller than stride or dilation");
  const long long oh = static_cast<long long>((ix.shape[2] - 1) * geo.stride_h) -
                       static_cast<long long>(geo.pad_top + geo.pad_bottom) +
                       static_cast<long long>(geo.dilation_h * (iw.shape[2] - 1) + oph + 1);
  const long long ow = static_cast<long long>((ix.shape[3] - 1) * geo.stride_w) -
                       static_cast<long long>(geo.pad_left + geo.pad_right) +
                       static_cast<long long>(geo.dilation_w * (iw.shape[3] - 1) + opw + 1);
  expect(oh > 0 && ow > 0, OpKind::conv_transpose2d, n,
         "padding leaves no output for input " + ix.str() + " and weight " + iw.str());
  Attrs a;
  geo.write(a);
  a.lists["output_padding"] = {static_cast<std::int64_t>(oph), static_cast<std::int64_t>(opw)};
  const Shape out = {ix.shape[0], iw.shape[1] * geo.groups, static_cast<std::size_t>(oh),
                     static_cast<std::size_t>(ow)};
  return add_op(OpKind::conv_transpose2d, n, {x, w}, TensorInfo{DType::f32, out}, false, false, 0,
                std::move(a));
}

namespace {
Shape pool_output(const Shape& in, const Pool2dGeometry& g) {
  if (g.adaptive) return {in[0], in[1], g.out_h, g.out_w};
  return {in[0], in[1], conv_out(in[2], 2 * g.pad_h, g.kernel_h, 1, g.stride_h),
          conv_out(in[3], 2 * g.pad_w, g.kernel_w, 1, g.stride_w)};
}
}  // namespace

ValueId Graph::max_pool2d(ValueId x, const Pool2dGeometry& geo, const std::string& name) {
  const std::string n = auto_name(OpKind::max_pool2d, name);
  expect(info(x).shape.size() == 4 && info(x).dtype == DType::f32, OpKind::max_pool2d, n,
         "input must be float32[n,c,h,w], got " + info(x).str());
  expect(!geo.adaptive && 2 * geo.pad_h <= geo.kernel_h && 2 * geo.pad_w <= geo.kernel_w,
         OpKind::max_pool2d, n, "padding must be at most half the kernel (and not adaptive)");
  const Shape out = pool_output(info(x).shape, geo);
  expect(out[2] > 0 && out[3] > 0, OpKind::max_pool2d, n,
         "window does not fit input " + info(x).str());
  Attrs a;
  geo.write(a);
  return add_op(OpKind::max_pool2d, n, {x}, TensorInfo{DType::f32, out}, false, false, 0,
                std::move(a));
}

ValueId Graph::avg_pool2d(ValueId x, const Pool2dGeometry& geo, const std::string& name) {
  const std::string n = auto_name(OpKind::avg_pool2d, name);
  expect(info(x).shape.size() == 4 && info(x).dtype == DType::f32, OpKind::avg_pool2d, n,
         "input must be float32[n,c,h,w], got " + info(x).str());
  expect(!geo.adaptive || (geo.out_h >= 1 && geo.out_w >= 1), OpKind::avg_pool2d, n,
         "adaptive output size must be at least 1x1");
  const Shape out = pool_output(info(x).shape, geo);
  expect(out[2] > 0 && out[3] > 0, OpKind::avg_pool2d, n,
         "window does not fit input " + info(x).str());
  Attrs a;
  geo.write(a);
  return add_op(OpKind::avg_pool2d, n, {x}, TensorInfo{DType::f32, out}, false, false, 0,
                std::move(a));
}

ValueId Graph::normalize(ValueId x, NormKind norm, double eps, std::size_t groups,
                         const std::string& name) {
  const std::string n = auto_name(OpKind::normalize, name);
  const TensorInfo& ix = info(x);
  expect_f32(x, OpKind::normalize, n, "input");
  if (norm == NormKind::layer)
    expect(!ix.shape.empty(), OpKind::normalize, n, "layer norm needs rank >= 1");
  else
    expect(ix.shape.size() >= 2, OpKind::normalize, n,
           "batch and group norm need [n,c,...], got " + ix.str());
  if (norm == NormKind::group)
    expect(groups >= 1 && ix.shape[1] % groups == 0, OpKind::normalize, n,
           "channels " + std::to_string(ix.shape[1]) + " must be divisible by groups " +
               std::to_string(groups));
  Attrs a;
  a.ints["norm"] = static_cast<std::int64_t>(norm);
  a.ints["groups"] = static_cast<std::int64_t>(groups);
  a.reals["eps"] = eps;
  return add_op(OpKind::normalize, n, {x}, ix, false, false, 0, std::move(a));
}

ValueId Graph::batch_norm_inference(ValueId x, ValueId mean, ValueId var, double eps,
                                    const std::string& name) {
  const std::string n = auto_name(OpKind::batch_norm_inference, name);
  expect(info(x).shape.size() >= 2, OpKind::batch_norm_inference, n,
         "input 0 must be [n,c,...], got " + info(x).str());
  const Shape c = {info(x).shape[1]};
  expect(info(mean).shape == c && info(var).shape == c, OpKind::batch_norm_inference, n,
         "running mean and variance must be float32" + shape_str(c) + ", got " + info(mean).str() +
             " and " + info(var).str());
  Attrs a;
  a.reals["eps"] = eps;
  return add_op(OpKind::batch_norm_inference, n, {x, mean, var}, info(x), false, false, 0,
                std::move(a));
}

void Graph::batch_norm_stats_update(ValueId x, ValueId mean, ValueId var, double momentum,
                                    const std::string& name) {
  const std::string n = auto_name(OpKind::batch_norm_stats_update, name);
  const Shape c = {info(x).shape.at(1)};
  expect(info(mean).shape == c && info(var).shape == c, OpKind::batch_norm_stats_update, n,
         "running mean and variance must be float32" + shape_str(c) + ", got " + info(mean).str() +
             " and " + info(var).str());
  for (ValueId s : {mean, var})
    expect(producer(s).kind == OpKind::state, OpKind::batch_norm_stats_update, n,
           "'" + value(s).name + "' must be a state value (it is updated in place)");
  Attrs a;
  a.reals["momentum"] = momentum;
  add_op(OpKind::batch_norm_stats_update, n, {x, mean, var}, std::nullopt, false, false, 0,
         std::move(a));
}

}  // namespace ipupod::models
