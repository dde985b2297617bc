// Converts a few time steps of the real netCDF fields (Debian ferret-datasets, libncarg-data)
// into patches and checks them against the source values, the mask and the schema.
#include <gtest/gtest.h>

#include <cmath>

#include "datasets/climate.hpp"
#include "datasets/netcdf_field.hpp"
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

const std::string kCoads = "/usr/share/ferret-vis/data/coads_climatology.cdf";
const std::string kEtopo60 = "/usr/share/ferret-vis/data/etopo60.cdf";

std::vector<std::string> default_files() {
  std::vector<std::string> files;
  for (const std::string& field : default_climate_fields()) {
    files.push_back(field.substr(0, field.rfind(':')));
  }
  return files;
}

#define SKIP_WITHOUT_CLIMATE_DATA() \
  SKIP_WITHOUT(default_files(), "ferret-datasets and libncarg-data")

ClimateOptions small_options(const TempDir& dir, const std::string& name) {
  ClimateOptions options;
  options.out = dir.file(name);
  options.max_slices = 4;  // 4 months of coads and tas, 4 depths of levitus
  return options;
}

TEST(Climate, PatchesMatchTheSourceFieldStandardised) {
  SKIP_WITHOUT_CLIMATE_DATA();
  TempDir dir;
  const ClimateOptions options = small_options(dir, "climate.h5");
  const ConversionSummary summary = convert_climate(options);
  EXPECT_NE(summary.summary().find("inputs float32["), std::string::npos) << summary.summary();
  EXPECT_NE(summary.summary().find("mask uint8["), std::string::npos) << summary.summary();

  DatasetFile file(options.out);
  const auto attributes = file.attributes();
  EXPECT_EQ(attributes.at("fields"),
            "coads_climatology.SST, levitus_climatology.TEMP, tas_rectilinear_grid_2D.tas");
  for (const char* key : {"source", "license", "description", "units", "normalisation"}) {
    EXPECT_TRUE(attributes.count(key)) << key;
  }
  const auto stats = file.split_attributes("train");
  EXPECT_GT(stats.at("coads_climatology.SST.std"), 1.0);
  EXPECT_EQ(stats.at("coads_climatology.SST.mean"),
            file.split_attributes("test").at("coads_climatology.SST.mean"));

  for (const char* split : {"train", "test"}) {
    const host::SplitInfo info = file.info(split);
    ASSERT_GT(info.samples, 0u) << split;
    EXPECT_EQ(info.inputs.sample_shape, (std::vector<std::size_t>{1, 64, 64}));
    EXPECT_EQ(info.targets.sample_shape, (std::vector<std::size_t>{2, 64, 64}));
    const auto inputs = testing::read_inputs(file, split);
    const auto targets = testing::read_targets(file, split);
    const auto mask = read_extra(options.out, split, "mask", DType::u8);
    const auto origin = read_extra(options.out, split, "origin", DType::i32);
    ASSERT_EQ(mask.shape, (std::vector<std::size_t>{info.samples, 1, 64, 64}));
    ASSERT_EQ(origin.shape, (std::vector<std::size_t>{info.samples, 4}));
    const auto in = inputs.as<float>();
    const auto out = targets.as<float>();
    const auto m = mask.as<std::uint8_t>();
    std::size_t missing = 0;
    for (std::size_t p = 0; p < info.samples; ++p) {
      for (std::size_t c = 0; c < 64 * 64; ++c) {
        const std::size_t i = p * 64 * 64 + c;
        ASSERT_EQ(out[(2 * p) * 4096 + c], in[i]);
        ASSERT_EQ(out[(2 * p + 1) * 4096 + c], m[i] ? 1.0f : 0.0f);
        if (!m[i]) {
          ASSERT_EQ(in[i], 0.0f);
          ++missing;
        }
      }
    }
    EXPECT_GT(missing, 0u) << "land cells of SST/TEMP must be masked";
    EXPECT_GE(file.split_attributes(split).at("valid_fraction"), 0.5);
  }

  // Sample values are (value - mean) / std of the source: check the first coads patch of test.
  const NetcdfField sst = read_netcdf_field(kCoads, "SST");
  const host::HostArray origin_array = read_extra(options.out, "test", "origin", DType::i32);
  const auto origin = origin_array.as<std::int32_t>();
  const auto inputs = testing::read_inputs(file, "test");
  const double mean = stats.at("coads_climatology.SST.mean"),
               std = stats.at("coads_climatology.SST.std");
  ASSERT_EQ(origin[0], 0);  // field 0 is coads SST
  EXPECT_EQ(origin[1], 3);  // 4 months read, the last one is the test set
  const auto slice = static_cast<std::size_t>(origin[1]);
  const auto row = static_cast<std::size_t>(origin[2]), col = static_cast<std::size_t>(origin[3]);
  std::size_t checked = 0;
  for (std::size_t y = 0; y < 64; ++y) {
    for (std::size_t x = 0; x < 64; ++x) {
      const std::size_t source = (slice * sst.rows() + row + y) * sst.cols() + col + x;
      const float expected =
          sst.valid[source] ? static_cast<float>((sst.values[source] - mean) / std) : 0.0f;
      ASSERT_NEAR(inputs.as<float>()[y * 64 + x], expected, 1e-5f) << y << "," << x;
      checked += sst.valid[source];
    }
  }
  EXPECT_GT(checked, 2000u);
}

