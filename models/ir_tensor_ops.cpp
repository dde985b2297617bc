// IR builders for elementwise, reduction, shape and attention-style ops, with shape inference.
// Every error names the op, the input, what was expected and what was got.
#include <algorithm>
#include <numeric>

#include "models/ir.hpp"

namespace ipupod::models {

namespace {
std::vector<std::int64_t> to_list(const std::vector<std::size_t>& v) {
  return {v.begin(), v.end()};
}
}  // namespace

ValueId Graph::unary(UnaryFn fn, ValueId x, const std::string& name, double alpha) {
  const std::string n = auto_name(OpKind::unary, name);
  expect_f32(x, OpKind::unary, n, "input");
  Attrs a;
  a.ints["fn"] = static_cast<std::int64_t>(fn);
  a.reals["alpha"] = alpha;
  return add_op(OpKind::unary, n, {x}, info(x), false, false, 0, std::move(a));
}

ValueId Graph::binary(BinaryFn fn, ValueId a, ValueId b, const std::string& name) {
  const std::string n = auto_name(OpKind::binary, name);
  expect_f32(a, OpKind::binary, n, "input 0");
  expect_f32(b, OpKind::binary, n, "input 1");
  const auto out = broadcast_shapes(info(a).shape, info(b).shape);
  expect(out.has_value(), OpKind::binary, n,
         std::string(binary_fn_name(fn)) + ": shapes do not broadcast: input 0 " + info(a).str() +
             ", input 1 " + info(b).str());
  Attrs at;
  at.ints["fn"] = static_cast<std::int64_t>(fn);
  return add_op(OpKind::binary, n, {a, b}, TensorInfo{DType::f32, *out}, false, false, 0,
                std::move(at));
}

ValueId Graph::reduce_sum(ValueId x, std::vector<std::size_t> axes, bool keepdims, double scale,
                          const std::string& name) {
  const std::string n = auto_name(OpKind::reduce_sum, name);
  expect_f32(x, OpKind::reduce_sum, n, "input");
  const Shape& in = info(x).shape;
  std::sort(axes.begin(), axes.end());
  Shape out;
  for (std::size_t d = 0; d < in.size(); ++d) {
    const bool reduced = std::binary_search(axes.begin(), axes.end(), d);
    if (!reduced)
      out.push_back(in[d]);
    else if (keepdims)
      out.push_back(1);
  }
  for (std::size_t ax : axes)
    expect(ax < in.size(), OpKind::reduce_sum, n,
           "axis " + std::to_string(ax) + " is outside input " + info(x).str());
  Attrs a;
  a.lists["axes"] = to_list(axes);
  a.ints["keepdims"] = keepdims;
  a.reals["scale"] = scale;
  return add_op(OpKind::reduce_sum, n, {x}, TensorInfo{DType::f32, out}, false, false, 0,
                std::move(a));
}

ValueId Graph::reduce_mean(ValueId x, std::vector<std::size_t> axes, bool keepdims,
                           const std::string& name) {
  std::size_t count = 1;
  for (std::size_t ax : axes) count *= ax < info(x).shape.size() ? info(x).shape[ax] : 1;
  return reduce_sum(x, std::move(axes), keepdims, 1.0 / static_cast<double>(count), name);
}

ValueId Graph::broadcast_to(ValueId x, Shape shape, double scale, const std::string& name) {
  const std::string n = auto_name(OpKind::broadcast_to, name);
  expect_f32(x, OpKind::broadcast_to, n, "input");
  const auto b = broadcast_shapes(info(x).shape, shape);
  expect(b && *b == shape, OpKind::broadcast_to, n,
         "input " + info(x).str() + " does not broadcast to " + shape_str(shape));
  Attrs a;
  a.reals["scale"] = scale;
  return add_op(OpKind::broadcast_to, n, {x}, TensorInfo{DType::f32, std::move(shape)}, false,
                false, 0, std::move(a));
}

ValueId Graph::permute(ValueId x, std::vector<std::size_t> perm, const std::string& name) {
  const std::string n = auto_name(OpKind::permute, name);
  const Shape& in = info(x).shape;
  std::vector<std::size_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::size_t> iota(in.size());
  std::iota(iota.begin(), iota.end(), 0);
  expect(sorted == iota, OpKind::permute, n,
         "perm " + shape_str(perm) + " is not a permutation of the axes of " + info(x).str());
  Shape out(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[perm[i]];
  Attrs a;
  a.lists["perm"] = to_list(perm);
  return add_op(OpKind::permute, n, {x}, TensorInfo{info(x).dtype, out}, false, false, 0,
                std::move(a));
}

ValueId Graph::slice(ValueId x, std::size_t axis, std::size_t begin, std::size_t end,
                     const std::string& name) {
  const std::string n = auto_name(OpKind::slice, name);
  const Shape& in = info(x).shape;
  expect(axis < in.size() && begin < end && end <= in[axis], OpKind::slice, n,
         "range [" + std::to_string(begin) + ", " + std::to_string(end) + ") on axis " +
             std::to_string(axis) + " is outside input " + info(x).str());
  Shape out = in;
  out[axis] = end - begin;
  Attrs a;
  a.ints["axis"] = static_cast<std::int64_t>(axis);
  a.ints["begin"] = static_cast<std::int64_t>(begin);
  a.ints["end"] = static_cast<std::int64_t>(end);
  return add_op(OpKind::slice, n, {x}, TensorInfo{info(x).dtype, out}, false, false, 0,
                std::move(a));
}

ValueId Graph::concat(const std::vector<ValueId>& xs, std::size_t axis, const std::string& name) {
  const std::string n = auto_name(OpKind::concat, name);
  expect(!xs.empty(), OpKind::concat, n, "needs at least one input");
  Shape out = info(xs[0]).shape;
  expect(axis < out.size(), OpKind::concat, n,
         "axis " + std::to_string(axis) + " is outside input 0 " + info(xs[0]).str());
  out[axis] = 0;
  for (std::size_t k = 0; k < xs.size(); ++k) {
    Shape s = info(xs[k]).shape;
    expect(s.size() == out.size() && info(xs[k]).dtype == info(xs[0]).dtype, OpKind::concat, n,
           "input " + std::to_string(k) + " " + info(xs[k]).str() + " does not match input 0 " +
               info(xs[0]).str());
    const std::size_t len = s[axis];
    s[axis] = 0;
    Shape ref = out;
    ref[axis] = 0;
    expect(s == ref, OpKind::concat, n,
           "input " + std::to_string(k) + " " + info(xs[k]).str() +
               " differs from input 0 outside axis " + std::to_string(axis));
    out[axis] += len;
  }
  Attrs a;
  a.ints["axis"] = static_cast<std::int64_t>(axis);
  return add_op(OpKind::concat, n, xs, TensorInfo{info(xs[0]).dtype, out}, false, false, 0,
                std::move(a));
}

ValueId Graph::batch_matmul(ValueId a, ValueId b, bool ta, bool tb, const std::string& name) {
  const std::string n = auto_name(OpKind::batch_matmul, name);
  const TensorInfo &ia = info(a), &ib = info(b);
  expect_f32(a, OpKind::batch_matmul, n, "input 0");
  expect_f32(b, OpKind::batch_matmul, n, "input 1");
  expect(ia.shape.size() >= 3 && ia.shape.size() == ib.shape.size(), OpKind::batch_matmul, n,
         "inputs must have the same rank >= 3, got " + ia.str() + " and " + ib.str());
  const std::size_t r = ia.shape.size();
  expect(std::equal(ia.shape.begin(), ia.shape.end() - 2, ib.shape.begin()), OpKind::batch_matmul,
         n, "leading (batch) dimensions differ: " + ia.str() + " and " + ib.str());
  const std::size_t m = ta ? ia.shape[r - 1] : ia.shape[r - 2];
  const std::size_t k = ta ? ia.shape[r - 2] : ia.shape[r - 1];
  const std::size_t kb = tb ? ib.shape[r - 1] : ib.shape[r - 2];
  const std::size_t cols = tb ? ib.shape[r - 2] : ib.shape[r - 1];
  expect(k == kb, OpKind::batch_matmul, n,
         "inner dimensions differ: input 0 " + ia.str() + " gives k=" + std::to_string(k) +
             ", input 1 " + ib.str() + " gives k=" + std::to_string(kb));
  Shape out(ia.shape.begin(), ia.shape.end() - 2);
  out.push_back(m);
  out.push_back(cols);
  return add_op(OpKind::batch_matmul, n, {a, b}, TensorInfo{DType::f32, out}, ta, tb);
}

ValueId Graph::softmax(ValueId x, const std::string& name) {
  const std::string n = auto_name(OpKind::softmax, name);
  expect_f32(x, OpKind::softmax, n, "input");
  expect(!info(x).shape.empty(), OpKind::softmax, n, "input must have rank >= 1");
  return add_op(OpKind::softmax, n, {x}, info(x));
}

ValueId Graph::gather_rows(ValueId table, ValueId indices, const std::string& name) {
  const std::string n = auto_name(OpKind::gather_rows, name);
  expect(info(table).shape.size() == 2 && info(table).dtype == DType::f32, OpKind::gather_rows, n,
         "input 0 (table) must be float32[rows, dim], got " + info(table).str());
  expect(info(indices).dtype == DType::i32, OpKind::gather_rows, n,
         "input 1 (indices) must be int32, got " + info(indices).str());
  Shape out = info(indices).shape;
  out.push_back(info(table).shape[1]);
  return add_op(OpKind::gather_rows, n, {table, indices}, TensorInfo{DType::f32, out});
}

ValueId Graph::random_mask(Shape shape, double p, std::uint64_t seed, const std::string& name) {
  const std::string n = auto_name(OpKind::random_mask, name);
  expect(p >= 0 && p < 1, OpKind::random_mask, n,
         "drop probability must be in [0, 1), got " + std::to_string(p));
  Attrs a;
  a.reals["p"] = p;
  a.ints["seed"] = static_cast<std::int64_t>(seed & 0x7fffffffffffffffull);
  return add_op(OpKind::random_mask, n, {}, TensorInfo{DType::f32, std::move(shape)}, false, false,
                0, std::move(a));
}

ValueId Graph::stop_gradient(ValueId x, const std::string& name) {
  return add_op(OpKind::stop_gradient, auto_name(OpKind::stop_gradient, name), {x}, info(x));
}

ValueId Graph::vq_nearest(ValueId z, ValueId codebook, const std::string& name) {
  const std::string n = auto_name(OpKind::vq_nearest, name);
  const TensorInfo &iz = info(z), &ic = info(codebook);
  expect(iz.shape.size() == 2 && iz.dtype == DType::f32, OpKind::vq_nearest, n,
         "input 0 (z) must be float32[rows, dim], got " + iz.str());
  expect(ic.shape.size() == 2 && ic.shape[1] == iz.shape[1], OpKind::vq_nearest, n,
         "input 1 (codebook) must be float32[codes, " + std::to_string(iz.shape[1]) + "], got " +
             ic.str());
  return add_op(OpKind::vq_nearest, n, {z, codebook}, TensorInfo{DType::i32, {iz.shape[0]}});
}

void Graph::vq_ema_update(ValueId z, ValueId indices, ValueId codebook, ValueId cluster_size,
                          ValueId embed_sum, double decay, double eps, const std::string& name) {
  const std::string n = auto_name(OpKind::vq_ema_update, name);
  const std::size_t k = info(codebook).shape.at(0);
  for (ValueId s : {codebook, cluster_size, embed_sum})
    expect(producer(s).kind == OpKind::state, OpKind::vq_ema_update, n,
           "'" + value(s).name + "' must be a state value (it is updated in place)");
  expect(
      info(cluster_size).shape == Shape{k}, OpKind::vq_ema_update, n,
      "cluster_size must be float32[" + std::to_string(k) + "], got " + info(cluster_size).str());
  expect(info(embed_sum).shape == info(codebook).shape, OpKind::vq_ema_update, n,
         "embed_sum must be like the codebook " + info(codebook).str() + ", got " +
             info(embed_sum).str());
  expect(info(indices).shape == Shape{info(z).shape.at(0)}, OpKind::vq_ema_update, n,
         "indices must be int32[" + std::to_string(info(z).shape[0]) + "], got " +
             info(indices).str());
  Attrs a;
  a.reals["decay"] = decay;
  a.reals["eps"] = eps;
  add_op(OpKind::vq_ema_update, n, {z, indices, codebook, cluster_size, embed_sum}, std::nullopt,
         false, false, 0, std::move(a));
}

}  // namespace ipupod::models
