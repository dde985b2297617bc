// Plain, readable CPU kernels for every IR op.
#include "models/interpreter.hpp"

#include <algorithm>
#include <cmath>

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
  const double bound = graph.ops().at(*v.producer).scalar;
  Buffer b = Buffer::zeros(v.info);
  const std::uint64_t key = mix(seed ^ mix(static_cast<std::uint64_t>(param) + 1));
  for (std::size_t i = 0; i < b.f.size(); ++i) {
    const double u = static_cast<double>(mix(key + i) >> 11) * 0x1.0p-53;  // [0, 1)
    b.f[i] = static_cast<float>((2.0 * u - 1.0) * bound);
  }
  return b;
}

Interpreter::Interpreter(const Graph& graph, std::uint64_t seed) : graph_(graph) {
  for (ValueId p : graph.parameters()) values_[p] = initial_parameter(graph, p, seed);
}

void Interpreter::set(ValueId id, Buffer buffer) {
  if (buffer.info.shape != graph_.info(id).shape || buffer.info.dtype != graph_.info(id).dtype)
    throw IrError("Interpreter::set of '" + graph_.value(id).name + "': expected " +
                  graph_.info(id).str() + ", got " + buffer.info.str());
  values_[id] = std::move(buffer);
}

const Buffer& Interpreter::get(ValueId id) const {
  auto it = values_.find(id);
  if (it == values_.end())
    throw IrError("Interpreter: value '" + graph_.value(id).name + "' has not been computed or set");
  return it->second;
}

void Interpreter::run(std::vector<Phase> phases) {
  for (const Op& op : graph_.ops()) {
    if (std::find(phases.begin(), phases.end(), op.phase) == phases.end()) continue;
    const auto in = [&](std::size_t k) -> const Buffer& { return get(op.inputs[k]); };
    Buffer out = op.output ? Buffer::zeros(graph_.info(*op.output)) : Buffer{};
    switch (op.kind) {
      case OpKind::input:
        if (!values_.count(*op.output))
          throw IrError("Interpreter: input '" + op.name + "' was not set");
        continue;
      case OpKind::parameter:
        continue;
      case OpKind::constant:
        std::fill(out.f.begin(), out.f.end(), static_cast<float>(op.scalar));
        break;
      case OpKind::reshape:
        out.f = in(0).f;
        out.i = in(0).i;
        break;
      case OpKind::matmul: {
        const Buffer &a = in(0), &b = in(1);
        const std::size_t m = out.info.shape[0], n = out.info.shape[1];
        const std::size_t k = op.transpose_a ? a.info.shape[0] : a.info.shape[1];
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
        for (std::size_t i = 0; i < out.f.size(); ++i)
          out.f[i] = in(1).f[i] > 0.f ? in(0).f[i] : 0.f;
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
            throw IrError(op.name + ": label " + std::to_string(y) + " of row " +
                          std::to_string(r) + " is outside [0, " + std::to_string(classes) + ")");
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
        Buffer& p = values_.at(op.inputs[0]);
        const Buffer& g = in(1);
        for (std::size_t i = 0; i < p.f.size(); ++i)
          p.f[i] -= static_cast<float>(op.scalar) * g.f[i];
        continue;
      }
    }
    values_[*op.output] = std::move(out);
  }
}

}  // namespace ipupod::models
