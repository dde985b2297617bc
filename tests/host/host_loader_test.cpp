// Tests of the Loader: disjoint covering shards, determinism per (seed, epoch), drop-last,
// batches that match their shard, prefetching identical to synchronous reads in any request
// order, non-finite values, and the too-small-split error.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <thread>

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

void expect_same_batch(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.epoch, b.epoch);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.replica, b.replica);
  EXPECT_EQ(a.inputs.shape, b.inputs.shape);
  EXPECT_EQ(a.inputs.bytes, b.inputs.bytes) << "epoch " << a.epoch << " step " << a.step;
  EXPECT_EQ(a.targets.bytes, b.targets.bytes) << "epoch " << a.epoch << " step " << a.step;
}

TEST(Loader, PrefetchedBatchesEqualSynchronousOnes) {
  TempDir dir;
  const std::string path = write_indexed(dir, 100);
  const LoaderConfig base{.path = path, .replicas = 3, .samples_per_step = 4, .seed = 5};
  LoaderConfig sync_config = base;
  sync_config.prefetch_steps = 0;
  Loader synchronous(sync_config);
  LoaderConfig prefetch_config = base;
  prefetch_config.prefetch_steps = 3;
  Loader prefetching(prefetch_config);
  const std::size_t steps = synchronous.steps_per_epoch();
  for (std::size_t e = 0; e < 3; ++e) {
    for (std::size_t s = 0; s < steps; ++s) {
      for (std::size_t r = 0; r < 3; ++r) {
        expect_same_batch(prefetching.batch(e, s, r), synchronous.batch(e, s, r));
      }
    }
  }
  const Loader::Stats stats = prefetching.stats();
  EXPECT_EQ(stats.prefetched + stats.synchronous, 3 * steps * 3);
  EXPECT_GT(stats.prefetched, 0u);
  EXPECT_EQ(synchronous.stats().prefetched, 0u);
}

TEST(Loader, PreloadedSplitGivesTheSameBatches) {
  TempDir dir;
  const std::string path = write_indexed(dir, 100);
  const LoaderConfig base{.path = path, .replicas = 2, .samples_per_step = 5, .seed = 9};
  LoaderConfig from_file = base;
  from_file.max_memory_bytes = 0;
  Loader preloaded(base), faulted(from_file);
  EXPECT_TRUE(preloaded.preloaded());  // a few KiB, far below half of any machine's memory
  EXPECT_FALSE(faulted.preloaded());
  for (std::size_t e = 0; e < 2; ++e) {
    for (std::size_t s = 0; s < preloaded.steps_per_epoch(); ++s) {
      for (std::size_t r = 0; r < 2; ++r)
        expect_same_batch(preloaded.batch(e, s, r), faulted.batch(e, s, r));
    }
  }
}

// The bytes a view's samples hold, one after the other.
std::vector<std::byte> joined(const ArrayView& view) {
  std::vector<std::byte> bytes;
  for (const std::span<const std::byte> sample : view.samples)
    bytes.insert(bytes.end(), sample.begin(), sample.end());
  return bytes;
}

TEST(Loader, ViewsHoldTheSameSamplesAsBatches) {
  TempDir dir;
  const std::string path = write_indexed(dir, 100);
  Loader loader({.path = path, .replicas = 3, .samples_per_step = 4, .seed = 11});
  ASSERT_TRUE(loader.serves_views());
  for (std::size_t e = 0; e < 2; ++e) {
    for (std::size_t s = 0; s < loader.steps_per_epoch(); ++s) {
      for (std::size_t r = 0; r < 3; ++r) {
        const BatchView view = loader.batch_view(e, s, r);
        const Batch batch = loader.batch(e, s, r);
        EXPECT_EQ(view.epoch, e);
        EXPECT_EQ(view.step, s);
        EXPECT_EQ(view.replica, r);
        ASSERT_EQ(view.inputs.samples.size(), 4u);
        EXPECT_EQ(view.inputs.shape, batch.inputs.shape);
        EXPECT_EQ(view.targets.shape, batch.targets.shape);
        EXPECT_EQ(view.inputs.dtype, DType::f32);
        EXPECT_EQ(view.targets.dtype, DType::i32);
        EXPECT_EQ(joined(view.inputs), batch.inputs.bytes) << e << " " << s << " " << r;
        EXPECT_EQ(joined(view.targets), batch.targets.bytes) << e << " " << s << " " << r;
      }
    }
  }
  EXPECT_THROW(loader.batch_view(0, loader.steps_per_epoch(), 0), std::out_of_range);
  EXPECT_THROW(loader.batch_view(0, 0, 3), std::out_of_range);

  // A split that is not preloaded is not served as views (its readers fault pages ahead).
  Loader faulted({.path = path, .replicas = 3, .samples_per_step = 4, .max_memory_bytes = 0});
  EXPECT_FALSE(faulted.serves_views());
  EXPECT_THROW(faulted.batch_view(0, 0, 0), std::logic_error);
}

