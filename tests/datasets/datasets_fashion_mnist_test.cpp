// Converts the real Fashion-MNIST files (Debian package dataset-fashion-mnist) with small limits
// and checks the result through DatasetFile; skipped when the package is not installed.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "datasets/fashion_mnist.hpp"
#include "host/dataset.hpp"
#include "tests/host/temp_dir.hpp"

namespace ipupod::datasets {
namespace {

using host::DatasetError;
using host::DatasetFile;
using host::DType;
using ipupod::testing::TempDir;

bool have_debian_files() {
  const std::filesystem::path dir = FashionMnistOptions{}.source_dir;
  for (const char* name : {kFashionMnistTrainImages, kFashionMnistTrainLabels,
                           kFashionMnistTestImages, kFashionMnistTestLabels}) {
    if (!std::filesystem::is_regular_file(dir / name)) return false;
  }
  return true;
}

#define SKIP_WITHOUT_FASHION_MNIST()                                                \
  if (!have_debian_files())                                                         \
  GTEST_SKIP() << "Fashion-MNIST not found in " << FashionMnistOptions{}.source_dir \
               << "; install the Debian package dataset-fashion-mnist to run this test"

void check_split(const DatasetFile& file, const std::string& split, std::size_t samples) {
  const host::SplitInfo info = file.info(split);
  ASSERT_EQ(info.samples, samples);
  EXPECT_EQ(info.inputs.dtype, DType::f32);
  EXPECT_EQ(info.inputs.sample_shape, (std::vector<std::size_t>{1, 28, 28}));
  EXPECT_EQ(info.targets.dtype, DType::i32);
  EXPECT_TRUE(info.targets.sample_shape.empty());
  std::vector<std::size_t> all(samples);
  std::iota(all.begin(), all.end(), std::size_t{0});
  const host::HostArray inputs = file.read_inputs(split, all);
  const auto pixels = inputs.as<float>();
  const auto [low, high] = std::minmax_element(pixels.begin(), pixels.end());
  EXPECT_GE(*low, 0.0f);
  EXPECT_LE(*high, 1.0f);
  EXPECT_GT(*high, 0.5f);  // real images, not zeros
  const host::HostArray targets = file.read_targets(split, all);
  std::vector<int> per_class(10, 0);
  for (std::int32_t label : targets.as<std::int32_t>()) {
    ASSERT_GE(label, 0);
    ASSERT_LE(label, 9);
    ++per_class[static_cast<std::size_t>(label)];
  }
  EXPECT_GT(std::count_if(per_class.begin(), per_class.end(), [](int n) { return n > 0; }), 5);
}

TEST(FashionMnist, ConvertsAndReopens) {
  SKIP_WITHOUT_FASHION_MNIST();
  TempDir dir;
  FashionMnistOptions options;
  options.out = dir.file("fashion.h5");
  options.limit_train = 500;
  options.limit_test = 100;
  const ConvertReport report = convert_fashion_mnist(options);
  EXPECT_EQ(report.train_samples, 500u);
  EXPECT_EQ(report.test_samples, 100u);
  EXPECT_EQ(report.bytes, std::filesystem::file_size(options.out));
  EXPECT_NE(report.summary().find("train: 500 samples"), std::string::npos) << report.summary();
  EXPECT_NE(report.summary().find("[100,1,28,28]"), std::string::npos) << report.summary();

  DatasetFile file(options.out);
  check_split(file, "train", 500);
  check_split(file, "test", 100);
  const auto attributes = file.attributes();
  EXPECT_EQ(attributes.at("license"), "MIT");
  EXPECT_EQ(attributes.at("normalisation"), "pixel/255");
  EXPECT_NE(attributes.at("source").find("dataset-fashion-mnist"), std::string::npos);
  EXPECT_TRUE(attributes.count("description"));
  EXPECT_TRUE(attributes.count("units"));
  const double mean = file.split_attributes("train").at("pixel_mean");
  EXPECT_GT(mean, 0.1);
  EXPECT_LT(mean, 0.5);
  // The class count the trainer checks every label against, in both splits.
  EXPECT_EQ(file.split_attributes("train").at("classes"), 10.0);
  EXPECT_EQ(file.split_attributes("test").at("classes"), 10.0);
}

TEST(FashionMnist, RefusesToOverwriteWithoutTheOption) {
  SKIP_WITHOUT_FASHION_MNIST();
  TempDir dir;
  FashionMnistOptions options;
  options.out = dir.file("fashion.h5");
  options.limit_train = 20;
  options.limit_test = 10;
  convert_fashion_mnist(options);
  try {
    convert_fashion_mnist(options);
    FAIL() << "expected DatasetError";
  } catch (const DatasetError& error) {
    EXPECT_NE(std::string(error.what()).find("--force"), std::string::npos) << error.what();
  }
  options.overwrite = true;
  options.limit_train = 30;
  EXPECT_EQ(convert_fashion_mnist(options).train_samples, 30u);
  EXPECT_EQ(DatasetFile(options.out).info("train").samples, 30u);
}

TEST(FashionMnist, MissingSourceNamesThePackage) {
  TempDir dir;
  FashionMnistOptions options;
  options.source_dir = dir.file("absent");
  options.out = dir.file("fashion.h5");
  try {
    convert_fashion_mnist(options);
    FAIL() << "expected DatasetError";
  } catch (const DatasetError& error) {
    EXPECT_NE(std::string(error.what()).find("dataset-fashion-mnist"), std::string::npos);
  }
  // A directory with the wrong files: the missing one is named.
  options.source_dir = dir.path().string();
  try {
    convert_fashion_mnist(options);
    FAIL() << "expected DatasetError";
  } catch (const DatasetError& error) {
    EXPECT_NE(std::string(error.what()).find(kFashionMnistTrainImages), std::string::npos)
        << error.what();
  }
  EXPECT_FALSE(std::filesystem::exists(options.out));
  EXPECT_FALSE(std::filesystem::exists(options.out + ".tmp"));
}

TEST(FashionMnist, SwappedFilesAreCaughtByTheMagicNumber) {
  SKIP_WITHOUT_FASHION_MNIST();
  TempDir dir;
  const std::filesystem::path source = FashionMnistOptions{}.source_dir;
  // Labels where images should be, and vice versa.
  std::filesystem::copy_file(source / kFashionMnistTrainLabels,
                             dir.path() / kFashionMnistTrainImages);
  std::filesystem::copy_file(source / kFashionMnistTrainImages,
                             dir.path() / kFashionMnistTrainLabels);
  FashionMnistOptions options;
  options.source_dir = dir.path().string();
  options.out = dir.file("out.h5");
  try {
    convert_fashion_mnist(options);
    FAIL() << "expected DatasetError";
  } catch (const DatasetError& error) {
    EXPECT_NE(std::string(error.what()).find("magic number 2049, expected 2051"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace ipupod::datasets
