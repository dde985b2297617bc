// The three microstructure generators. Every random choice goes through datasets::Random, so a
// sample is a pure function of its seed.
#include "datasets/microstructure_generators.hpp"

#include <algorithm>
#include <cmath>

namespace ipupod::datasets {
namespace {

constexpr double kMinRadius = 1.0 / 40, kMaxRadius = 1.0 / 10;  // of the image side
constexpr int kPlacementTries = 30;  // free places tried before a disk may overlap
constexpr double kMinCorrelation = 1.0 / 64, kMaxCorrelation = 1.0 / 12;  // of the side
constexpr double kGaussianCutoff = 3;  // kernel half-width in standard deviations

struct Disk {
  double x, y, r;
};

// Gaussian blur along rows then columns, mirrored at the edges.
std::vector<double> blur(const std::vector<double>& in, std::size_t size, double sigma) {
  const auto radius = static_cast<long>(std::ceil(kGaussianCutoff * sigma));
  std::vector<double> kernel(static_cast<std::size_t>(2 * radius + 1));
  double total = 0;
  for (long t = -radius; t <= radius; ++t) {
    total += kernel[static_cast<std::size_t>(t + radius)] =
        std::exp(-0.5 * static_cast<double>(t * t) / (sigma * sigma));
  }
  for (double& w : kernel) w /= total;
  const auto n = static_cast<long>(size);
  auto mirror = [n](long i) {
    while (i < 0 || i >= n) i = i < 0 ? -i - 1 : 2 * n - i - 1;
    return static_cast<std::size_t>(i);
  };
  std::vector<double> rows(in.size()), out(in.size());
  for (std::size_t y = 0; y < size; ++y) {
    for (long x = 0; x < n; ++x) {
      double sum = 0;
      for (long t = -radius; t <= radius; ++t) {
        sum += kernel[static_cast<std::size_t>(t + radius)] * in[y * size + mirror(x + t)];
      }
      rows[y * size + static_cast<std::size_t>(x)] = sum;
    }
  }
  for (long y = 0; y < n; ++y) {
    for (std::size_t x = 0; x < size; ++x) {
      double sum = 0;
      for (long t = -radius; t <= radius; ++t) {
        sum += kernel[static_cast<std::size_t>(t + radius)] * rows[mirror(y + t) * size + x];
      }
      out[static_cast<std::size_t>(y) * size + x] = sum;
    }
  }
  return out;
}

// Conducting (1) where value > threshold when `high_conducts`, else where value <= threshold.
PhaseMap threshold(const std::vector<double>& values, double conducting_fraction,
                   bool high_conducts) {
  const double cut =
      quantile(values, high_conducts ? 1 - conducting_fraction : conducting_fraction);
  PhaseMap phase(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    phase[i] = (high_conducts ? values[i] > cut : values[i] <= cut) ? 1 : 0;
  }
  return phase;
}

}  // namespace

double quantile(std::vector<double> values, double fraction) {
  const auto rank = static_cast<std::size_t>(std::clamp(
      fraction * static_cast<double>(values.size()), 0.0, static_cast<double>(values.size() - 1)));
  std::nth_element(values.begin(), values.begin() + static_cast<long>(rank), values.end());
  return values[rank];
}

PhaseMap particle_packing(std::size_t size, double conducting_fraction, Random& random) {
  PhaseMap phase(size * size, 1);
  const auto side = static_cast<double>(size);
  const auto target_solid = static_cast<std::size_t>((1 - conducting_fraction) * side * side);
  std::size_t solid = 0;
  std::vector<Disk> disks;
  while (solid < target_solid) {
    Disk disk{0, 0, random.uniform(kMinRadius, kMaxRadius) * side};
    for (int attempt = 0; attempt < kPlacementTries; ++attempt) {
      disk.x = random.uniform(0, side);
      disk.y = random.uniform(0, side);
      const bool clear = std::none_of(disks.begin(), disks.end(), [&](const Disk& other) {
        return std::hypot(disk.x - other.x, disk.y - other.y) < disk.r + other.r;
      });
      if (clear) break;
    }
    disks.push_back(disk);
    const auto y0 = static_cast<long>(std::max(0.0, std::floor(disk.y - disk.r)));
    const auto y1 = static_cast<long>(std::min(side - 1, std::ceil(disk.y + disk.r)));
    const auto x0 = static_cast<long>(std::max(0.0, std::floor(disk.x - disk.r)));
    const auto x1 = static_cast<long>(std::min(side - 1, std::ceil(disk.x + disk.r)));
    for (long y = y0; y <= y1; ++y) {
      for (long x = x0; x <= x1; ++x) {
        const double dx = static_cast<double>(x) + 0.5 - disk.x;
        const double dy = static_cast<double>(y) + 0.5 - disk.y;
        std::uint8_t& cell =
            phase[static_cast<std::size_t>(y) * size + static_cast<std::size_t>(x)];
        if (dx * dx + dy * dy <= disk.r * disk.r && cell == 1) {
          cell = 0;
          ++solid;
        }
      }
    }
  }
  return phase;
}

PhaseMap gaussian_random_field(std::size_t size, double conducting_fraction, Random& random) {
  const double sigma = random.uniform(kMinCorrelation, kMaxCorrelation) * static_cast<double>(size);
  std::vector<double> noise(size * size);
  for (double& value : noise) value = random.normal();
  return threshold(blur(noise, size, sigma), conducting_fraction, /*high_conducts=*/true);
}

PhaseMap texture_crop(const Image& grey_texture, std::size_t size, double conducting_fraction,
                      Random& random) {
  const std::size_t shorter = std::min(grey_texture.height, grey_texture.width);
  const std::size_t side = shorter <= size ? shorter : size + random.below(shorter - size + 1);
  const std::size_t y = random.below(grey_texture.height - side + 1);
  const std::size_t x = random.below(grey_texture.width - side + 1);
  const Image window = resize_bicubic(crop(grey_texture, y, x, side, side), size, size);
  const bool flip_x = random.uniform() < 0.5, flip_y = random.uniform() < 0.5;
  std::vector<double> values(size * size);
  for (std::size_t r = 0; r < size; ++r) {
    for (std::size_t c = 0; c < size; ++c) {
      values[r * size + c] = window.at(0, flip_y ? size - 1 - r : r, flip_x ? size - 1 - c : c);
    }
  }
  return threshold(values, conducting_fraction, /*high_conducts=*/false);
}

}  // namespace ipupod::datasets
