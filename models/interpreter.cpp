// Plain, readable CPU kernels for every IR op.
#include "models/interpreter.hpp"

#include <algorithm>
#include <cmath>

#include "models/kernels.hpp"

namespace ipupod::models {

Buffer Buffer::zeros(const TensorInfo& info) {
  Buffer b{info, {}, {}};
  (info.dtype == DType::f32 ? b.f.resize(info.elements()) : b.i.resize(info.elements()));
  return b;
}

namespace {
// splitmix64: a counter-based generator with the same output on every platform.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

Buffer initial_parameter(const Graph& graph, ValueId param, std::uint64_t seed) {
  const Value& v = graph.value(param);
  const Op& op = graph.ops().at(*v.producer);
  if (op.kind != OpKind::parameter && op.kind != OpKind::state)
    throw IrError("initial_parameter: '" + v.name + "' is a " + op_name(op.kind) +
                  ", not a parameter or state value");
  const double value = op.scalar;
  const auto init = op.attrs.ints.count("init") ? static_cast<InitKind>(op.attrs.ints.at("init"))
                                                : InitKind::uniform;
  Buffer b = Buffer::zeros(v.info);
  if (const std::vector<float>* given = graph.initial_values(param)) {  // an imported weight
    b.f = *given;
    return b;
  }
  const std::uint64_t key = mix(seed ^ mix(static_cast<std::uint64_t>(param) + 1));
  const auto uniform = [&](std::size_t i) {  // [0, 1)
    return static_cast<double>(mix(key + i) >> 11) * 0x1.0p-53;
  };
  switch (init) {
    case InitKind::uniform:
      for (std::size_t i = 0; i < b.f.size(); ++i)
        b.f[i] = static_cast<float>((2.0 * uniform(i) - 1.0) * value);
      break;
    case InitKind::fill:
      std::fill(b.f.begin(), b.f.end(), static_cast<float>(value));
      std::fill(b.i.begin(), b.i.end(), static_cast<std::int32_t>(value));
      break;
    case InitKind::normal:  // Box-Muller on two draws per element
      for (std::size_t i = 0; i < b.f.size(); ++i) {
        const double u1 = 1.0 - uniform(2 * i), u2 = uniform(2 * i + 1);
        b.f[i] = static_cast<float>(value * std::sqrt(-2.0 * std::log(u1)) *
                                    std::cos(6.283185307179586 * u2));
      }
      break;
    case InitKind::eye: {
      const std::size_t n = v.info.shape.at(0);
      for (std::size_t i = 0; i < n; ++i) b.f[i * n + i] = static_cast<float>(value);
      break;
    }
  }
  return b;
}

Interpreter::Interpreter(const Graph& graph, std::uint64_t seed) : graph_(graph) {
  for (ValueId p : graph.parameters()) values_[p] = initial_parameter(graph, p, seed);
  for (ValueId s : graph.states()) values_[s] = initial_parameter(graph, s, seed);
}

void Interpreter::set(ValueId id, Buffer buffer) {
  if (buffer.info.shape != graph_.info(id).shape || buffer.info.dtype != graph_.info(id).dtype)
    throw IrError("Interpreter::set of '" + graph_.value(id).name + "': expected " +
                  graph_.info(id).str() + ", got " + buffer.info.str());
  const std::size_t n = buffer.info.elements();
  if ((buffer.info.dtype == DType::f32 ? buffer.f.size() : buffer.i.size()) != n)
    throw IrError(
        "Interpreter::set of '" + graph_.value(id).name + "': the buffer holds " +
        std::to_string(buffer.info.dtype == DType::f32 ? buffer.f.size() : buffer.i.size()) +
        " elements, its shape " + buffer.info.str() + " needs " + std::to_string(n));
  values_[id] = std::move(buffer);
}

const Buffer& Interpreter::get(ValueId id) const {
  auto it = values_.find(id);
  if (it == values_.end())
    throw IrError("Interpreter: value '" + graph_.value(id).name +
                  "' has not been computed or set");
  return it->second;
}

void Interpreter::run(std::vector<Phase> phases) {
  const auto& ops = graph_.ops();
  for (std::size_t index = 0; index < ops.size(); ++index)
    if (std::find(phases.begin(), phases.end(), ops[index].phase) != phases.end())
      run_op(index, ops[index]);
}

void Interpreter::run_op(std::size_t index, const Op& op) {
  const auto in = [&](std::size_t k) -> const Buffer& { return get(op.inputs.at(k)); };
  const auto state = [&](std::size_t k) -> Buffer& { return values_.at(op.inputs.at(k)); };
  Buffer out = op.output ? Buffer::zeros(graph_.info(*op.output)) : Buffer{};
  switch (op.kind) {
    case OpKind::input:
      if (!values_.count(*op.output))
        throw IrError("Interpreter: input '" + op.name + "' was not set");
      return;
    case OpKind::parameter:
    case OpKind::state:
      return;
    case OpKind::constant:
      std::fill(out.f.begin(), out.f.end(), static_cast<float>(op.scalar));
      break;
    case OpKind::reshape:
    case OpKind::stop_gradient:
      out.f = in(0).f;
      out.i = in(0).i;
      break;
    case OpKind::matmul: {
      const Buffer &a = in(0), &b = in(1);
      const std::size_t m = out.info.shape[0], n = out.info.shape[1];
      const std::size_t k = op.transpose_a ? a.info.shape[0] : a.info.shape[1];
      if (!op.transpose_a && op.transpose_b) {  // rows of a against rows of b: contiguous dots
        for (std::size_t r = 0; r < m; ++r)
          for (std::size_t c = 0; c < n; ++c) {
            const float *pa = &a.f[r * k], *pb = &b.f[c * k];
            float s[4] = {0.f, 0.f, 0.f, 0.f};
            std::size_t p = 0;
            for (; p + 4 <= k; p += 4)
              for (std::size_t j = 0; j < 4; ++j) s[j] += pa[p + j] * pb[p + j];
            for (; p < k; ++p) s[0] += pa[p] * pb[p];
            out.f[r * n + c] = (s[0] + s[1]) + (s[2] + s[3]);
          }
        break;
      }
      for (std::size_t r = 0; r < m; ++r)
        for (std::size_t p = 0; p < k; ++p) {
          const float av = op.transpose_a ? a.f[p * m + r] : a.f[r * k + p];
          for (std::size_t c = 0; c < n; ++c)
            out.f[r * n + c] += av * (op.transpose_b ? b.f[c * k + p] : b.f[p * n + c]);
        }
      break;
    }
    case OpKind::add:
      for (std::size_t i = 0; i < out.f.size(); ++i) out.f[i] = in(0).f[i] + in(1).f[i];
      break;
    case OpKind::add_bias: {
      const std::size_t n = out.info.shape[1];
      for (std::size_t i = 0; i < out.f.size(); ++i) out.f[i] = in(0).f[i] + in(1).f[i % n];
      break;
    }
    case OpKind::relu:
      for (std::size_t i = 0; i < out.f.size(); ++i) out.f[i] = std::max(in(0).f[i], 0.f);
      break;
    case OpKind::relu_grad:
      for (std::size_t i = 0; i < out.f.size(); ++i) out.f[i] = in(1).f[i] > 0.f ? in(0).f[i] : 0.f;
      break;
    case OpKind::column_sum: {
      const std::size_t n = out.info.shape[0], m = in(0).info.shape[0];
      for (std::size_t r = 0; r < m; ++r)
        for (std::size_t c = 0; c < n; ++c) out.f[c] += in(0).f[r * n + c];
      break;
    }
    case OpKind::softmax_cross_entropy:
    case OpKind::softmax_cross_entropy_grad: {
      const Buffer &logits = in(0), &labels = in(1);
      const std::size_t m = logits.info.shape[0], classes = logits.info.shape[1];
      const bool grad = op.kind == OpKind::softmax_cross_entropy_grad;
      const float scale = grad ? in(2).f[0] / static_cast<float>(m) : 0.f;
      double total = 0;
      for (std::size_t r = 0; r < m; ++r) {
        const float* row = &logits.f[r * classes];
        const std::int32_t y = labels.i[r];
        if (y < 0 || static_cast<std::size_t>(y) >= classes)
          throw IrError(op.name + ": label " + std::to_string(y) + " of row " + std::to_string(r) +
                        " is outside [0, " + std::to_string(classes) + ")");
        const float mx = *std::max_element(row, row + classes);
        float s = 0.f;
        for (std::size_t c = 0; c < classes; ++c) s += std::exp(row[c] - mx);
        const float lse = mx + std::log(s);
        if (grad)
          for (std::size_t c = 0; c < classes; ++c)
            out.f[r * classes + c] =
                (std::exp(row[c] - lse) - (static_cast<std::size_t>(y) == c ? 1.f : 0.f)) * scale;
        else
          total += lse - row[y];
      }
      if (!grad) out.f[0] = static_cast<float>(total / static_cast<double>(m));
      break;
    }
    case OpKind::sgd_step: {
      Buffer& p = state(0);
      const Buffer& g = in(1);
      for (std::size_t i = 0; i < p.f.size(); ++i) p.f[i] -= static_cast<float>(op.scalar) * g.f[i];
      return;
    }
    case OpKind::unary:
      kernels::unary(op, in(0), out);
      break;
    case OpKind::unary_grad:
      kernels::unary_grad(op, in(0), in(1), out);
      break;
    case OpKind::binary:
      kernels::binary(op, in(0), in(1), out);
      break;
    case OpKind::reduce_sum:
      kernels::reduce_sum(op, in(0), out);
      break;
    case OpKind::broadcast_to:
      kernels::broadcast_to(op, in(0), out);
      break;
    case OpKind::permute:
      kernels::permute(op, in(0), out);
      break;
    case OpKind::slice:
      kernels::slice(op, in(0), out);
      break;
    case OpKind::slice_grad:
      kernels::slice_grad(op, in(0), out);
      break;
    case OpKind::concat: {
      std::vector<const Buffer*> xs;
      for (std::size_t k = 0; k < op.inputs.size(); ++k) xs.push_back(&in(k));
      kernels::concat(op, xs, out);
      break;
    }
    case OpKind::batch_matmul:
      kernels::batch_matmul(op, in(0), in(1), out);
      break;
    case OpKind::softmax:
      kernels::softmax(in(0), out);
      break;
    case OpKind::softmax_grad:
      kernels::softmax_grad(in(0), in(1), out);
      break;
    case OpKind::conv2d:
      kernels::conv2d(op, in(0), in(1), out);
      break;
    case OpKind::conv2d_grad_input:
    case OpKind::conv_transpose2d:
      kernels::conv2d_grad_input(op, in(0), in(1), out);
      break;
    case OpKind::conv2d_grad_weight:
      kernels::conv2d_grad_weight(op, in(0), in(1), out);
      break;
    case OpKind::max_pool2d:
      kernels::max_pool2d(op, in(0), out);
      break;
    case OpKind::max_pool2d_grad:
      kernels::max_pool2d_grad(op, in(0), in(1), out);
      break;
    case OpKind::avg_pool2d:
      kernels::avg_pool2d(op, in(0), out);
      break;
    case OpKind::avg_pool2d_grad:
      kernels::avg_pool2d_grad(op, in(0), out);
      break;
    case OpKind::normalize:
      kernels::normalize(op, in(0), out);
      break;
    case OpKind::normalize_grad:
      kernels::normalize_grad(op, in(0), in(1), out);
      break;
    case OpKind::batch_norm_inference:
      kernels::batch_norm_inference(op, in(0), in(1), in(2), out);
      break;
    case OpKind::batch_norm_stats_update:
      kernels::batch_norm_stats_update(op, in(0), state(1), state(2));
      return;
    case OpKind::gather_rows:
      kernels::gather_rows(op, in(0), in(1), out);
      break;
    case OpKind::scatter_add_rows:
      kernels::scatter_add_rows(op, in(0), in(1), out);
      break;
    case OpKind::random_mask:
      kernels::random_mask(op, invocations_[index]++, out);
      break;
    case OpKind::vq_nearest:
      kernels::vq_nearest(in(0), in(1), out);
      break;
    case OpKind::vq_ema_update:
      kernels::vq_ema_update(op, in(0), in(1), state(2), state(3), state(4));
      return;
    case OpKind::increment:
      for (float& v : state(0).f) v += 1.f;
      return;
    case OpKind::lr_schedule:
      kernels::lr_schedule(op, in(0), out);
      break;
    case OpKind::global_norm: {
      std::vector<const Buffer*> gs;
      for (std::size_t k = 0; k < op.inputs.size(); ++k) gs.push_back(&in(k));
      kernels::global_norm(gs, out);
      break;
    }
    case OpKind::clip_factor:
      kernels::clip_factor(op, in(0), out);
      break;
    case OpKind::sgd_momentum_step:
      kernels::sgd_momentum_step(op, state(0), in(1), state(2), in(3));
      return;
    case OpKind::adam_step:
      kernels::adam_step(op, state(0), in(1), state(2), state(3), in(4), in(5));
      return;
    case OpKind::lamb_step:
      kernels::lamb_step(op, state(0), in(1), state(2), state(3), in(4), in(5));
      return;
  }
  values_[*op.output] = std::move(out);
}

}  // namespace ipupod::models
