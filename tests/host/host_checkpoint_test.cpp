// Tests of checkpoints: round trip of every part, atomic replacement (a writer that dies or fails
// mid-way leaves the previous checkpoint loadable), load errors and model-mismatch messages.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "host/checkpoint.hpp"
#include "host/hdf5.hpp"
#include "tests/host/temp_dir.hpp"

namespace ipupod::host {
namespace {

using ipupod::testing::TempDir;

Checkpoint sample_checkpoint(std::uint64_t step, float scale) {
  Checkpoint checkpoint;
  checkpoint.step = step;
  checkpoint.config_json = R"({"model":"mlp","hidden":[64],"learning_rate":0.05})";
  checkpoint.state_json = R"({"epoch":1,"step":7})";
  checkpoint.tensors["dense0.weight"] =
      HostArray::from_values<float>({2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
  for (float& value : checkpoint.tensors["dense0.weight"].as<float>()) value *= scale;
  checkpoint.tensors["dense0.bias"] = HostArray::zeros(DType::f32, {3});
  checkpoint.tensors["sgd.momentum.dense0.weight"] = HostArray::zeros(DType::f32, {2, 3});
  // Optimizer slots are named "<parameter>/<slot>"; '%' is the escape character in the file.
  checkpoint.tensors["dense0.weight/momentum"] =
      HostArray::from_values<float>({2}, std::vector<float>{0.5f * scale, -1});
  checkpoint.tensors["odd%2Fname/%"] = HostArray::zeros(DType::f32, {1});
  checkpoint.tensors["loss_scale"] =
      HostArray::from_values<float>({}, std::vector<float>{128.0f * scale});
  checkpoint.tensors["counts"] =
      HostArray::from_values<std::int32_t>({2}, std::vector<std::int32_t>{-7, 9});
  checkpoint.tensors["empty"] = HostArray::zeros(DType::u8, {0, 4});
  checkpoint.rng_states["shuffle"] = std::string("state with \0 bytes", 18);
  checkpoint.rng_states["dropout.replica0"] = "12345 67890";
  return checkpoint;
}

void expect_same(const Checkpoint& a, const Checkpoint& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.config_json, b.config_json);
  EXPECT_EQ(a.state_json, b.state_json);
  EXPECT_EQ(a.rng_states, b.rng_states);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, array] : a.tensors) {
    ASSERT_EQ(b.tensors.count(name), 1u) << name;
    const HostArray& other = b.tensors.at(name);
    EXPECT_EQ(array.dtype, other.dtype) << name;
    EXPECT_EQ(array.shape, other.shape) << name;
    EXPECT_EQ(array.bytes, other.bytes) << name;
  }
}

std::string load_error(const std::string& path) {
  try {
    load_checkpoint(path);
  } catch (const CheckpointError& error) {
    return error.what();
  }
  return "no CheckpointError";
}

TEST(Checkpoint, RoundTripsEveryPart) {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  Checkpoint saved = sample_checkpoint((std::uint64_t{1} << 40) + 3, 1.0f);
  std::vector<std::pair<std::size_t, std::size_t>> progress;
  save_checkpoint(path, saved, [&](std::size_t written, std::size_t total) {
    progress.emplace_back(written, total);
  });
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  ASSERT_EQ(progress.size(), saved.tensors.size());
  EXPECT_EQ(progress.back(), std::make_pair(saved.tensors.size(), saved.tensors.size()));
  expect_same(saved, load_checkpoint(path));

  // A new save replaces the old one.
  const Checkpoint later = sample_checkpoint(99, 2.0f);
  save_checkpoint(path, later);
  expect_same(later, load_checkpoint(path));
}

TEST(Checkpoint, WriterThatDiesMidWayLeavesThePreviousCheckpoint) {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  const Checkpoint first = sample_checkpoint(10, 1.0f);
  save_checkpoint(path, first);

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child dies abruptly after writing part of the new checkpoint, like a killed job.
    try {
      save_checkpoint(path, sample_checkpoint(20, 3.0f), [](std::size_t written, std::size_t) {
        if (written == 2) _exit(42);
      });
    } catch (...) {
    }
    _exit(1);  // not reached if the hook ran
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 42) << "the child did not die inside the write";
  EXPECT_TRUE(std::filesystem::exists(path + ".tmp")) << "the partial write should be visible";
  expect_same(first, load_checkpoint(path));

  // The next save clears the leftover and succeeds.
  const Checkpoint third = sample_checkpoint(30, 4.0f);
  save_checkpoint(path, third);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  expect_same(third, load_checkpoint(path));
}

TEST(Checkpoint, FailedSaveRemovesTheTemporaryAndKeepsThePrevious) {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  const Checkpoint first = sample_checkpoint(10, 1.0f);
  save_checkpoint(path, first);
  EXPECT_THROW(save_checkpoint(path, sample_checkpoint(20, 2.0f),
                               [](std::size_t written, std::size_t) {
                                 if (written == 3) throw std::runtime_error("disk pulled");
                               }),
               std::runtime_error);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  expect_same(first, load_checkpoint(path));
}

TEST(Checkpoint, BadNamesAndPlacesAreRefused) {
  TempDir dir;
  Checkpoint checkpoint = sample_checkpoint(1, 1.0f);
  checkpoint.tensors["."] = HostArray::zeros(DType::f32, {1});
  try {
    save_checkpoint(dir.file("a.h5"), checkpoint);
    FAIL() << "expected CheckpointError";
  } catch (const CheckpointError& error) {
    EXPECT_NE(std::string(error.what()).find("'.'"), std::string::npos) << error.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("a.h5")));
  try {
    save_checkpoint(dir.file("no/such/dir/b.h5"), sample_checkpoint(1, 1.0f));
    FAIL() << "expected CheckpointError";
  } catch (const CheckpointError& error) {
    EXPECT_NE(std::string(error.what()).find("does not exist"), std::string::npos) << error.what();
  }
}