TEST(Loader, PrefetchServesAnyRequestOrder) {
  TempDir dir;
  const std::string path = write_indexed(dir, 90);
  Loader synchronous(
      {.path = path, .replicas = 2, .samples_per_step = 5, .seed = 9, .prefetch_steps = 0});
  Loader prefetching(
      {.path = path, .replicas = 2, .samples_per_step = 5, .seed = 9, .prefetch_steps = 2});
  // Far ahead first (as after resuming), then repeats, a step back, another epoch's start.
  const std::vector<std::array<std::size_t, 3>> requests = {
      {2, 3, 0}, {2, 3, 1}, {2, 4, 0}, {2, 4, 1}, {2, 4, 1}, {2, 5, 1}, {2, 5, 0}, {2, 1, 0},
      {0, 0, 1}, {2, 6, 0}, {3, 0, 0}, {3, 0, 1}, {3, 1, 1}, {3, 1, 0}, {3, 2, 0}, {3, 2, 1}};
  for (const auto& [e, s, r] : requests) {
    expect_same_batch(prefetching.batch(e, s, r), synchronous.batch(e, s, r));
  }
}

TEST(Loader, ConcurrentFeedersGetTheirOwnBatches) {
  TempDir dir;
  const std::string path = write_indexed(dir, 200);
  Loader synchronous(
      {.path = path, .replicas = 4, .samples_per_step = 3, .seed = 1, .prefetch_steps = 0});
  Loader prefetching(
      {.path = path, .replicas = 4, .samples_per_step = 3, .seed = 1, .prefetch_steps = 2});
  const std::size_t steps = prefetching.steps_per_epoch();
  std::vector<std::vector<Batch>> got(4);
  std::vector<std::thread> feeders;
  for (std::size_t r = 0; r < 4; ++r) {
    feeders.emplace_back([&, r] {
      for (std::size_t e = 0; e < 2; ++e) {
        for (std::size_t s = 0; s < steps; ++s) got[r].push_back(prefetching.batch(e, s, r));
      }
    });
  }
  for (auto& feeder : feeders) feeder.join();
  for (std::size_t r = 0; r < 4; ++r) {
    ASSERT_EQ(got[r].size(), 2 * steps);
    for (std::size_t k = 0; k < got[r].size(); ++k) {
      expect_same_batch(got[r][k], synchronous.batch(k / steps, k % steps, r));
    }
  }
}

// Inputs [count, 2, 3] with value i*6+j, one element replaced by `bad`.
std::string write_with(const TempDir& dir, std::size_t count, std::size_t sample,
                       std::size_t element, float bad) {
  const std::string path = dir.file("bad.h5");
  DatasetWriter writer(path, {.chunk_samples = 8});
  for (const char* split : {"train", "test"}) {
    HostArray inputs = HostArray::zeros(DType::f32, {count, 2, 3});
    auto values = inputs.as<float>();
    std::iota(values.begin(), values.end(), 0.0f);
    if (std::string(split) == "train") values[sample * 6 + element] = bad;
    HostArray targets = HostArray::zeros(DType::i32, {count});
    writer.write_split(split, inputs, targets);
  }
  writer.finish();
  return path;
}

