// Layers and losses of the layer library, built from IR ops; initialisers follow PyTorch.
#include "models/layers.hpp"

#include <cmath>

namespace ipupod::models {

std::string Builder::name(const std::string& leaf) const {
  std::string s;
  for (const auto& p : scopes_)
    if (!p.empty()) s += (s.empty() ? "" : ".") + p;
  if (leaf.empty()) return s;
  return s.empty() ? leaf : s + "." + leaf;
}

ValueId Builder::param(const std::string& leaf, Shape shape, InitKind init, double value) {
  const std::string n = name(leaf);
  auto it = params_.find(n);
  ValueId p;
  if (it != params_.end()) {
    p = it->second;
    if (graph_.info(p).shape != shape)
      throw IrError("parameter '" + n + "' is reused with shape " + shape_str(shape) +
                    " but was created as " + graph_.info(p).str());
  } else {
    p = graph_.parameter(n, {DType::f32, std::move(shape)}, init, value);
    params_.emplace(n, p);
  }
  return frozen_ ? graph_.stop_gradient(p, n + "/frozen") : p;
}

ValueId Builder::state(const std::string& leaf, Shape shape, InitKind init, double value) {
  const std::string n = name(leaf);
  auto it = states_.find(n);
  if (it != states_.end()) return it->second;
  const ValueId s = graph_.state(n, {DType::f32, std::move(shape)}, init, value);
  states_.emplace(n, s);
  return s;
}

ValueId Builder::scalar(double value) {
  return graph_.constant(name("const"), {DType::f32, {}}, value);
}

namespace nn {
namespace {

double fan_in_bound(std::size_t fan_in) {
  return 1.0 / std::sqrt(static_cast<double>(fan_in));
}

// x [n, c, ...] + per-channel vector v [c] (reshaped to [1, c, 1, ...]).
ValueId channel_op(Builder& b, BinaryFn fn, ValueId x, ValueId v) {
  Graph& g = b.graph();
  Shape s(g.info(x).shape.size(), 1);
  s[1] = g.info(v).shape[0];
  return g.binary(fn, x, g.reshape(v, s, b.name("channel_view")),
                  b.name(std::string("channel_") + binary_fn_name(fn)));
}

// gamma * x + beta per channel (axis 1).
ValueId channel_affine(Builder& b, ValueId x, std::size_t channels) {
  const ValueId gamma = b.param("weight", {channels}, InitKind::fill, 1.0);
  const ValueId beta = b.param("bias", {channels}, InitKind::fill, 0.0);
  return channel_op(b, BinaryFn::add, channel_op(b, BinaryFn::mul, x, gamma), beta);
}

}  // namespace

ValueId linear(Builder& b, ValueId x, std::size_t out, bool bias, const std::string& name) {
  Scope s(b, name);
  Graph& g = b.graph();
  const Shape in_shape = g.info(x).shape;
  const std::size_t in = in_shape.back(), rows = g.info(x).elements() / in;
  const double bound = fan_in_bound(in);
  const ValueId w = b.param("weight", {out, in}, InitKind::uniform, bound);
  ValueId x2 = in_shape.size() == 2 ? x : g.reshape(x, {rows, in}, b.name("flatten"));
  ValueId y = g.matmul(x2, w, false, true, b.name("matmul"));
  if (bias) y = g.add_bias(y, b.param("bias", {out}, InitKind::uniform, bound), b.name("bias_add"));
  if (in_shape.size() == 2) return y;
  Shape out_shape = in_shape;
  out_shape.back() = out;
  return g.reshape(y, out_shape, b.name("unflatten"));
}

ValueId conv2d(Builder& b, ValueId x, const Conv2dOptions& o, const std::string& name) {
  Scope s(b, name);
  Graph& g = b.graph();
  const std::size_t cin = g.info(x).shape.at(1);
  if (o.groups == 0 || cin % o.groups != 0)
    throw IrError("conv2d '" + b.name("") + "': in_channels " + std::to_string(cin) +
                  " is not divisible by groups " + std::to_string(o.groups));
  const std::size_t fan_in = cin / o.groups * o.kernel * o.kernel;
  const double bound = fan_in_bound(fan_in);
  const ValueId w = b.param("weight", {o.out_channels, cin / o.groups, o.kernel, o.kernel},
                            InitKind::uniform, bound);
  Conv2dGeometry geo = o.same ? Conv2dGeometry::same(o.kernel, o.kernel, o.dilation)
                              : Conv2dGeometry::symmetric(o.stride, o.padding, o.dilation);
  if (o.same && o.stride != 1)
    throw IrError("conv2d '" + b.name("") + "': padding 'same' needs stride 1, got " +
                  std::to_string(o.stride));
  geo.groups = o.groups;
  ValueId y = g.conv2d(x, w, geo, b.name("conv"));
  if (o.bias)
    y = channel_op(b, BinaryFn::add, y,
                   b.param("bias", {o.out_channels}, InitKind::uniform, bound));
  return y;
}

ValueId conv_transpose2d(Builder& b, ValueId x, std::size_t out, std::size_t k, std::size_t stride,
                         std::size_t padding, std::size_t output_padding, bool bias,
                         const std::string& name) {
  Scope s(b, name);
  Graph& g = b.graph();
  const std::size_t cin = g.info(x).shape.at(1);
  const double bound = fan_in_bound(out * k * k);  // PyTorch's fan_in of a [in, out, k, k] weight
  const ValueId w = b.param("weight", {cin, out, k, k}, InitKind::uniform, bound);
  ValueId y = g.conv_transpose2d(x, w, Conv2dGeometry::symmetric(stride, padding), output_padding,
                                 output_padding, b.name("conv_transpose"));
  if (bias) y = channel_op(b, BinaryFn::add, y, b.param("bias", {out}, InitKind::uniform, bound));
  return y;
}

ValueId batch_norm2d(Builder& b, ValueId x, double eps, double momentum, const std::string& name) {
  Scope s(b, name);
  Graph& g = b.graph();
  const std::size_t c = g.info(x).shape.at(1);
  const ValueId mean = b.state("running_mean", {c}, InitKind::fill, 0.0);
  const ValueId var = b.state("running_var", {c}, InitKind::fill, 1.0);
  ValueId xhat;
  if (b.training()) {
    g.batch_norm_stats_update(x, mean, var, momentum, b.name("stats_update"));
    xhat = g.normalize(x, NormKind::batch, eps, 1, b.name("normalize"));
  } else {
    xhat = g.batch_norm_inference(x, mean, var, eps, b.name("normalize"));
  }
  return channel_affine(b, xhat, c);
}

ValueId layer_norm(Builder& b, ValueId x, double eps, const std::string& name) {
  Scope s(b, name);
  Graph& g = b.graph();
  const std::size_t d = g.info(x).shape.back();
  const ValueId xhat = g.normalize(x, NormKind::layer, eps, 1, b.name("normalize"));
  const ValueId gamma = b.param("weight", {d}, InitKind::fill, 1.0);
  const ValueId beta = b.param("bias", {d}, InitKind::fill, 0.0);
  return g.binary(BinaryFn::add, g.binary(BinaryFn::mul, xhat, gamma, b.name("scale")), beta,
                  b.name("shift"));
}

ValueId group_norm(Builder& b, ValueId x, std::size_t groups, double eps, const std::string& name) {
  Scope s(b, name);
  const ValueId xhat = b.graph().normalize(x, NormKind::group, eps, groups, b.name("normalize"));
  return channel_affine(b, xhat, b.graph().info(x).shape.at(1));
}

ValueId gdn(Builder& b, ValueId x, bool inverse, const std::string& name) {
  Scope s(b, name);
  Graph& g = b.graph();
  const std::size_t c = g.info(x).shape.at(1);
  const ValueId beta = b.param("beta", {c}, InitKind::fill, 1.0);
  const ValueId gamma = b.param("gamma", {c, c}, InitKind::eye, 0.1);
  const ValueId sq = g.unary(UnaryFn::square, x, b.name("square"));
  const ValueId mixed =
      g.conv2d(sq, g.reshape(gamma, {c, c, 1, 1}), Conv2dGeometry{}, b.name("mix"));
  // |beta + gamma x^2|: the same as GDN's while beta and gamma stay positive (as initialised);
  // if an optimizer pushes them below zero the root stays real instead of turning to NaN.
  const ValueId norm =
      g.unary(UnaryFn::abs, channel_op(b, BinaryFn::add, mixed, beta), b.name("positive"));
  const ValueId scale = g.unary(inverse ? UnaryFn::sqrt : UnaryFn::rsqrt, norm, b.name("root"));
  return g.binary(BinaryFn::mul, x, scale, b.name("apply"));
}

ValueId relu(Builder& b, ValueId x) {
  Graph& g = b.graph();
  if (g.info(x).shape.size() == 2) return g.relu(x, b.name("relu"));
  // The pod lowers Relu on [m, n]; other ranks go through a flat view.
  const Shape s = g.info(x).shape;
  const std::size_t n = s.empty() ? 1 : s.back();
  const ValueId flat = g.reshape(x, {g.info(x).elements() / n, n}, b.name("relu_in"));
  return g.reshape(g.relu(flat, b.name("relu")), s, b.name("relu_out"));
}
ValueId gelu(Builder& b, ValueId x) {
  return b.graph().unary(UnaryFn::gelu, x, b.name("gelu"));
}
ValueId silu(Builder& b, ValueId x) {
  return b.graph().unary(UnaryFn::silu, x, b.name("silu"));
}
ValueId sigmoid(Builder& b, ValueId x) {
  return b.graph().unary(UnaryFn::sigmoid, x, b.name("sigmoid"));
}
ValueId tanh(Builder& b, ValueId x) {
  return b.graph().unary(UnaryFn::tanh, x, b.name("tanh"));
}
ValueId leaky_relu(Builder& b, ValueId x, double slope) {
  return b.graph().unary(UnaryFn::leaky_relu, x, b.name("leaky_relu"), slope);
}

ValueId max_pool2d(Builder& b, ValueId x, std::size_t k, std::size_t stride, std::size_t padding) {
  Pool2dGeometry p;
  p.kernel_h = p.kernel_w = k;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = padding;
  return b.graph().max_pool2d(x, p, b.name("max_pool"));
}

ValueId avg_pool2d(Builder& b, ValueId x, std::size_t k, std::size_t stride, std::size_t padding,
                   bool count_include_pad) {
  Pool2dGeometry p;
  p.kernel_h = p.kernel_w = k;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = padding;
  p.count_include_pad = count_include_pad;
  return b.graph().avg_pool2d(x, p, b.name("avg_pool"));
}

ValueId adaptive_avg_pool2d(Builder& b, ValueId x, std::size_t out_h, std::size_t out_w) {
  Pool2dGeometry p;
  p.adaptive = true;
  p.out_h = out_h;
  p.out_w = out_w;
  return b.graph().avg_pool2d(x, p, b.name("adaptive_avg_pool"));
}

ValueId squeeze_excitation(Builder& b, ValueId x, std::size_t squeeze, const std::string& name) {
  Scope s(b, name);
  const std::size_t c = b.graph().info(x).shape.at(1);
  ValueId scale = adaptive_avg_pool2d(b, x, 1, 1);
  scale = silu(b, conv2d(b, scale, {.out_channels = squeeze, .kernel = 1}, "fc1"));
  scale = sigmoid(b, conv2d(b, scale, {.out_channels = c, .kernel = 1}, "fc2"));
  return b.graph().binary(BinaryFn::mul, x, scale, b.name("gate"));
}

ValueId pixel_shuffle(Builder& b, ValueId x, std::size_t r) {
  Graph& g = b.graph();
  const Shape s = g.info(x).shape;
  if (s.size() != 4 || s[1] % (r * r) != 0)
    throw IrError("pixel_shuffle '" + b.name("") + "': input must be [n, c*" +
                  std::to_string(r * r) + ", h, w], got " + g.info(x).str());
  const std::size_t c = s[1] / (r * r);
  ValueId y = g.reshape(x, {s[0], c, r, r, s[2], s[3]}, b.name("pixel_shuffle_split"));
  y = g.permute(y, {0, 1, 4, 2, 5, 3}, b.name("pixel_shuffle"));
  return g.reshape(y, {s[0], c, s[2] * r, s[3] * r}, b.name("pixel_shuffle_join"));
}

ValueId multi_head_self_attention(Builder& b, ValueId x, std::size_t heads,
                                  const std::string& name) {
  Scope s(b, name);
  Graph& g = b.graph();
  const Shape xs = g.info(x).shape;
  if (xs.size() != 3 || heads == 0 || xs[2] % heads != 0)
    throw IrError("attention '" + b.name("") + "': input must be [n, t, d] with d divisible by " +
                  std::to_string(heads) + " heads, got " + g.info(x).str());
  const std::size_t n = xs[0], t = xs[1], d = xs[2], dh = d / heads;
  ValueId qkv = linear(b, x, 3 * d, true, "qkv");
  qkv = g.reshape(qkv, {n, t, 3, heads, dh}, b.name("split_heads"));
  qkv = g.permute(qkv, {2, 0, 3, 1, 4}, b.name("heads_first"));  // [3, n, h, t, dh]
  const auto part = [&](std::size_t k, const char* what) {
    return g.reshape(g.slice(qkv, 0, k, k + 1, b.name(what)), {n, heads, t, dh},
                     b.name(std::string(what) + "_view"));
  };
  const ValueId q = part(0, "q"), k = part(1, "k"), v = part(2, "v");
  ValueId scores = g.batch_matmul(q, k, false, true, b.name("scores"));
  scores = g.binary(BinaryFn::mul, scores, b.scalar(1.0 / std::sqrt(static_cast<double>(dh))),
                    b.name("scale"));
  const ValueId attn = g.softmax(scores, b.name("softmax"));
  ValueId out = g.batch_matmul(attn, v, false, false, b.name("context"));  // [n, h, t, dh]
  out = g.permute(out, {0, 2, 1, 3}, b.name("merge_heads"));
  out = g.reshape(out, {n, t, d}, b.name("merge_view"));
  return linear(b, out, d, true, "proj");
}

ValueId transformer_block(Builder& b, ValueId x, std::size_t heads, std::size_t mlp_ratio,
                          const std::string& name) {
  Scope s(b, name);
  Graph& g = b.graph();
  const std::size_t d = g.info(x).shape.back();
  const ValueId a = multi_head_self_attention(b, layer_norm(b, x, 1e-5, "norm1"), heads, "attn");
  x = g.binary(BinaryFn::add, x, a, b.name("residual1"));
  ValueId h = linear(b, layer_norm(b, x, 1e-5, "norm2"), d * mlp_ratio, true, "mlp.fc1");
  h = linear(b, gelu(b, h), d, true, "mlp.fc2");
  return g.binary(BinaryFn::add, x, h, b.name("residual2"));
}

ValueId embedding(Builder& b, ValueId indices, std::size_t rows, std::size_t dim,
                  const std::string& name) {
  Scope s(b, name);
  const ValueId table = b.param("weight", {rows, dim}, InitKind::normal, 1.0);
  return b.graph().gather_rows(table, indices, b.name("lookup"));
}

ValueId dropout(Builder& b, ValueId x, double p) {
  if (!b.training() || p == 0) return x;
  Graph& g = b.graph();
  const ValueId mask = g.random_mask(g.info(x).shape, p, b.next_seed(), b.name("dropout_mask"));
  return g.binary(BinaryFn::mul, x, mask, b.name("dropout"));
}

ValueId stochastic_depth(Builder& b, ValueId x, double p) {
  if (!b.training() || p == 0) return x;
  Graph& g = b.graph();
  Shape s(g.info(x).shape.size(), 1);
  s[0] = g.info(x).shape[0];
  const ValueId mask = g.random_mask(s, p, b.next_seed(), b.name("stochastic_depth_mask"));
  return g.binary(BinaryFn::mul, x, mask, b.name("stochastic_depth"));
}

Quantized vector_quantizer(Builder& b, ValueId z, std::size_t codes, double decay,
                           double commitment, const std::string& name) {
  Scope s(b, name);
  Graph& g = b.graph();
  const Shape zs = g.info(z).shape;
  if (zs.size() != 4)
    throw IrError("vector_quantizer '" + b.name("") + "': input must be [n, d, h, w], got " +
                  g.info(z).str());
  const std::size_t n = zs[0], d = zs[1], h = zs[2], w = zs[3], rows = n * h * w;
  const ValueId codebook =
      b.state("codebook", {codes, d}, InitKind::uniform, 1.0 / static_cast<double>(codes));
  const ValueId flat =
      g.reshape(g.permute(z, {0, 2, 3, 1}, b.name("channels_last")), {rows, d}, b.name("rows"));
  Quantized out;
  out.indices = g.vq_nearest(flat, codebook, b.name("nearest"));
  const ValueId q_rows = g.gather_rows(codebook, out.indices, b.name("lookup"));
  if (b.training()) {
    const ValueId cluster = b.state("cluster_size", {codes}, InitKind::fill, 0.0);
    const ValueId embed_sum = b.state("embed_sum", {codes, d}, InitKind::fill, 0.0);
    g.vq_ema_update(flat, out.indices, codebook, cluster, embed_sum, decay, 1e-5,
                    b.name("ema_update"));
  }
  const ValueId q = g.permute(g.reshape(q_rows, {n, h, w, d}, b.name("codes_view")), {0, 3, 1, 2},
                              b.name("codes"));
  const ValueId diff =
      g.binary(BinaryFn::sub, z, g.stop_gradient(q, b.name("codes_fixed")), b.name("commit_diff"));
  const ValueId mean_sq = g.reduce_mean(g.unary(UnaryFn::square, diff, b.name("commit_sq")),
                                        {0, 1, 2, 3}, false, b.name("commit_mean"));
  out.loss = g.binary(BinaryFn::mul, mean_sq, b.scalar(commitment), b.name("commitment_loss"));
  // Straight-through: z + sg(q - z) equals q forward and passes the gradient to z unchanged.
  const ValueId delta =
      g.stop_gradient(g.binary(BinaryFn::sub, q, z, b.name("st_delta")), b.name("st_fixed"));
  out.quantized = g.binary(BinaryFn::add, z, delta, b.name("straight_through"));
  return out;
}

namespace {
std::vector<std::size_t> all_axes(const Graph& g, ValueId x) {
  std::vector<std::size_t> a(g.info(x).shape.size());
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = i;
  return a;
}
}  // namespace

namespace {
// The mean of an elementwise error over all cells, or over those where mask is 1.
ValueId mean_error(Builder& b, ValueId error, ValueId mask, const std::string& loss) {
  Graph& g = b.graph();
  if (mask < 0) return g.reduce_mean(error, all_axes(g, error), false, b.name(loss));
  const ValueId masked = g.binary(BinaryFn::mul, error, mask, b.name(loss + "_masked"));
  const ValueId total =
      g.reduce_sum(masked, all_axes(g, masked), false, 1.0, b.name(loss + "_sum"));
  const ValueId count = g.reduce_sum(mask, all_axes(g, mask), false, 1.0, b.name(loss + "_count"));
  return g.binary(BinaryFn::div, total, count, b.name(loss));
}
}  // namespace

ValueId mse_loss(Builder& b, ValueId pred, ValueId target, ValueId mask) {
  Graph& g = b.graph();
  const ValueId sq = g.unary(
      UnaryFn::square, g.binary(BinaryFn::sub, pred, target, b.name("mse_diff")), b.name("mse_sq"));
  return mean_error(b, sq, mask, "mse");
}

ValueId l1_loss(Builder& b, ValueId pred, ValueId target, ValueId mask) {
  Graph& g = b.graph();
  const ValueId a = g.unary(UnaryFn::abs, g.binary(BinaryFn::sub, pred, target, b.name("l1_diff")),
                            b.name("l1_abs"));
  return mean_error(b, a, mask, "l1");
}

ValueId cross_entropy(Builder& b, ValueId logits, ValueId labels) {
  return b.graph().softmax_cross_entropy(logits, labels, b.name("cross_entropy"));
}

ValueId lsgan_loss(Builder& b, ValueId pred, double target) {
  Graph& g = b.graph();
  const ValueId sq = g.unary(UnaryFn::square,
                             g.binary(BinaryFn::sub, pred, b.scalar(target), b.name("lsgan_diff")),
                             b.name("lsgan_sq"));
  return g.reduce_mean(sq, all_axes(g, sq), false, b.name("lsgan"));
}

}  // namespace nn
}  // namespace ipupod::models
