// Tests of HostArray, the HDF5 layer and the dataset schema: round trips and one test per
// validation error, each asserting that the message names the problem.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "host/dataset.hpp"
#include "host/hdf5.hpp"
#include "tests/host/temp_dir.hpp"

namespace ipupod::host {
namespace {

using ipupod::testing::TempDir;

HostArray iota_f32(std::vector<std::size_t> shape) {
  HostArray array = HostArray::zeros(DType::f32, std::move(shape));
  auto values = array.as<float>();
  std::iota(values.begin(), values.end(), 0.0f);
  return array;
}

HostArray iota_i32(std::size_t count) {
  HostArray array = HostArray::zeros(DType::i32, {count});
  auto values = array.as<std::int32_t>();
  std::iota(values.begin(), values.end(), 0);
  return array;
}

void write_valid(const std::string& path, std::size_t train = 10, std::size_t test = 4) {
  DatasetWriter writer(path, {.chunk_samples = 3});
  writer.write_split("train", iota_f32({train, 2, 3}), iota_i32(train));
  writer.write_split("test", iota_f32({test, 2, 3}), iota_i32(test));
  writer.set_attribute("source", "unit test");
  writer.set_attribute("license", "MIT");
  writer.set_attribute("description", "tiny");
  writer.set_attribute("train", "mean", 0.5);
  writer.finish();
}

// Writes a raw HDF5 file with /train and /test, letting a test break one thing.
struct RawSplit {
  std::vector<std::size_t> inputs{4, 2};
  std::vector<std::size_t> targets{4};
  bool has_inputs = true;
};
void write_raw(const std::string& path, const RawSplit& train, const RawSplit& test,
               bool has_test = true) {
  h5::File file = h5::File::create(path);
  auto add = [&](const char* name, const RawSplit& split) {
    h5::Group group = file.create_group(name);
    auto chunk_of = [](std::vector<std::size_t> dims) {
      for (std::size_t& extent : dims) extent = std::max<std::size_t>(extent, 1);
      return dims;
    };
    if (split.has_inputs) {
      group.create_dataset("inputs", DType::f32, split.inputs, chunk_of(split.inputs));
    }
    group.create_dataset("targets", DType::i32, split.targets, chunk_of(split.targets));
  };
  add("train", train);
  if (has_test) add("test", test);
}

std::string error_of(const std::string& path) {
  try {
    DatasetFile file(path);
  } catch (const DatasetError& error) {
    return error.what();
  }
  return "no DatasetError";
}

TEST(HostArray, ZerosShapeAndTypedViews) {
  HostArray array = HostArray::zeros(DType::f32, {2, 3});
  EXPECT_EQ(array.elements(), 6u);
  EXPECT_EQ(array.bytes.size(), 24u);
  EXPECT_EQ(array.as<float>().size(), 6u);
  EXPECT_THROW(array.as<std::int32_t>(), std::logic_error);
  EXPECT_EQ(HostArray::zeros(DType::u8, {}).elements(), 1u);
  EXPECT_EQ(dtype_name(DType::i32), "int32");
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(array.describe(), "float32[2,3]");
}

TEST(Dataset, RoundTripShapesValuesAttributes) {
  TempDir dir;
  const std::string path = dir.file("tiny.h5");
  write_valid(path);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  DatasetFile file(path);
  const SplitInfo train = file.info("train");
  EXPECT_EQ(train.samples, 10u);
  EXPECT_EQ(train.inputs.dtype, DType::f32);
  EXPECT_EQ(train.inputs.sample_shape, (std::vector<std::size_t>{2, 3}));
  EXPECT_EQ(train.targets.dtype, DType::i32);
  EXPECT_TRUE(train.targets.sample_shape.empty());
  EXPECT_EQ(file.info("test").samples, 4u);

  // Any order, repeats, runs that cross chunk boundaries.
  const std::vector<std::size_t> indices{7, 2, 3, 4, 9, 2, 0};
  HostArray inputs = file.read_inputs("train", indices);
  HostArray targets = file.read_targets("train", indices);
  ASSERT_EQ(inputs.shape, (std::vector<std::size_t>{7, 2, 3}));
  ASSERT_EQ(targets.shape, (std::vector<std::size_t>{7}));
  for (std::size_t k = 0; k < indices.size(); ++k) {
    EXPECT_EQ(targets.as<std::int32_t>()[k], static_cast<std::int32_t>(indices[k]));
    for (std::size_t j = 0; j < 6; ++j) {
      EXPECT_EQ(inputs.as<float>()[k * 6 + j], static_cast<float>(indices[k] * 6 + j));
    }
  }
  const std::vector<std::size_t> ascending{3, 4, 5};
  EXPECT_EQ(file.read_targets("train", ascending).as<std::int32_t>()[2], 5);
  EXPECT_THROW(file.read_targets("train", std::vector<std::size_t>{10}), std::out_of_range);
  EXPECT_THROW(file.info("validation"), DatasetError);

  const auto attributes = file.attributes();
  EXPECT_EQ(attributes.at("source"), "unit test");
  EXPECT_EQ(attributes.at("license"), "MIT");
  EXPECT_DOUBLE_EQ(file.split_attributes("train").at("mean"), 0.5);
}

TEST(Dataset, OtherDtypesRoundTrip) {
  TempDir dir;
  const std::string path = dir.file("types.h5");
  {
    DatasetWriter writer(path);
    HostArray half = HostArray::zeros(DType::f16, {3, 2});
    auto h = half.as<Half>();
    for (std::size_t i = 0; i < h.size(); ++i) h[i].bits = static_cast<std::uint16_t>(0x3C00 + i);
    HostArray bytes =
        HostArray::from_values<std::uint8_t>({3}, std::vector<std::uint8_t>{1, 2, 255});
    writer.write_split("train", half, bytes);
    writer.write_split("test", HostArray::zeros(DType::f16, {2, 2}),
                       HostArray::from_values<std::uint8_t>({2}, std::vector<std::uint8_t>{0, 1}));
    writer.finish();
  }
  DatasetFile file(path);
  EXPECT_EQ(file.info("train").inputs.dtype, DType::f16);
  EXPECT_EQ(file.info("train").targets.dtype, DType::u8);
  const std::vector<std::size_t> all{0, 1, 2};
  HostArray half = file.read_inputs("train", all);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(half.as<Half>()[i].bits, 0x3C00 + i);
  EXPECT_EQ(file.read_targets("train", all).as<std::uint8_t>()[2], 255);

  const std::string words_path = dir.file("words.h5");
  {
    DatasetWriter writer(words_path);
    HostArray words =
        HostArray::from_values<std::uint32_t>({2, 1}, std::vector<std::uint32_t>{7, 4000000000u});
    HostArray labels = HostArray::from_values<std::int32_t>({2}, std::vector<std::int32_t>{0, 1});
    writer.write_split("train", words, labels);
    writer.write_split("test", words, labels);
    writer.finish();
  }
  EXPECT_EQ(DatasetFile(words_path)
                .read_inputs("test", std::vector<std::size_t>{1})
                .as<std::uint32_t>()[0],
            4000000000u);
}

TEST(Dataset, WriterRefusesToOverwriteWithoutForce) {
  TempDir dir;
  const std::string path = dir.file("exists.h5");
  write_valid(path);
  try {
    DatasetWriter writer(path);
    FAIL() << "expected DatasetError";
  } catch (const DatasetError& error) {
    EXPECT_NE(std::string(error.what()).find("already exists"), std::string::npos);
    EXPECT_NE(std::string(error.what()).find("--force"), std::string::npos);
  }
}

TEST(Dataset, WriterOverwritesWithOptionAndCleansUpUnfinished) {
  TempDir dir;
  const std::string path = dir.file("over.h5");
  write_valid(path, 10, 4);
  {
    DatasetWriter writer(path, {.overwrite = true});
    writer.write_split("train", iota_f32({5, 1}), iota_i32(5));
    writer.write_split("test", iota_f32({2, 1}), iota_i32(2));
    writer.finish();
  }
  EXPECT_EQ(DatasetFile(path).info("train").samples, 5u);
  {
    DatasetWriter writer(dir.file("abandoned.h5"));
    writer.write_split("train", iota_f32({5, 1}), iota_i32(5));
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("abandoned.h5.tmp")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("abandoned.h5")));
  DatasetWriter writer(dir.file("half.h5"));
  writer.write_split("train", iota_f32({5, 1}), iota_i32(5));
  EXPECT_THROW(writer.finish(), DatasetError);
  EXPECT_THROW(writer.write_split("test", iota_f32({5, 1}), iota_i32(4)), DatasetError);
}

TEST(DatasetErrors, MissingFile) {
  TempDir dir;
  const std::string message = error_of(dir.file("nope.h5"));
  EXPECT_NE(message.find("does not exist"), std::string::npos) << message;
  EXPECT_NE(message.find("nope.h5"), std::string::npos) << message;
}

TEST(DatasetErrors, NotAnHdf5File) {
  TempDir dir;
  const std::string path = dir.file("text.h5");
  std::ofstream(path) << "this is not HDF5\n";
  const std::string message = error_of(path);
  EXPECT_NE(message.find("not an HDF5 file"), std::string::npos) << message;
}

TEST(DatasetErrors, MissingGroup) {
  TempDir dir;
  const std::string path = dir.file("no_test.h5");
  write_raw(path, {}, {}, /*has_test=*/false);
  const std::string message = error_of(path);
  EXPECT_NE(message.find("no group '/test'"), std::string::npos) << message;
}

TEST(DatasetErrors, MissingDataset) {
  TempDir dir;
  const std::string path = dir.file("no_inputs.h5");
  RawSplit broken;
  broken.has_inputs = false;
  write_raw(path, {}, broken);
  const std::string message = error_of(path);
  EXPECT_NE(message.find("no dataset '/test/inputs'"), std::string::npos) << message;
}

TEST(DatasetErrors, MismatchedSampleCounts) {
  TempDir dir;
  const std::string path = dir.file("mismatch.h5");
  RawSplit broken;
  broken.targets = {3};
  write_raw(path, broken, {});
  const std::string message = error_of(path);
  EXPECT_NE(message.find("4 input samples but 3 target samples"), std::string::npos) << message;
}

TEST(DatasetErrors, EmptySplit) {
  TempDir dir;
  const std::string path = dir.file("empty.h5");
  RawSplit empty;
  empty.inputs = {0, 2};
  empty.targets = {0};
  write_raw(path, {}, empty);
  const std::string message = error_of(path);
  EXPECT_NE(message.find("'/test'"), std::string::npos) << message;
  EXPECT_NE(message.find("is empty"), std::string::npos) << message;
}

TEST(DatasetErrors, UnsupportedDtype) {
  TempDir dir;
  const std::string path = dir.file("f64.h5");
  {
    h5::File file = h5::File::create(path);
    for (const char* name : {"train", "test"}) {
      h5::Group group = file.create_group(name);
      const std::vector<std::size_t> dims{2};
      group.create_dataset("targets", DType::i32, dims, dims);
      // A float64 dataset through the C API: our layer only creates supported types.
      h5::Dataspace space = h5::Dataspace::simple(dims);
      const hid_t id = H5Dcreate2(group.id(), "inputs", H5T_IEEE_F64LE, space.id(), H5P_DEFAULT,
                                  H5P_DEFAULT, H5P_DEFAULT);
      ASSERT_GE(id, 0);
      H5Dclose(id);
    }
  }
  const std::string message = error_of(path);
  EXPECT_NE(message.find("64-bit float"), std::string::npos) << message;
  EXPECT_NE(message.find("supported"), std::string::npos) << message;
}

TEST(DatasetErrors, RankBeyondWhatTheStreamsCarry) {
  TempDir dir;
  const std::string path = dir.file("deep.h5");
  RawSplit deep;
  deep.inputs = {4, 1, 1, 1, 1, 1, 1, 1, 2};  // rank 9
  write_raw(path, deep, {});
  const std::string message = error_of(path);
  EXPECT_NE(message.find("'/train/inputs'"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 9"), std::string::npos) << message;
}

TEST(DatasetErrors, SplitsWithDifferentSampleShapes) {
  TempDir dir;
  const std::string path = dir.file("shapes.h5");
  RawSplit wide;
  wide.inputs = {4, 3};
  write_raw(path, {}, wide);
  const std::string message = error_of(path);
  EXPECT_NE(message.find("'/test/inputs'"), std::string::npos) << message;
  EXPECT_NE(message.find("float32[3] but '/train/inputs' holds float32[2]"), std::string::npos)
      << message;
}

// The same 100 + 5 samples in chunks of 7, stored plain (read from the mapping) and deflated
// (read through HDF5); returns both paths.
std::pair<std::string, std::string> write_plain_and_packed(const TempDir& dir) {
  const std::string plain = dir.file("plain.h5");
  const std::string packed = dir.file("packed.h5");
  for (const auto& [path, level] : {std::pair{plain, 0}, std::pair{packed, 4}}) {
    DatasetWriter writer(path, {.chunk_samples = 7, .deflate_level = level});
    writer.write_split("train", iota_f32({100, 2, 3}), iota_i32(100));
    writer.write_split("test", iota_f32({5, 2, 3}), iota_i32(5));
    writer.finish();
  }
  return {plain, packed};
}

TEST(Dataset, DirectReadsMatchReadsThroughHdf5) {
  TempDir dir;
  const auto [plain, packed] = write_plain_and_packed(dir);
  // A contiguous (unchunked) dataset qualifies too.
  const std::string contiguous = dir.file("contiguous.h5");
  {
    h5::File file = h5::File::create(contiguous);
    for (const auto& [name, count] : {std::pair{"train", std::size_t{100}}, {"test", 5}}) {
      h5::Group group = file.create_group(name);
      const std::vector<std::size_t> dims{count, 2, 3};
      group.create_dataset("inputs", DType::f32, dims, {}).write(iota_f32(dims));
      const std::vector<std::size_t> target_dims{count};
      group.create_dataset("targets", DType::i32, target_dims, {}).write(iota_i32(count));
    }
  }
  DatasetFile direct(plain), compressed(packed), whole(contiguous);
  EXPECT_TRUE(direct.reads_directly("train", Field::inputs));
  EXPECT_TRUE(whole.reads_directly("train", Field::inputs));
  EXPECT_FALSE(compressed.reads_directly("train", Field::inputs));
  // Repeats, gaps below and above the coalescing limit, chunk borders, both ends.
  const std::vector<std::size_t> indices{99, 0, 6, 7, 7, 13, 14, 50, 3, 98, 21, 0, 64, 65, 66};
  const HostArray expected = compressed.read_inputs("train", indices);
  for (std::size_t k = 0; k < indices.size(); ++k) {
    EXPECT_EQ(expected.as<float>()[k * 6 + 1], static_cast<float>(indices[k] * 6 + 1));
  }
  EXPECT_EQ(direct.read_inputs("train", indices).bytes, expected.bytes);
  EXPECT_EQ(whole.read_inputs("train", indices).bytes, expected.bytes);
  EXPECT_EQ(direct.read_targets("train", indices).bytes,
            compressed.read_targets("train", indices).bytes);
}

TEST(Dataset, PreloadKeepsToItsLimitAndReadsTheSame) {
  TempDir dir;
  const auto [plain, packed] = write_plain_and_packed(dir);
  DatasetFile direct(plain);
  const std::vector<std::size_t> indices{99, 0, 6, 7, 13, 14, 50, 3, 64};
  const HostArray inputs = direct.read_inputs("train", indices);
  const HostArray targets = direct.read_targets("train", indices);
  // 100 rows of 24 + 4 bytes take more than one byte, whatever the page size.
  EXPECT_FALSE(direct.preload("train", 1));
  EXPECT_FALSE(direct.preloaded("train"));
  EXPECT_TRUE(direct.preload("train", SIZE_MAX));
  EXPECT_TRUE(direct.preloaded("train"));
  EXPECT_FALSE(direct.preloaded("test"));
  EXPECT_EQ(direct.read_inputs("train", indices).bytes, inputs.bytes);
  EXPECT_EQ(direct.read_targets("train", indices).bytes, targets.bytes);
  EXPECT_EQ(inputs.as<float>()[1], 99.0f * 6 + 1);
  // Compressed arrays are read through HDF5, not the mapping: nothing to preload.
  DatasetFile compressed(packed);
  EXPECT_FALSE(compressed.preload("train", SIZE_MAX));
  EXPECT_FALSE(compressed.preloaded("train"));
  EXPECT_THROW(direct.preload("validation", SIZE_MAX), DatasetError);
}

TEST(Dataset, MappedSamplesAreTheRowsReadCopies) {
  TempDir dir;
  const auto [plain, packed] = write_plain_and_packed(dir);
  const DatasetFile direct(plain), compressed(packed);
  const std::vector<std::size_t> indices{99, 0, 6, 7, 7, 13, 64};
  for (const Field field : {Field::inputs, Field::targets}) {
    std::vector<std::span<const std::byte>> samples;
    ASSERT_TRUE(direct.mapped_samples("train", field, indices, samples));
    ASSERT_EQ(samples.size(), indices.size());
    const HostArray copied = field == Field::inputs ? direct.read_inputs("train", indices)
                                                    : direct.read_targets("train", indices);
    const std::size_t row = copied.bytes.size() / indices.size();
    for (std::size_t k = 0; k < indices.size(); ++k) {
      ASSERT_EQ(samples[k].size(), row);
      EXPECT_TRUE(std::equal(samples[k].begin(), samples[k].end(), copied.bytes.begin() + k * row))
          << field_name(field) << " sample " << indices[k];
    }
    // Compressed arrays have no mapped rows; `samples` is left as it was.
    EXPECT_FALSE(compressed.mapped_samples("train", field, indices, samples));
    EXPECT_EQ(samples.size(), indices.size());
  }
  std::vector<std::span<const std::byte>> samples;
  const std::vector<std::size_t> beyond{5};
  EXPECT_THROW(direct.mapped_samples("test", Field::inputs, beyond, samples), std::out_of_range);
  EXPECT_THROW(direct.mapped_samples("validation", Field::inputs, indices, samples), DatasetError);
  // A file shrunk under the mapping is an error, not a later SIGBUS.
  EXPECT_NO_THROW(direct.check_not_truncated("train"));
  std::filesystem::resize_file(plain, 2048);
  EXPECT_THROW(direct.mapped_samples("train", Field::inputs, indices, samples), DatasetError);
  EXPECT_THROW(direct.check_not_truncated("train"), DatasetError);
  EXPECT_NO_THROW(compressed.check_not_truncated("train"));  // nothing read from a mapping
}

TEST(DatasetErrors, FileTruncatedWhileOpenIsReportedNotACrash) {
  // Direct reads copy rows out of a mapping of the file; reading a page that the file no longer
  // has would kill the process (SIGBUS), so a shrunken file must be an error instead.
  TempDir dir;
  const std::string path = dir.file("plain.h5");
  DatasetWriter writer(path, {.chunk_samples = 7, .deflate_level = 0});
  writer.write_split("train", iota_f32({100, 2, 3}), iota_i32(100));
  writer.write_split("test", iota_f32({5, 2, 3}), iota_i32(5));
  writer.finish();
  const DatasetFile file(path);
  ASSERT_TRUE(file.reads_directly("train", Field::inputs));
  const std::vector<std::size_t> last{99};
  EXPECT_EQ(file.read_inputs("train", last).as<float>()[0], 99.0f * 6);
  std::filesystem::resize_file(path, 2048);
  try {
    file.read_inputs("train", last);
    FAIL() << "expected DatasetError";
  } catch (const DatasetError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'/train/inputs' of '" + path + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("the file is now 2048 bytes"), std::string::npos) << message;
    EXPECT_NE(message.find("truncated or rewritten"), std::string::npos) << message;
  }
}

TEST(Hdf5, ErrorsNameFileAndObject) {
  TempDir dir;
  const std::string path = dir.file("plain.h5");
  h5::File file = h5::File::create(path);
  try {
    file.open_dataset("missing");
    FAIL() << "expected Hdf5Error";
  } catch (const Hdf5Error& error) {
    EXPECT_EQ(error.file(), path);
    EXPECT_EQ(error.object(), "/missing");
    EXPECT_NE(std::string(error.what()).find("plain.h5"), std::string::npos);
  }
}

}  // namespace
}  // namespace ipupod::host
