// Converts small microstructure sets and checks the layout, the labels against a direct solve
// and the bounds, the independence from thread count, and the errors.
#include <gtest/gtest.h>

#include <algorithm>

#include "datasets/conductivity.hpp"
#include "datasets/microstructure.hpp"
#include "host/dataset.hpp"
#include "tests/datasets/datasets_test_support.hpp"
#include "tests/host/temp_dir.hpp"

namespace ipupod::datasets {
namespace {

using host::DatasetError;
using host::DatasetFile;
using host::DType;
using ipupod::testing::TempDir;
using testing::read_extra;

// A real photograph stands in for a texture when scikit-image's gravel is not installed.
const std::string kPhoto = "/usr/share/wallpapers/Grey/contents/images/2560x1600.jpg";

MicrostructureOptions small_options(const TempDir& dir, const std::string& name) {
  MicrostructureOptions options;
  options.out = dir.file(name);
  options.size = 32;
  options.train = 9;
  options.test = 3;
  options.kinds = {"particles", "grf"};
  options.seed = 3;
  return options;
}

TEST(Microstructure, LabelsAreTheSolvedConductivities) {
  TempDir dir;
  const MicrostructureOptions options = small_options(dir, "micro.h5");
  const ConversionSummary summary = convert_microstructure(options);
  EXPECT_NE(summary.summary().find("Hashin-Shtrikman"), std::string::npos) << summary.summary();
  DatasetFile file(options.out);
  ASSERT_EQ(file.info("train").samples, 9u);
  EXPECT_EQ(file.info("train").inputs.sample_shape, (std::vector<std::size_t>{3, 32, 32}));
  EXPECT_EQ(file.info("train").targets.sample_shape, (std::vector<std::size_t>{1}));
  const auto inputs = testing::read_inputs(file, "train");
  const auto targets = testing::read_targets(file, "train");
  const auto fractions = read_extra(options.out, "train", "volume_fraction", DType::f32);
  const auto kinds = read_extra(options.out, "train", "kind", DType::u8);
  const std::size_t cells = 32 * 32;
  for (std::size_t i = 0; i < 9; ++i) {
    EXPECT_EQ(kinds.as<std::uint8_t>()[i], i % 2);
    const float* image = inputs.as<float>().data() + i * 3 * cells;
    ASSERT_TRUE(std::equal(image, image + cells, image + cells));  // channels are equal
    ASSERT_TRUE(std::equal(image, image + cells, image + 2 * cells));
    std::vector<double> k(cells);
    double conducting = 0;
    for (std::size_t c = 0; c < cells; ++c) {
      ASSERT_TRUE(image[c] == 0.0f || image[c] == 1.0f);
      k[c] = image[c] == 1.0f ? 1.0 : options.contrast;
      conducting += image[c];
    }
    const double fraction = conducting / cells;
    EXPECT_NEAR(fractions.as<float>()[i], fraction, 1e-6);
    EXPECT_GE(fraction, options.min_fraction - 0.1);
    EXPECT_LE(fraction, options.max_fraction + 0.01);
    const double expected = solve_effective_conductivity(k, 32, 32, {.tolerance = 1e-9}).effective;
    EXPECT_NEAR(targets.as<float>()[i], expected, 1e-4 * expected + 1e-6);
    const auto wiener = wiener_bounds(1.0, options.contrast, fraction);
    EXPECT_GE(targets.as<float>()[i], wiener.lower * (1 - 1e-5));
    EXPECT_LE(targets.as<float>()[i], wiener.upper * (1 + 1e-5));
  }
}

TEST(Microstructure, SameSeedSameDataForAnyThreadCount) {
  TempDir dir;
  MicrostructureOptions one = small_options(dir, "one.h5");
  one.threads = 1;
  MicrostructureOptions two = small_options(dir, "two.h5");
  two.threads = 2;
  MicrostructureOptions other = small_options(dir, "other.h5");
  other.seed = 4;
  convert_microstructure(one);
  convert_microstructure(two);
  convert_microstructure(other);
  DatasetFile a(one.out), b(two.out), c(other.out);
  for (const char* split : {"train", "test"}) {
    EXPECT_EQ(testing::read_inputs(a, split).bytes, testing::read_inputs(b, split).bytes);
    EXPECT_EQ(testing::read_targets(a, split).bytes, testing::read_targets(b, split).bytes);
    EXPECT_NE(testing::read_targets(a, split).bytes, testing::read_targets(c, split).bytes);
  }
  // More training samples leave the test samples as they were.
  MicrostructureOptions more = small_options(dir, "more.h5");
  more.train = 12;
  convert_microstructure(more);
  EXPECT_EQ(testing::read_targets(a, "test").bytes,
            testing::read_targets(DatasetFile(more.out), "test").bytes);
}

TEST(Microstructure, TextureCropsOfARealImage) {
  const std::string texture = default_texture().empty() ? kPhoto : default_texture();
  SKIP_WITHOUT({texture}, "python3-skimage or plasma-workspace-wallpapers");
  TempDir dir;
  MicrostructureOptions options = small_options(dir, "texture.h5");
  options.kinds = {"texture"};
  options.texture = texture;
  convert_microstructure(options);
  DatasetFile file(options.out);
  EXPECT_NE(file.attributes().at("source").find(texture), std::string::npos);
  const auto kinds = read_extra(options.out, "test", "kind", DType::u8);
  for (std::uint8_t kind : kinds.as<std::uint8_t>()) EXPECT_EQ(kind, 2);
}

TEST(Microstructure, RefusesToOverwriteAndRejectsBadOptions) {
  TempDir dir;
  MicrostructureOptions options = small_options(dir, "m.h5");
  options.train = 2;
  options.test = 1;
  convert_microstructure(options);
  auto expect_error = [&](const std::string& needle) {
    try {
      convert_microstructure(options);
      FAIL() << "expected DatasetError containing '" << needle << "'";
    } catch (const DatasetError& error) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
    }
  };
  expect_error("--force");
  options.overwrite = true;
  options.kinds = {"spheres"};
  expect_error("particles, grf or texture");
  options.kinds = {"texture"};
  options.texture = dir.file("absent.png");
  expect_error("--texture");
  options.kinds = {};
  options.texture = "";
  options.contrast = 2;
  expect_error("--contrast");
  options.contrast = 1e-3;
  options.min_fraction = 0.8;
  expect_error("--min-fraction");
  options.min_fraction = 0.3;
  options.size = 4;
  expect_error("--size");
}

}  // namespace
}  // namespace ipupod::datasets