// A host instance's loader serves its own replicas: the same batches as a loader of every
// replica, and its background reader reads no other replica's.
TEST(Loader, ALoaderOfSomeReplicasReadsOnlyTheirBatches) {
  TempDir dir;
  const std::string path = write_indexed(dir, 100);
  const LoaderConfig all{.path = path, .replicas = 4, .samples_per_step = 3, .seed = 2};
  LoaderConfig some = all;
  some.first_replica = 2;
  some.served_replicas = 2;
  Loader every(all), instance(some);
  EXPECT_EQ(instance.served_replicas(), (std::vector<std::size_t>{2, 3}));
  const std::size_t steps = every.steps_per_epoch();
  for (std::size_t e = 0; e < 2; ++e)
    for (std::size_t s = 0; s < steps; ++s)
      for (std::size_t r : {2, 3}) expect_same_batch(instance.batch(e, s, r), every.batch(e, s, r));
  // Its reader kept ahead of both (a reader of every replica's batches would have stalled on
  // the two nobody takes), reading a step or two ahead, never other replicas' batches.
  const Loader::Stats stats = instance.stats();
  EXPECT_EQ(stats.prefetched, 2 * 2 * steps);
  EXPECT_LE(stats.read, 2 * (2 * steps + some.prefetch_steps + 1));
  LoaderConfig outside = all;
  outside.first_replica = 3;
  outside.served_replicas = 2;
  EXPECT_THROW(Loader{outside}, DatasetError);
}

TEST(LoaderErrors, NaNInInputsNamesSplitSampleAndElement) {
  TempDir dir;
  const std::string path = write_with(dir, 40, 37, 5, std::numeric_limits<float>::quiet_NaN());
  for (std::size_t prefetch : {0, 2}) {
    Loader loader({.path = path,
                   .replicas = 2,
                   .samples_per_step = 4,
                   .shuffle = false,
                   .prefetch_steps = prefetch});
    // Sample 37 is position 18 of replica 1's shard: step 4. Replica 0's batch there is clean.
    for (std::size_t s = 0; s < 4; ++s) {
      EXPECT_NO_THROW(loader.batch(0, s, 0));
      EXPECT_NO_THROW(loader.batch(0, s, 1));
    }
    EXPECT_NO_THROW(loader.batch(0, 4, 0));
    try {
      loader.batch(0, 4, 1);
      FAIL() << "expected DatasetError";
    } catch (const DatasetError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("split 'train'"), std::string::npos) << message;
      EXPECT_NE(message.find("inputs of sample 37, element 5 (position [1,2]"), std::string::npos)
          << message;
      EXPECT_NE(message.find("is NaN"), std::string::npos) << message;
    }
  }
  // Views (of a preloaded shuffled split) are checked the same way.
  Loader viewed({.path = path, .replicas = 2, .samples_per_step = 4, .seed = 3});
  ASSERT_TRUE(viewed.serves_views());
  std::size_t replica = 0, position = 0;
  for (std::size_t r = 0; r < 2; ++r) {
    const auto shard = viewed.shard_indices(0, r);
    const auto found = std::find(shard.begin(), shard.end(), 37u);
    if (found != shard.end()) {
      replica = r;
      position = static_cast<std::size_t>(found - shard.begin());
    }
  }
  EXPECT_NO_THROW(viewed.batch_view(0, position / 4, 1 - replica));
  try {
    viewed.batch_view(0, position / 4, replica);
    FAIL() << "expected DatasetError";
  } catch (const DatasetError& error) {
    EXPECT_NE(std::string(error.what()).find("inputs of sample 37, element 5 (position [1,2]"),
              std::string::npos)
        << error.what();
  }
  Loader unchecked({.path = path,
                    .replicas = 2,
                    .samples_per_step = 4,
                    .shuffle = false,
                    .check_finite = false});
  EXPECT_TRUE(std::isnan(unchecked.batch(0, 4, 1).inputs.as<float>()[2 * 6 + 5]));
}

TEST(LoaderErrors, InfinityInInputsIsRejected) {
  TempDir dir;
  const std::string path = write_with(dir, 16, 3, 0, -std::numeric_limits<float>::infinity());
  Loader loader({.path = path, .replicas = 1, .samples_per_step = 16});
  try {
    loader.batch(0, 0, 0);
    FAIL() << "expected DatasetError";
  } catch (const DatasetError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("sample 3, element 0"), std::string::npos) << message;
    EXPECT_NE(message.find("infinite"), std::string::npos) << message;
  }
}

