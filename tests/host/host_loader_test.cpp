// Tests of the Loader: disjoint covering shards, determinism per (seed, epoch), drop-last,
// batches that match their shard, and the too-small-split error.
#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "host/loader.hpp"
#include "tests/host/temp_dir.hpp"

namespace ipupod::host {
namespace {

using ipupod::testing::TempDir;

// A split whose targets equal the sample index, so batches can be checked against shards.
std::string write_indexed(const TempDir& dir, std::size_t train, std::size_t test = 3) {
  const std::string path = dir.file("indexed.h5");
  DatasetWriter writer(path, {.chunk_samples = 16});
  for (const auto& [name, count] : {std::pair<const char*, std::size_t>{"train", train},
                                    std::pair<const char*, std::size_t>{"test", test}}) {
    HostArray inputs = HostArray::zeros(DType::f32, {count, 2});
    HostArray targets = HostArray::zeros(DType::i32, {count});
    for (std::size_t i = 0; i < count; ++i) {
      inputs.as<float>()[2 * i] = static_cast<float>(i);
      inputs.as<float>()[2 * i + 1] = -static_cast<float>(i);
      targets.as<std::int32_t>()[i] = static_cast<std::int32_t>(i);
    }
    writer.write_split(name, inputs, targets);
  }
  writer.finish();
  return path;
}

TEST(Loader, ShardsAreDisjointAndCoverDropLast) {
  TempDir dir;
  const std::string path = write_indexed(dir, 103);
  for (bool shuffle : {true, false}) {
    Loader loader(
        {.path = path, .replicas = 4, .samples_per_step = 5, .shuffle = shuffle, .seed = 7});
    EXPECT_EQ(loader.steps_per_epoch(), 5u);  // floor(103 / 20)
    std::set<std::size_t> seen;
    for (std::size_t r = 0; r < 4; ++r) {
      const auto shard = loader.shard_indices(0, r);
      EXPECT_EQ(shard.size(), 25u);
      for (std::size_t index : shard) {
        EXPECT_LT(index, 103u);
        EXPECT_TRUE(seen.insert(index).second) << "index " << index << " in two shards";
      }
    }
    EXPECT_EQ(seen.size(), 100u);  // 3 samples dropped
  }
}

TEST(Loader, DeterministicPerSeedAndEpoch) {
  TempDir dir;
  const std::string path = write_indexed(dir, 64);
  Loader a({.path = path, .replicas = 2, .samples_per_step = 4, .seed = 11});
  Loader b({.path = path, .replicas = 2, .samples_per_step = 4, .seed = 11});
  Loader c({.path = path, .replicas = 2, .samples_per_step = 4, .seed = 12});
  EXPECT_EQ(a.shard_indices(3, 1), b.shard_indices(3, 1));
  EXPECT_NE(a.shard_indices(0, 0), a.shard_indices(1, 0));
  EXPECT_NE(a.shard_indices(0, 0), c.shard_indices(0, 0));
  Loader plain({.path = path, .replicas = 2, .samples_per_step = 4, .shuffle = false});
  const auto shard = plain.shard_indices(5, 1);
  EXPECT_EQ(shard.front(), 1u);
  EXPECT_EQ(shard[1], 3u);
  EXPECT_EQ(plain.shard_indices(0, 1), shard);
}

TEST(Loader, BatchesFollowTheShard) {
  TempDir dir;
  const std::string path = write_indexed(dir, 50);
  Loader loader({.path = path, .replicas = 3, .samples_per_step = 4, .seed = 3});
  ASSERT_EQ(loader.steps_per_epoch(), 4u);
  for (std::size_t r = 0; r < 3; ++r) {
    const auto shard = loader.shard_indices(2, r);
    for (std::size_t step = 0; step < loader.steps_per_epoch(); ++step) {
      const Batch batch = loader.batch(2, step, r);
      EXPECT_EQ(batch.epoch, 2u);
      EXPECT_EQ(batch.step, step);
      EXPECT_EQ(batch.replica, r);
      ASSERT_EQ(batch.inputs.shape, (std::vector<std::size_t>{4, 2}));
      ASSERT_EQ(batch.targets.shape, (std::vector<std::size_t>{4}));
      for (std::size_t k = 0; k < 4; ++k) {
        const std::size_t expected = shard[step * 4 + k];
        EXPECT_EQ(batch.targets.as<std::int32_t>()[k], static_cast<std::int32_t>(expected));
        EXPECT_EQ(batch.inputs.as<float>()[2 * k], static_cast<float>(expected));
      }
    }
  }
  EXPECT_THROW(loader.batch(0, 4, 0), std::out_of_range);
  EXPECT_THROW(loader.batch(0, 0, 3), std::out_of_range);
}

TEST(Loader, SplitSmallerThanOneGlobalBatchIsRejected) {
  TempDir dir;
  const std::string path = write_indexed(dir, 50, 7);
  try {
    Loader loader({.path = path, .split = "test", .replicas = 2, .samples_per_step = 4});
    FAIL() << "expected DatasetError";
  } catch (const DatasetError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("7 samples"), std::string::npos) << message;
    EXPECT_NE(message.find("global batch of 8"), std::string::npos) << message;
  }
  EXPECT_THROW(Loader({.path = dir.file("missing.h5")}), DatasetError);
}

TEST(Loader, PermutationIsAPermutation) {
  const auto order = epoch_permutation(1000, 42, 0);
  std::vector<std::size_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::size_t> expected(1000);
  std::iota(expected.begin(), expected.end(), std::size_t{0});
  EXPECT_EQ(sorted, expected);
  EXPECT_NE(order, expected);
}

}  // namespace
}  // namespace ipupod::host
