// Interpreter kernels that draw random numbers or update state in place: dropout masks, vector
// quantisation with its EMA codebook, learning-rate schedules and the optimizer steps.
#include <algorithm>
#include <cmath>
#include <limits>

#include "models/kernels.hpp"

namespace ipupod::models::kernels {
namespace {
std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
constexpr double kPi = 3.14159265358979323846;
}  // namespace

void random_mask(const Op& op, std::uint64_t invocation, Buffer& out) {
  const double p = op.r("p");
  const auto seed = static_cast<std::uint64_t>(op.i("seed"));
  const std::uint64_t key = mix(seed ^ mix(invocation + 0x51ed27));
  const float keep_value = static_cast<float>(1.0 / (1.0 - p));
  for (std::size_t i = 0; i < out.f.size(); ++i) {
    const double u = static_cast<double>(mix(key + i) >> 11) * 0x1.0p-53;
    out.f[i] = u >= p ? keep_value : 0.f;
  }
}

void vq_nearest(const Buffer& z, const Buffer& codebook, Buffer& out) {
  const std::size_t rows = z.info.shape[0], d = z.info.shape[1], k = codebook.info.shape[0];
  for (std::size_t r = 0; r < rows; ++r) {
    double best = std::numeric_limits<double>::infinity();
    std::int32_t at = 0;
    for (std::size_t c = 0; c < k; ++c) {
      double dist = 0;
      for (std::size_t j = 0; j < d; ++j) {
        const double diff = static_cast<double>(z.f[r * d + j]) - codebook.f[c * d + j];
        dist += diff * diff;
      }
      if (dist < best) best = dist, at = static_cast<std::int32_t>(c);  // first minimum wins
    }
    out.i[r] = at;
  }
}

void vq_ema_update(const Op& op, const Buffer& z, const Buffer& indices, Buffer& codebook,
                   Buffer& cluster_size, Buffer& embed_sum) {
  const double decay = op.r("decay"), eps = op.r("eps");
  const std::size_t rows = z.info.shape[0], d = z.info.shape[1], k = codebook.info.shape[0];
  std::vector<double> counts(k, 0.0), sums(k * d, 0.0);
  for (std::size_t r = 0; r < rows; ++r) {
    const auto c = static_cast<std::size_t>(indices.i[r]);
    counts[c] += 1;
    for (std::size_t j = 0; j < d; ++j) sums[c * d + j] += z.f[r * d + j];
  }
  double total = 0;
  for (std::size_t c = 0; c < k; ++c) {
    cluster_size.f[c] = static_cast<float>(decay * cluster_size.f[c] + (1 - decay) * counts[c]);
    total += cluster_size.f[c];
    for (std::size_t j = 0; j < d; ++j)
      embed_sum.f[c * d + j] =
          static_cast<float>(decay * embed_sum.f[c * d + j] + (1 - decay) * sums[c * d + j]);
  }
  // Laplace smoothing keeps rarely used codes from dividing by (nearly) zero; codes that were
  // never chosen keep their initial value instead of collapsing to the origin.
  for (std::size_t c = 0; c < k; ++c) {
    if (cluster_size.f[c] <= 0.f) continue;
    const double smoothed =
        (cluster_size.f[c] + eps) / (total + static_cast<double>(k) * eps) * total;
    for (std::size_t j = 0; j < d; ++j)
      codebook.f[c * d + j] = static_cast<float>(embed_sum.f[c * d + j] / smoothed);
  }
}

void lr_schedule(const Op& op, const Buffer& step, Buffer& out) {
  const double base = op.r("base_lr");
  const double k = std::max(0.0, static_cast<double>(step.f[0]) - 1.0);  // 0-based step index
  const double warmup = static_cast<double>(op.i("warmup_steps"));
  double lr = base;
  if (k < warmup) {
    lr = base * (k + 1) / warmup;
  } else {
    switch (static_cast<ScheduleKind>(op.i("schedule"))) {
      case ScheduleKind::constant:
        break;
      case ScheduleKind::step: {
        const double size = static_cast<double>(std::max<std::int64_t>(1, op.i("step_size")));
        lr = base * std::pow(op.r("gamma"), std::floor((k - warmup) / size));
        break;
      }
      case ScheduleKind::cosine: {
        const double total = static_cast<double>(op.i("total_steps"));
        const double span = std::max(1.0, total - warmup);
        const double progress = std::min(1.0, (k - warmup) / span);
        const double min_lr = op.r("min_lr");
        lr = min_lr + 0.5 * (base - min_lr) * (1 + std::cos(kPi * progress));
        break;
      }
    }
  }
  out.f[0] = static_cast<float>(lr);
}

void global_norm(const std::vector<const Buffer*>& grads, Buffer& out) {
  double s = 0;
  for (const Buffer* g : grads)
    for (float v : g->f) s += static_cast<double>(v) * v;
  out.f[0] = static_cast<float>(std::sqrt(s));
}

void clip_factor(const Op& op, const Buffer& norm, Buffer& out) {
  const double max_norm = op.r("max_norm"), scale = op.r("scale");
  double f = 1.0;
  if (max_norm > 0) f = std::min(1.0, max_norm / (static_cast<double>(norm.f[0]) + 1e-6));
  out.f[0] = static_cast<float>(f * scale);
}

void sgd_momentum_step(const Op& op, Buffer& param, const Buffer& grad, Buffer& velocity,
                       const Buffer& lr) {
  const float mu = static_cast<float>(op.r("momentum")),
              wd = static_cast<float>(op.r("weight_decay"));
  const bool nesterov = op.i("nesterov") != 0;
  const float rate = lr.f[0];
  for (std::size_t i = 0; i < param.f.size(); ++i) {
    float g = grad.f[i] + wd * param.f[i];
    velocity.f[i] = mu * velocity.f[i] + g;
    g = nesterov ? g + mu * velocity.f[i] : velocity.f[i];
    param.f[i] -= rate * g;
  }
}

namespace {
// The Adam moments update shared by Adam, AdamW and LAMB; returns the bias corrections.
std::pair<double, double> update_moments(const Op& op, const Buffer& grad, Buffer& m, Buffer& v,
                                         const std::vector<float>& g, const Buffer& step) {
  const float b1 = static_cast<float>(op.r("beta1")), b2 = static_cast<float>(op.r("beta2"));
  for (std::size_t i = 0; i < grad.f.size(); ++i) {
    m.f[i] = m.f[i] * b1 + (1 - b1) * g[i];
    v.f[i] = v.f[i] * b2 + (1 - b2) * g[i] * g[i];
  }
  const double t = step.f[0];
  return {1 - std::pow(op.r("beta1"), t), 1 - std::pow(op.r("beta2"), t)};
}
}  // namespace

void adam_step(const Op& op, Buffer& param, const Buffer& grad, Buffer& m, Buffer& v,
               const Buffer& lr, const Buffer& step) {
  const float wd = static_cast<float>(op.r("weight_decay")), eps = static_cast<float>(op.r("eps"));
  const bool decoupled = op.i("decoupled") != 0;
  const float rate = lr.f[0];
  std::vector<float> g = grad.f;
  if (decoupled) {
    for (float& p : param.f) p *= 1 - rate * wd;
  } else if (wd != 0) {
    for (std::size_t i = 0; i < g.size(); ++i) g[i] += wd * param.f[i];
  }
  const auto [bc1, bc2] = update_moments(op, grad, m, v, g, step);
  const float step_size = static_cast<float>(rate / bc1),
              bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  for (std::size_t i = 0; i < param.f.size(); ++i)
    param.f[i] -= step_size * m.f[i] / (std::sqrt(v.f[i]) / bc2_sqrt + eps);
}

void lamb_step(const Op& op, Buffer& param, const Buffer& grad, Buffer& m, Buffer& v,
               const Buffer& lr, const Buffer& step) {
  const double wd = op.r("weight_decay"), eps = op.r("eps");
  const auto [bc1, bc2] = update_moments(op, grad, m, v, grad.f, step);
  std::vector<double> u(param.f.size());
  double pn = 0, un = 0;
  for (std::size_t i = 0; i < u.size(); ++i) {
    u[i] = (m.f[i] / bc1) / (std::sqrt(v.f[i] / bc2) + eps) + wd * param.f[i];
    pn += static_cast<double>(param.f[i]) * param.f[i];
    un += u[i] * u[i];
  }
  const double trust = pn > 0 && un > 0 ? std::sqrt(pn) / std::sqrt(un) : 1.0;
  for (std::size_t i = 0; i < u.size(); ++i)
    param.f[i] = static_cast<float>(param.f[i] - lr.f[0] * trust * u[i]);
}

}  // namespace ipupod::models::kernels