TEST(Loader, WindowedShuffleKeepsWholeBlocksInEachWindow) {
  // 2,600 samples: 11 blocks of 256 (the last one 40), windows of 3 blocks (700 rounds up).
  const std::size_t count = 2600, window = 700, block = kShuffleBlockSamples;
  const auto order = windowed_permutation(count, window, 42, 3);
  std::vector<std::size_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::size_t> all(count);
  std::iota(all.begin(), all.end(), std::size_t{0});
  ASSERT_EQ(sorted, all);  // a permutation
  // Cut the order where each window ends: once it has taken every sample of its blocks.
  std::size_t position = 0, windows = 0;
  std::set<std::size_t> blocks_seen;
  std::vector<std::size_t> first_seen;  // blocks in the order they first appear
  while (position < count) {
    std::set<std::size_t> blocks;
    std::size_t samples = 0, expected = 0;
    do {
      const std::size_t b = order[position + samples] / block;
      if (blocks.insert(b).second) {
        first_seen.push_back(b);
        expected += std::min(block, count - b * block);
      }
      ++samples;
    } while (samples < expected);
    EXPECT_EQ(blocks.size(), windows < 3 ? 3u : 2u) << "window " << windows;
    for (std::size_t b : blocks) EXPECT_TRUE(blocks_seen.insert(b).second) << "block " << b;
    // Shuffled inside the window: not in file order.
    EXPECT_FALSE(std::is_sorted(order.begin() + position, order.begin() + position + samples));
    position += samples;
    ++windows;
  }
  EXPECT_EQ(windows, 4u);  // ceil(11 / 3)
  EXPECT_EQ(blocks_seen.size(), 11u);
  EXPECT_FALSE(std::is_sorted(first_seen.begin(), first_seen.end()));  // blocks shuffled too
  // A function of (seed, epoch).
  EXPECT_EQ(order, windowed_permutation(count, window, 42, 3));
  EXPECT_NE(order, windowed_permutation(count, window, 42, 4));
  EXPECT_NE(order, windowed_permutation(count, window, 43, 3));
  EXPECT_THROW(windowed_permutation(count, 0, 42, 3), std::invalid_argument);
  // A window of the whole split or more (up to the largest size) is one window of all blocks.
  for (const std::size_t huge : {count, std::numeric_limits<std::size_t>::max()}) {
    std::vector<std::size_t> one = windowed_permutation(count, huge, 42, 3);
    EXPECT_FALSE(std::is_sorted(one.begin(), one.end()));
    std::sort(one.begin(), one.end());
    EXPECT_EQ(one, all);
  }
}

TEST(Loader, WindowedShuffleShardsAndPrefetchesLikeTheWholeSplitOne) {
  TempDir dir;
  const std::string path = write_indexed(dir, 1100);  // 5 blocks, the last of 76
  const LoaderConfig base{.path = path,
                          .replicas = 3,
                          .samples_per_step = 8,
                          .shuffle_window = 300,
                          .seed = 5,
                          .prefetch_steps = 0};
  Loader synchronous(base);
  LoaderConfig prefetch_config = base;
  prefetch_config.prefetch_steps = 3;
  prefetch_config.reader_threads = 2;
  Loader prefetching(prefetch_config);
  // Not preloaded: windows are read ahead as the epoch reaches them.
  EXPECT_FALSE(synchronous.preloaded());
  EXPECT_FALSE(synchronous.serves_views());
  const std::size_t steps = synchronous.steps_per_epoch();
  EXPECT_EQ(steps, 45u);  // floor(1100 / 24)
  for (std::size_t e = 0; e < 2; ++e) {
    const auto order = windowed_permutation(1100, 300, 5, e);
    std::set<std::size_t> seen;
    for (std::size_t r = 0; r < 3; ++r) {
      const auto shard = synchronous.shard_indices(e, r);
      ASSERT_EQ(shard.size(), steps * 8);
      for (std::size_t k = 0; k < shard.size(); ++k) {
        EXPECT_EQ(shard[k], order[k * 3 + r]);
        EXPECT_TRUE(seen.insert(shard[k]).second) << "index " << shard[k] << " in two shards";
      }
    }
    EXPECT_EQ(seen.size(), steps * 24);  // 20 samples dropped
    for (std::size_t s = 0; s < steps; ++s) {
      for (std::size_t r = 0; r < 3; ++r) {
        const Batch batch = prefetching.batch(e, s, r);
        expect_same_batch(batch, synchronous.batch(e, s, r));
        EXPECT_EQ(batch.targets.as<std::int32_t>()[0],
                  static_cast<std::int32_t>(order[s * 24 + r]));
      }
    }
  }
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