TEST(Checkpoint, LoadErrorsSayWhatIsWrong) {
  TempDir dir;
  EXPECT_NE(load_error(dir.file("missing.h5")).find("does not exist"), std::string::npos);

  const std::string text = dir.file("text.h5");
  std::ofstream(text) << "not a checkpoint\n";
  EXPECT_NE(load_error(text).find("not an HDF5 file"), std::string::npos) << load_error(text);

  const std::string other = dir.file("other.h5");
  h5::File::create(other).create_group("train");
  EXPECT_NE(load_error(other).find("not an ipupod checkpoint"), std::string::npos)
      << load_error(other);

  // A torn file (what a non-atomic writer would leave behind) is reported, not half-loaded.
  const std::string good = dir.file("good.h5");
  save_checkpoint(good, sample_checkpoint(5, 1.0f));
  const std::string torn = dir.file("torn.h5");
  std::filesystem::copy_file(good, torn);
  std::filesystem::resize_file(torn, std::filesystem::file_size(good) / 2);
  const std::string message = load_error(torn);
  EXPECT_NE(message.find("torn.h5"), std::string::npos) << message;
}

// Flips one bit of the first occurrence of `bytes` in the file (a tensor's stored data).
void flip_bit_in_file(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ifstream in(path, std::ios::binary);
  std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string needle(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const std::size_t at = file.find(needle);
  ASSERT_NE(at, std::string::npos) << "the tensor's bytes are not in the file";
  ASSERT_EQ(file.find(needle, at + 1), std::string::npos) << "the tensor's bytes are ambiguous";
  file[at + 5] = static_cast<char>(file[at + 5] ^ 0x10);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << file;
}

TEST(CheckpointIntegrity, AFlippedBitInATensorIsFoundAndNamed) {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  const Checkpoint saved = sample_checkpoint(12, 1.0f);
  save_checkpoint(path, saved);
  flip_bit_in_file(path, saved.tensors.at("dense0.weight").bytes);
  const std::string message = load_error(path);
  EXPECT_NE(message.find("tensor 'dense0.weight' fails its CRC32C check"), std::string::npos)
      << message;
}

TEST(CheckpointIntegrity, EditedStepAndRecordAreFound) {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  save_checkpoint(path, sample_checkpoint(12, 1.0f));
  h5::File::open(path, false).set_uint64_attribute("step", 13);
  std::string message = load_error(path);
  EXPECT_NE(message.find("step is 13 but the checksum record says 12"), std::string::npos)
      << message;

  save_checkpoint(path, sample_checkpoint(12, 1.0f));
  h5::File::open(path, false).set_uint64_attribute("checksum", 1);
  message = load_error(path);
  EXPECT_NE(message.find("its checksum record fails its CRC32C check"), std::string::npos)
      << message;
}

TEST(CheckpointIntegrity, NonFiniteValuesAreRefusedNamingTensorAndElement) {
  TempDir dir;
  Checkpoint nan = sample_checkpoint(3, 1.0f);
  nan.tensors["dense0.weight/momentum"].as<float>()[1] = std::numeric_limits<float>::quiet_NaN();
  save_checkpoint(dir.file("nan.h5"), nan);  // the checksums are right: only the values are bad
  std::string message = load_error(dir.file("nan.h5"));
  EXPECT_NE(message.find("tensor 'dense0.weight/momentum' float32[2] holds nan at element 1"),
            std::string::npos)
      << message;

  Checkpoint inf = sample_checkpoint(3, 1.0f);
  inf.tensors["half"] = HostArray::zeros(DType::f16, {3});
  inf.tensors["half"].as<Half>()[2].bits = 0xFC00;  // -infinity
  save_checkpoint(dir.file("inf.h5"), inf);
  message = load_error(dir.file("inf.h5"));
  EXPECT_NE(message.find("tensor 'half' float16[3] holds -inf at element 2"), std::string::npos)
      << message;
}

TEST(CheckpointIntegrity, AFormerFormatWithoutChecksumsIsRefused) {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  save_checkpoint(path, sample_checkpoint(12, 1.0f));
  h5::File::open(path, false).set_uint64_attribute("version", 1);
  const std::string message = load_error(path);
  EXPECT_NE(message.find("carry no checksums"), std::string::npos) << message;
}

TEST(Checkpoint, CompatibilityListsEveryDifference) {
  const Checkpoint checkpoint = sample_checkpoint(7, 1.0f);
  std::map<std::string, std::vector<std::size_t>> expected;
  for (const auto& [name, array] : checkpoint.tensors) expected[name] = array.shape;
  EXPECT_NO_THROW(check_compatible(checkpoint, expected));

  expected.erase("counts");
  expected["dense0.weight"] = {3, 2};
  expected["dense1.weight"] = {3, 10};
  try {
    check_compatible(checkpoint, expected);
    FAIL() << "expected CheckpointError";
  } catch (const CheckpointError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("missing tensors: 'dense1.weight' [3,10]"), std::string::npos)
        << message;
    EXPECT_NE(message.find("the model does not have: 'counts' [2]"), std::string::npos) << message;
    EXPECT_NE(message.find("'dense0.weight' is [2,3] in the checkpoint but [3,2] in the model"),
              std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace ipupod::host
