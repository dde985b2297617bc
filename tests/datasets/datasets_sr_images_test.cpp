// Converts crops of real photographs (Debian plasma-workspace-wallpapers) into super-resolution
// pairs and checks them against the decoded photograph and the bicubic resampler.
#include <gtest/gtest.h>

#include <algorithm>

#include "datasets/image_io.hpp"
#include "datasets/sr_images.hpp"
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

// Three photographs, in name order (origin indices count in that order). Every size in these
// packages links to one 2560x1600 file: decoding it is the slow part, so tests take few.
const std::vector<std::string> kPhotos = {
    "/usr/share/wallpapers/FallenLeaf/contents/images/2560x1600.jpg",
    "/usr/share/wallpapers/Kite/contents/images/2560x1600.jpg",
    "/usr/share/wallpapers/Path/contents/images/2560x1600.jpg"};
const std::vector<std::string> kTwoPhotos = {kPhotos[0], kPhotos[1]};

#define SKIP_WITHOUT_PHOTOS() SKIP_WITHOUT(kPhotos, "plasma-workspace-wallpapers")

SrImagesOptions small_options(const TempDir& dir, const std::string& name) {
  SrImagesOptions options;
  options.images = kPhotos;
  options.out = dir.file(name);
  options.crops_per_image = 6;
  options.seed = 42;
  return options;
}

TEST(SrImages, PairsAreCropsOfThePhotographAndTheirBicubicReductions) {
  SKIP_WITHOUT_PHOTOS();
  TempDir dir;
  const SrImagesOptions options = small_options(dir, "sr.h5");
  const ConversionSummary summary = convert_sr_images(options);
  EXPECT_NE(summary.summary().find("lr_small float32["), std::string::npos) << summary.summary();

  DatasetFile file(options.out);
  EXPECT_EQ(file.info("train").samples, 2u * 6u);  // 3 photographs: 2 train, 1 test
  EXPECT_EQ(file.info("test").samples, 1u * 6u);
  EXPECT_EQ(file.info("train").inputs.sample_shape, (std::vector<std::size_t>{3, 64, 64}));
  EXPECT_EQ(file.info("train").targets.sample_shape, (std::vector<std::size_t>{3, 64, 64}));
  EXPECT_NE(file.attributes().at("license").find("GPL-2+"), std::string::npos);

  std::vector<std::int32_t> images_seen;
  for (const char* split : {"train", "test"}) {
    const auto inputs = testing::read_inputs(file, split);
    const auto targets = testing::read_targets(file, split);
    const auto small = read_extra(options.out, split, "lr_small", DType::f32);
    const auto origin = read_extra(options.out, split, "origin", DType::i32);
    ASSERT_EQ(small.shape, (std::vector<std::size_t>{file.info(split).samples, 3, 16, 16}));
    for (float v : inputs.as<float>()) ASSERT_TRUE(v >= 0 && v <= 1);
    const auto o = origin.as<std::int32_t>();
    images_seen.push_back(o[0]);
    // The first sample: its target is the crop of the photograph named by origin.
    const Image photo = load_image(kPhotos.at(static_cast<std::size_t>(o[0])), 3);
    const Image high =
        crop(photo, static_cast<std::size_t>(o[1]), static_cast<std::size_t>(o[2]), 64, 64);
    const Image low = resize_bicubic(high, 16, 16);
    const Image up = resize_bicubic(low, 64, 64);
    for (std::size_t i = 0; i < high.pixels.size(); ++i) {
      ASSERT_EQ(targets.as<float>()[i], high.pixels[i]);
      ASSERT_EQ(inputs.as<float>()[i], up.pixels[i]);
    }
    for (std::size_t i = 0; i < low.pixels.size(); ++i)
      ASSERT_EQ(small.as<float>()[i], low.pixels[i]);
    // Low resolution loses detail but keeps the colours: mean absolute error is small, not zero.
    double error = 0;
    for (std::size_t i = 0; i < inputs.elements(); ++i) {
      error += std::abs(inputs.as<float>()[i] - targets.as<float>()[i]);
    }
    error /= static_cast<double>(inputs.elements());
    EXPECT_GT(error, 1e-4) << split;
    EXPECT_LT(error, 0.15) << split;
  }
  EXPECT_NE(images_seen[0], images_seen[1]) << "a photograph must not be in both splits";
}

// --lr-native is covered in datasets_cli_test and a --force rewrite by the other converters'
// tests (the same DatasetOutput): decoding photographs is what these tests spend time on.
TEST(SrImages, SeedDecidesCropsAndRefusesToOverwrite) {
  SKIP_WITHOUT_PHOTOS();
  TempDir dir;
  SrImagesOptions options = small_options(dir, "a.h5");
  options.images = kTwoPhotos;
  convert_sr_images(options);
  EXPECT_THROW(convert_sr_images(options), DatasetError);
  SrImagesOptions same = options;
  same.out = dir.file("b.h5");
  convert_sr_images(same);
  SrImagesOptions other = options;
  other.out = dir.file("c.h5");
  other.seed = 43;
  convert_sr_images(other);
  DatasetFile a(options.out), b(same.out), c(other.out);
  EXPECT_EQ(testing::read_targets(a, "train").bytes, testing::read_targets(b, "train").bytes);
  EXPECT_EQ(testing::read_inputs(a, "test").bytes, testing::read_inputs(b, "test").bytes);
  EXPECT_NE(read_extra(options.out, "train", "origin", DType::i32).bytes,
            read_extra(other.out, "train", "origin", DType::i32).bytes);
}

TEST(SrImages, DefaultPhotographsResolveToTheLargestImages) {
  const std::vector<std::string> dirs = default_sr_images();
  ASSERT_EQ(dirs.size(), 11u);
  SKIP_WITHOUT(dirs, "plasma-workspace-wallpapers");
  TempDir dir;
  SrImagesOptions options;
  options.out = dir.file("default.h5");
  options.max_images = 2;  // decoding all 11 full-size photographs is the slow part
  options.crops_per_image = 2;
  const ConversionSummary summary = convert_sr_images(options);
  EXPECT_NE(DatasetFile(options.out).attributes().at("images").find("2560x1600.jpg"),
            std::string::npos);
  EXPECT_EQ(summary.samples.at("train") + summary.samples.at("test"), 4u);
}

TEST(SrImages, BadInputSaysWhatToChange) {
  TempDir dir;
  SrImagesOptions options = small_options(dir, "bad.h5");
  auto expect_error = [&](const std::string& needle) {
    try {
      convert_sr_images(options);
      FAIL() << "expected DatasetError containing '" << needle << "'";
    } catch (const DatasetError& error) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
    }
  };
  options.images = {dir.file("absent.jpg")};
  expect_error("plasma-workspace-wallpapers");
  options.images = kPhotos;
  options.crop = 30;  // not a multiple of 4
  expect_error("multiple of");
  options.crop = 64;
  if (!testing::all_exist(kPhotos)) GTEST_SKIP() << "plasma-workspace-wallpapers absent";
  options.images = {kPhotos[0]};
  expect_error("at least 2 photographs");
  const std::string not_an_image = dir.file("fake.jpg");
  std::FILE* fake = std::fopen(not_an_image.c_str(), "w");
  std::fputs("not a jpeg", fake);
  std::fclose(fake);
  options.images = {kPhotos[0], not_an_image};
  expect_error("cannot decode image");
  EXPECT_FALSE(std::filesystem::exists(options.out));
}

}  // namespace
}  // namespace ipupod::datasets
