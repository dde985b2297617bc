// The finite-volume conductivity solver against exact answers (layered media), the Wiener and
// Hashin-Shtrikman bounds on random media, and the microstructure generators' contracts.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "datasets/conductivity.hpp"
#include "datasets/image_io.hpp"
#include "datasets/microstructure_generators.hpp"
#include "datasets/random.hpp"

namespace ipupod::datasets {
namespace {

constexpr double kTolerance = 1e-10;

// Conductivity of cell (y, x) from a per-row or per-column profile.
std::vector<double> layered(std::size_t height, std::size_t width,
                            const std::vector<double>& profile, bool along_rows) {
  std::vector<double> k(height * width);
  for (std::size_t y = 0; y < height; ++y) {
    for (std::size_t x = 0; x < width; ++x) k[y * width + x] = along_rows ? profile[y] : profile[x];
  }
  return k;
}

std::vector<double> random_profile(std::size_t n, std::uint64_t seed) {
  Random random(seed);
  std::vector<double> profile(n);
  for (double& value : profile) value = random.uniform() < 0.5 ? 1.0 : random.uniform(1e-3, 0.5);
  return profile;
}

TEST(ConductivitySolver, UniformMediumHasItsOwnConductivity) {
  const std::vector<double> k(24 * 40, 2.5);
  EXPECT_NEAR(solve_effective_conductivity(k, 24, 40, {.tolerance = kTolerance}).effective, 2.5,
              1e-9);
}

TEST(ConductivitySolver, LayersParallelToTheFieldGiveTheArithmeticMean) {
  const std::size_t height = 30, width = 17;
  const std::vector<double> profile = random_profile(height, 1);
  const double mean = std::accumulate(profile.begin(), profile.end(), 0.0) / height;
  const auto solution = solve_effective_conductivity(layered(height, width, profile, true), height,
                                                     width, {.tolerance = kTolerance});
  EXPECT_NEAR(solution.effective, mean, 1e-9 * mean);
}

TEST(ConductivitySolver, LayersInSeriesGiveTheHarmonicMean) {
  const std::size_t height = 12, width = 41;
  const std::vector<double> profile = random_profile(width, 2);
  double resistance = 0;
  for (double k : profile) resistance += 1 / k;
  const double harmonic = width / resistance;
  const auto solution = solve_effective_conductivity(layered(height, width, profile, false), height,
                                                     width, {.tolerance = kTolerance});
  EXPECT_GT(solution.iterations, 0u);
  EXPECT_NEAR(solution.effective, harmonic, 1e-7 * harmonic);
}

TEST(ConductivitySolver, MirroredMediumHasTheSameConductivity) {
  // Mirroring left-right swaps the roles of the two electrodes (u -> 1 - u), mirroring top-bottom
  // changes nothing physical: the effective conductivity is exactly invariant under both.
  const std::size_t n = 40;
  Random random(9);
  const PhaseMap phase = gaussian_random_field(n, 0.5, random);
  std::vector<double> k(n * n), left_right(n * n), top_bottom(n * n);
  for (std::size_t y = 0; y < n; ++y) {
    for (std::size_t x = 0; x < n; ++x) {
      const double value = phase[y * n + x] ? 1.0 : 0.02;
      k[y * n + x] = value;
      left_right[y * n + (n - 1 - x)] = value;
      top_bottom[(n - 1 - y) * n + x] = value;
    }
  }
  const auto original = solve_effective_conductivity(k, n, n, {.tolerance = 1e-11});
  EXPECT_GT(original.iterations, 5u);
  EXPECT_NEAR(solve_effective_conductivity(left_right, n, n, {.tolerance = 1e-11}).effective,
              original.effective, 1e-8 * original.effective);
  EXPECT_NEAR(solve_effective_conductivity(top_bottom, n, n, {.tolerance = 1e-11}).effective,
              original.effective, 1e-8 * original.effective);
}

TEST(ConductivitySolver, RejectsBadInput) {
  EXPECT_THROW(solve_effective_conductivity(std::vector<double>(10, 1.0), 3, 3),
               std::invalid_argument);
  EXPECT_THROW(solve_effective_conductivity(std::vector<double>{1, 0, 1, 1}, 2, 2),
               std::invalid_argument);
  // An iteration cap that cannot be met names the residual.
  const std::vector<double> profile = random_profile(33, 3);
  try {
    solve_effective_conductivity(layered(8, 33, profile, false), 8, 33,
                                 {.tolerance = 1e-12, .max_iterations = 1});
    FAIL() << "expected a runtime_error";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("did not reach"), std::string::npos) << error.what();
  }
}

TEST(ConductivityBounds, HashinShtrikmanLiesInsideWiener) {
  for (double fraction : {0.0, 0.2, 0.5, 0.8, 1.0}) {
    const auto wiener = wiener_bounds(1.0, 0.01, fraction);
    const auto hs = hashin_shtrikman_bounds_2d(1.0, 0.01, fraction);
    EXPECT_LE(wiener.lower, hs.lower + 1e-12);
    EXPECT_LE(hs.lower, hs.upper + 1e-12);
    EXPECT_LE(hs.upper, wiener.upper + 1e-12);
  }
  // The closed forms, written out for one case.
  const auto hs = hashin_shtrikman_bounds_2d(1.0, 0.5, 0.5);
  EXPECT_NEAR(hs.upper, 1.0 + 0.5 / (1 / (0.5 - 1.0) + 0.5 / 2.0), 1e-12);
  EXPECT_NEAR(hs.lower, 0.5 + 0.5 / (1 / (1.0 - 0.5) + 0.5 / 1.0), 1e-12);
}

double conducting_share(const PhaseMap& phase) {
  return static_cast<double>(std::count(phase.begin(), phase.end(), 1)) /
         static_cast<double>(phase.size());
}

void expect_within_bounds(const PhaseMap& phase, std::size_t size, double contrast,
                          const std::string& what) {
  std::vector<double> k(phase.size());
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = phase[i] ? 1.0 : contrast;
  const double fraction = conducting_share(phase);
  const double effective =
      solve_effective_conductivity(k, size, size, {.tolerance = 1e-8}).effective;
  const auto wiener = wiener_bounds(1.0, contrast, fraction);
  const auto hs = hashin_shtrikman_bounds_2d(1.0, contrast, fraction);
  EXPECT_GE(effective, wiener.lower) << what;
  EXPECT_LE(effective, wiener.upper) << what;
  EXPECT_GE(effective, hs.lower) << what << " fraction " << fraction;
  EXPECT_LE(effective, hs.upper) << what << " fraction " << fraction;
}

TEST(ConductivityBounds, RandomMediaFallInsideHashinShtrikman) {
  const std::size_t size = 64;
  for (double contrast : {0.1, 1e-3}) {
    for (std::uint64_t seed = 0; seed < 4; ++seed) {
      Random random(derive_seed(7, seed));
      const double fraction = random.uniform(0.35, 0.65);
      expect_within_bounds(particle_packing(size, fraction, random), size, contrast,
                           "particles seed " + std::to_string(seed));
      expect_within_bounds(gaussian_random_field(size, fraction, random), size, contrast,
                           "grf seed " + std::to_string(seed));
    }
  }
}

TEST(MicrostructureGenerators, HitTheirConductingShareAndAreDeterministic) {
  const std::size_t size = 48;
  for (double fraction : {0.3, 0.5, 0.7}) {
    Random a(11), b(11);
    const PhaseMap particles = particle_packing(size, fraction, a);
    EXPECT_EQ(particles, particle_packing(size, fraction, b));
    // Painting stops at the first disk that reaches the target: at most one disk too much.
    EXPECT_LE(conducting_share(particles), fraction + 1.0 / (size * size) + 1e-12);
    EXPECT_GT(conducting_share(particles), fraction - 0.1);
    const PhaseMap field = gaussian_random_field(size, fraction, a);
    EXPECT_NEAR(conducting_share(field), fraction, 1.0 / size);
    EXPECT_EQ(field, gaussian_random_field(size, fraction, b));
  }
  // A texture: a smooth ramp thresholded keeps its dark side conducting.
  Image ramp{1, 40, 60, std::vector<float>(40 * 60)};
  for (std::size_t y = 0; y < 40; ++y) {
    for (std::size_t x = 0; x < 60; ++x) ramp.at(0, y, x) = static_cast<float>(x + y) / 100.0f;
  }
  Random random(5);
  const PhaseMap texture = texture_crop(ramp, 32, 0.4, random);
  EXPECT_NEAR(conducting_share(texture), 0.4, 0.05);
}

TEST(Resampling, CubicKernelInterpolatesAndPreservesConstants) {
  EXPECT_DOUBLE_EQ(cubic_kernel(0), 1.0);
  EXPECT_DOUBLE_EQ(cubic_kernel(1), 0.0);
  EXPECT_DOUBLE_EQ(cubic_kernel(2), 0.0);
  for (double offset : {0.0, 0.25, 0.5, 0.9}) {
    double sum = 0;
    for (int i = -2; i <= 2; ++i) sum += cubic_kernel(i + offset);
    EXPECT_NEAR(sum, 1.0, 1e-12);
  }
  Image flat{3, 64, 64, std::vector<float>(3 * 64 * 64, 0.3f)};
  for (const Image& out : {resize_bicubic(flat, 16, 16), resize_bicubic(flat, 100, 80)}) {
    for (float v : out.pixels) EXPECT_NEAR(v, 0.3f, 1e-6f);
  }
  // Shrinking a ramp by 4 averages it: each output is the ramp at the block centre.
  Image ramp{1, 8, 64, std::vector<float>(8 * 64)};
  for (std::size_t y = 0; y < 8; ++y) {
    for (std::size_t x = 0; x < 64; ++x) ramp.at(0, y, x) = static_cast<float>(x) / 64.0f;
  }
  const Image small = resize_bicubic(ramp, 2, 16);
  for (std::size_t x = 2; x + 2 < 16; ++x) {
    EXPECT_NEAR(small.at(0, 1, x), (4.0 * x + 1.5) / 64.0, 1e-5) << x;
  }
}

}  // namespace
}  // namespace ipupod::datasets
