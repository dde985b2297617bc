// Interpreter kernels for elementwise, reduction, shape, softmax and lookup ops.
// Sums accumulate in double so results do not depend on loop order more than necessary.
#include <algorithm>
#include <cmath>

#include "models/kernels.hpp"

namespace ipupod::models::kernels {

std::vector<std::size_t> strides_of(const Shape& shape) {
  std::vector<std::size_t> s(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

namespace {

// Strides of `shape` read as if broadcast to `out` (aligned right; 0 on broadcast axes).
std::vector<std::size_t> broadcast_strides(const Shape& shape, const Shape& out) {
  const std::vector<std::size_t> s = strides_of(shape);
  std::vector<std::size_t> r(out.size(), 0);
  const std::size_t lead = out.size() - shape.size();
  for (std::size_t i = 0; i < shape.size(); ++i) r[lead + i] = shape[i] == 1 ? 0 : s[i];
  return r;
}

// Calls f(flat, offset_a, offset_b) for every index of `shape` in row-major order.
template <class F>
void for_each_index(const Shape& shape, const std::vector<std::size_t>& sa,
                    const std::vector<std::size_t>& sb, F&& f) {
  const std::size_t rank = shape.size();
  std::size_t total = 1;
  for (std::size_t d : shape) total *= d;
  if (total == 0) return;
  if (rank == 0) {
    f(std::size_t{0}, std::size_t{0}, std::size_t{0});
    return;
  }
  std::vector<std::size_t> idx(rank, 0);
  std::size_t oa = 0, ob = 0;
  const std::size_t inner = shape[rank - 1], ia = sa[rank - 1], ib = sb[rank - 1];
  for (std::size_t flat = 0; flat < total; flat += inner) {
    for (std::size_t j = 0; j < inner; ++j) f(flat + j, oa + j * ia, ob + j * ib);
    for (std::size_t d = rank - 1; d-- > 0;) {
      ++idx[d];
      oa += sa[d];
      ob += sb[d];
      if (idx[d] < shape[d]) break;
      oa -= sa[d] * shape[d];
      ob -= sb[d] * shape[d];
      idx[d] = 0;
    }
  }
}

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double k2OverSqrtPi = 1.12837916709551257390;  // erf'(x) = 2 / sqrt(pi) e^(-x^2)

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

double unary_value(UnaryFn fn, double x, double alpha) {
  switch (fn) {
    case UnaryFn::gelu:
      return 0.5 * x * (1.0 + std::erf(x * kSqrt1_2));
    case UnaryFn::silu:
      return x * sigmoid(x);
    case UnaryFn::sigmoid:
      return sigmoid(x);
    case UnaryFn::tanh:
      return std::tanh(x);
    case UnaryFn::leaky_relu:
      return x > 0 ? x : alpha * x;
    case UnaryFn::sqrt:
      return std::sqrt(x);
    case UnaryFn::rsqrt:
      return 1.0 / std::sqrt(x);
    case UnaryFn::exp:
      return std::exp(x);
    case UnaryFn::log:
      return std::log(x);
    case UnaryFn::square:
      return x * x;
    case UnaryFn::abs:
      return std::abs(x);
    case UnaryFn::neg:
      return -x;
    case UnaryFn::erf:
      return std::erf(x);
  }
  return 0;
}

// d f(x) / dx.
double unary_derivative(UnaryFn fn, double x, double alpha) {
  switch (fn) {
    case UnaryFn::gelu:
      return 0.5 * (1.0 + std::erf(x * kSqrt1_2)) + x * kInvSqrt2Pi * std::exp(-0.5 * x * x);
    case UnaryFn::silu: {
      const double s = sigmoid(x);
      return s * (1.0 + x * (1.0 - s));
    }
    case UnaryFn::sigmoid: {
      const double s = sigmoid(x);
      return s * (1.0 - s);
    }
    case UnaryFn::tanh: {
      const double t = std::tanh(x);
      return 1.0 - t * t;
    }
    case UnaryFn::leaky_relu:
      return x > 0 ? 1.0 : alpha;
    case UnaryFn::sqrt:
      return 0.5 / std::sqrt(x);
    case UnaryFn::rsqrt:
      return -0.5 / (x * std::sqrt(x));
    case UnaryFn::exp:
      return std::exp(x);
    case UnaryFn::log:
      return 1.0 / x;
    case UnaryFn::square:
      return 2.0 * x;
    case UnaryFn::abs:
      return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0);
    case UnaryFn::neg:
      return -1.0;
    case UnaryFn::erf:
      return k2OverSqrtPi * std::exp(-x * x);
  }
  return 0;
}

}  // namespace

void unary(const Op& op, const Buffer& x, Buffer& out) {
  const auto fn = static_cast<UnaryFn>(op.i("fn"));
  const double alpha = op.r("alpha");
  for (std::size_t i = 0; i < out.f.size(); ++i)
    out.f[i] = static_cast<float>(unary_value(fn, x.f[i], alpha));
}

void unary_grad(const Op& op, const Buffer& dy, const Buffer& x, Buffer& out) {
  const auto fn = static_cast<UnaryFn>(op.i("fn"));
  const double alpha = op.r("alpha");
  for (std::size_t i = 0; i < out.f.size(); ++i)
    out.f[i] = static_cast<float>(dy.f[i] * unary_derivative(fn, x.f[i], alpha));
}

void binary(const Op& op, const Buffer& a, const Buffer& b, Buffer& out) {
  const auto fn = static_cast<BinaryFn>(op.i("fn"));
  const Shape& s = out.info.shape;
  const auto sa = broadcast_strides(a.info.shape, s), sb = broadcast_strides(b.info.shape, s);
  const float *pa = a.f.data(), *pb = b.f.data();
  float* po = out.f.data();
  switch (fn) {
    case BinaryFn::add:
      for_each_index(s, sa, sb,
                     [&](std::size_t o, std::size_t i, std::size_t j) { po[o] = pa[i] + pb[j]; });
      break;
    case BinaryFn::sub:
      for_each_index(s, sa, sb,
                     [&](std::size_t o, std::size_t i, std::size_t j) { po[o] = pa[i] - pb[j]; });
      break;
    case BinaryFn::mul:
      for_each_index(s, sa, sb,
                     [&](std::size_t o, std::size_t i, std::size_t j) { po[o] = pa[i] * pb[j]; });
      break;
    case BinaryFn::div:
      for_each_index(s, sa, sb,
                     [&](std::size_t o, std::size_t i, std::size_t j) { po[o] = pa[i] / pb[j]; });
      break;
  }
}

void reduce_sum(const Op& op, const Buffer& x, Buffer& out) {
  const Shape& in = x.info.shape;
  const auto& axes = op.list("axes");
  // Strides of the output seen from the input's axes (0 on reduced axes).
  Shape kept = in;
  for (auto ax : axes) kept[static_cast<std::size_t>(ax)] = 1;
  const auto so = broadcast_strides(kept, in);
  std::vector<double> acc(out.f.size(), 0.0);
  const float* px = x.f.data();
  for_each_index(in, strides_of(in), so,
                 [&](std::size_t, std::size_t i, std::size_t o) { acc[o] += px[i]; });
  const double scale = op.r("scale");
  for (std::size_t i = 0; i < acc.size(); ++i) out.f[i] = static_cast<float>(acc[i] * scale);
}

void broadcast_to(const Op& op, const Buffer& x, Buffer& out) {
  const Shape& s = out.info.shape;
  const float scale = static_cast<float>(op.r("scale"));
  const float* px = x.f.data();
  float* po = out.f.data();
  for_each_index(s, broadcast_strides(x.info.shape, s), std::vector<std::size_t>(s.size(), 0),
                 [&](std::size_t o, std::size_t i, std::size_t) { po[o] = px[i] * scale; });
}

void permute(const Op& op, const Buffer& x, Buffer& out) {
  const auto& perm = op.list("perm");
  const auto in_strides = strides_of(x.info.shape);
  std::vector<std::size_t> sa(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i)
    sa[i] = in_strides[static_cast<std::size_t>(perm[i])];
  const std::vector<std::size_t> zero(perm.size(), 0);
  if (x.info.dtype == DType::f32)
    for_each_index(out.info.shape, sa, zero,
                   [&](std::size_t o, std::size_t i, std::size_t) { out.f[o] = x.f[i]; });
  else
    for_each_index(out.info.shape, sa, zero,
                   [&](std::size_t o, std::size_t i, std::size_t) { out.i[o] = x.i[i]; });
}

namespace {
// (outer, axis length, inner) of a shape around one axis.
struct AxisSplit {
  std::size_t outer = 1, len = 1, inner = 1;
};
AxisSplit split_at(const Shape& s, std::size_t axis) {
  AxisSplit a;
  for (std::size_t d = 0; d < s.size(); ++d)
    (d < axis ? a.outer : d == axis ? a.len : a.inner) *= s[d];
  return a;
}

template <class T>
void copy_block(const std::vector<T>& src, std::size_t src_off, std::vector<T>& dst,
                std::size_t dst_off, std::size_t count) {
  std::copy(src.begin() + static_cast<std::ptrdiff_t>(src_off),
            src.begin() + static_cast<std::ptrdiff_t>(src_off + count),
            dst.begin() + static_cast<std::ptrdiff_t>(dst_off));
}

// Copies the [begin, begin+len) rows along `axis` of `big` from/to `small`.
void slice_copy(const Buffer& from, Buffer& to, std::size_t axis, std::size_t begin,
                bool from_is_big) {
  const Shape& big = from_is_big ? from.info.shape : to.info.shape;
  const Shape& small = from_is_big ? to.info.shape : from.info.shape;
  const AxisSplit b = split_at(big, axis), s = split_at(small, axis);
  const std::size_t block = s.len * s.inner;
  for (std::size_t o = 0; o < b.outer; ++o) {
    const std::size_t big_off = (o * b.len + begin) * b.inner, small_off = o * block;
    const std::size_t src = from_is_big ? big_off : small_off,
                      dst = from_is_big ? small_off : big_off;
    if (from.info.dtype == DType::f32)
      copy_block(from.f, src, to.f, dst, block);
    else
      copy_block(from.i, src, to.i, dst, block);
  }
}
}  // namespace

void slice(const Op& op, const Buffer& x, Buffer& out) {
  slice_copy(x, out, static_cast<std::size_t>(op.i("axis")),
             static_cast<std::size_t>(op.i("begin")), true);
}

void slice_grad(const Op& op, const Buffer& dy, Buffer& out) {
  slice_copy(dy, out, static_cast<std::size_t>(op.i("axis")),
             static_cast<std::size_t>(op.i("begin")), false);
}

void concat(const Op& op, const std::vector<const Buffer*>& xs, Buffer& out) {
  const auto axis = static_cast<std::size_t>(op.i("axis"));
  std::size_t begin = 0;
  for (const Buffer* x : xs) {
    slice_copy(*x, out, axis, begin, false);
    begin += x->info.shape[axis];
  }
}

void batch_matmul(const Op& op, const Buffer& a, const Buffer& b, Buffer& out) {
  const Shape& so = out.info.shape;
  const std::size_t r = so.size(), m = so[r - 2], n = so[r - 1];
  const std::size_t k = op.transpose_a ? a.info.shape[r - 2] : a.info.shape[r - 1];
  std::size_t batches = 1;
  for (std::size_t d = 0; d + 2 < r; ++d) batches *= so[d];
  for (std::size_t bi = 0; bi < batches; ++bi) {
    const float* pa = a.f.data() + bi * m * k;
    const float* pb = b.f.data() + bi * k * n;
    float* po = out.f.data() + bi * m * n;
    for (std::size_t row = 0; row < m; ++row)
      for (std::size_t p = 0; p < k; ++p) {
        const float av = op.transpose_a ? pa[p * m + row] : pa[row * k + p];
        if (op.transpose_b)
          for (std::size_t c = 0; c < n; ++c) po[row * n + c] += av * pb[c * k + p];
        else
          for (std::size_t c = 0; c < n; ++c) po[row * n + c] += av * pb[p * n + c];
      }
  }
}

void softmax(const Buffer& x, Buffer& out) {
  const std::size_t n = x.info.shape.back(), rows = n ? x.f.size() / n : 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = &x.f[r * n];
    const float mx = *std::max_element(row, row + n);
    double s = 0;
    for (std::size_t c = 0; c < n; ++c) s += std::exp(static_cast<double>(row[c] - mx));
    for (std::size_t c = 0; c < n; ++c)
      out.f[r * n + c] = static_cast<float>(std::exp(static_cast<double>(row[c] - mx)) / s);
  }
}

void softmax_grad(const Buffer& dy, const Buffer& y, Buffer& out) {
  const std::size_t n = y.info.shape.back(), rows = n ? y.f.size() / n : 0;
  for (std::size_t r = 0; r < rows; ++r) {
    double dot = 0;
    for (std::size_t c = 0; c < n; ++c)
      dot += static_cast<double>(dy.f[r * n + c]) * y.f[r * n + c];
    for (std::size_t c = 0; c < n; ++c)
      out.f[r * n + c] = static_cast<float>(y.f[r * n + c] * (dy.f[r * n + c] - dot));
  }
}

void gather_rows(const Op& op, const Buffer& table, const Buffer& indices, Buffer& out) {
  const std::size_t rows = table.info.shape[0], d = table.info.shape[1];
  for (std::size_t i = 0; i < indices.i.size(); ++i) {
    const std::int32_t k = indices.i[i];
    if (k < 0 || static_cast<std::size_t>(k) >= rows)
      throw IrError(std::string(op_name(op.kind)) + " '" + op.name + "': index " +
                    std::to_string(k) + " at position " + std::to_string(i) +
                    " is outside the table's " + std::to_string(rows) + " rows");
    std::copy_n(&table.f[static_cast<std::size_t>(k) * d], d, &out.f[i * d]);
  }
}

void scatter_add_rows(const Op& op, const Buffer& dy, const Buffer& indices, Buffer& out) {
  const std::size_t rows = out.info.shape[0], d = out.info.shape[1];
  for (std::size_t i = 0; i < indices.i.size(); ++i) {
    const std::int32_t k = indices.i[i];
    if (k < 0 || static_cast<std::size_t>(k) >= rows)
      throw IrError(std::string(op_name(op.kind)) + " '" + op.name + "': index " +
                    std::to_string(k) + " is outside [0, " + std::to_string(rows) + ")");
    for (std::size_t c = 0; c < d; ++c)
      out.f[static_cast<std::size_t>(k) * d + c] += dy.f[i * d + c];
  }
}

}  // namespace ipupod::models::kernels