TEST(Climate, TrainingPartIsStandardised) {
  SKIP_WITHOUT_CLIMATE_DATA();
  TempDir dir;
  ClimateOptions options = small_options(dir, "sst.h5");
  options.fields = {kCoads + ":SST"};
  options.max_slices = 0;
  options.min_valid_fraction = 0;  // keep every patch: the mean over them is then near 0
  convert_climate(options);
  DatasetFile file(options.out);
  // 12 months: 9 train, 3 test; 90x180 cells give rows {0, 26} x columns {0, 56, 112, 116}.
  EXPECT_EQ(file.info("train").samples, 9u * 8u);
  EXPECT_EQ(file.info("test").samples, 3u * 8u);
  const auto inputs = testing::read_inputs(file, "train");
  const auto mask = read_extra(options.out, "train", "mask", DType::u8);
  double sum = 0;
  std::size_t count = 0;
  for (std::size_t i = 0; i < inputs.elements(); ++i) {
    if (!mask.as<std::uint8_t>()[i]) continue;
    sum += inputs.as<float>()[i];
    ++count;
  }
  // Overlapping patches weight some cells twice, so the mean is only near 0.
  EXPECT_NEAR(sum / static_cast<double>(count), 0.0, 0.25);
}

TEST(Climate, SingleSliceFieldIsSplitAlongItsColumns) {
  SKIP_WITHOUT({kEtopo60}, "ferret-datasets");
  TempDir dir;
  ClimateOptions options = small_options(dir, "etopo.h5");
  options.fields = {kEtopo60 + ":ROSE"};
  convert_climate(options);
  DatasetFile file(options.out);
  const auto boundary = 360 - 90;  // the eastern quarter of 360 columns is held out
  for (const char* split : {"train", "test"}) {
    const auto origin = read_extra(options.out, split, "origin", DType::i32);
    for (std::size_t p = 0; p < origin.shape[0]; ++p) {
      const int col = origin.as<std::int32_t>()[p * 4 + 3];
      if (std::string(split) == "train") {
        EXPECT_LE(col + 64, boundary);
      } else {
        EXPECT_GE(col, boundary);
      }
    }
  }
}

TEST(Climate, IsDeterministicAndRefusesToOverwrite) {
  SKIP_WITHOUT_CLIMATE_DATA();
  TempDir dir;
  ClimateOptions options = small_options(dir, "a.h5");
  options.max_slices = 2;
  convert_climate(options);
  try {
    convert_climate(options);
    FAIL() << "expected DatasetError";
  } catch (const DatasetError& error) {
    EXPECT_NE(std::string(error.what()).find("--force"), std::string::npos) << error.what();
  }
  ClimateOptions again = options;
  again.out = dir.file("b.h5");
  convert_climate(again);
  DatasetFile a(options.out), b(again.out);
  EXPECT_EQ(testing::read_inputs(a, "train").bytes, testing::read_inputs(b, "train").bytes);
  EXPECT_EQ(testing::read_targets(a, "test").bytes, testing::read_targets(b, "test").bytes);
  options.overwrite = true;
  options.max_slices = 3;
  convert_climate(options);
  EXPECT_GT(DatasetFile(options.out).info("train").samples, a.info("train").samples);
}

TEST(Climate, BadFieldsSayWhatToChange) {
  TempDir dir;
  ClimateOptions options = small_options(dir, "bad.h5");
  auto expect_error = [&](const std::string& needle) {
    try {
      convert_climate(options);
      FAIL() << "expected DatasetError containing '" << needle << "'";
    } catch (const DatasetError& error) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
    }
    EXPECT_FALSE(std::filesystem::exists(options.out));
  };
  options.fields = {dir.file("absent.nc") + ":SST"};
  expect_error("ferret-datasets");
  options.fields = {"no-variable-given"};
  expect_error("FILE:VARIABLE");
  options.fields = {kCoads};  // a path without a variable
  expect_error("FILE:VARIABLE");
  options.test_fraction = 1.5;
  expect_error("--test-fraction");
  options.test_fraction = 0.25;
  if (!std::filesystem::exists(kCoads)) GTEST_SKIP() << "ferret-datasets is not installed";
  options.fields = {kCoads + ":NOPE"};
  expect_error("SST");  // the message lists the variables there are
  options.fields = {kCoads + ":SST"};
  options.patch = 128;  // more than the 90 rows of coads
  expect_error("smaller than a 128x128 patch");
  options.patch = 64;
  options.min_valid_fraction = 1.0;  // every coads patch touches land
  expect_error("--min-valid");
}

}  // namespace
}  // namespace ipupod::datasets
