// The host's data loader: shards each epoch of a dataset split across replicas (shuffled with a
// seeded, portable permutation, drop-last like PopTorch) and reads per-replica host-step batches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "host/dataset.hpp"
#include "host/host_array.hpp"

namespace ipupod::host {

struct LoaderConfig {
  std::string path;
  std::string split = "train";
  std::size_t replicas = 1;
  // Per replica per host step: micro-batch x gradient accumulation x device iterations.
  std::size_t samples_per_step = 1;
  bool shuffle = true;
  std::uint64_t seed = 0;
};

struct Batch {
  std::size_t epoch = 0, step = 0, replica = 0;
  HostArray inputs, targets;  // [samples_per_step, sample_shape...]
};

// Ordering of one epoch:
//   1. permutation p of 0..samples-1: identity without shuffle, else a Fisher-Yates shuffle
//      driven by std::mt19937_64 seeded from (seed, epoch) -- the same on every platform;
//   2. keep the first steps_per_epoch * replicas * samples_per_step entries (drop-last);
//   3. replica r takes p[r], p[r + R], p[r + 2R], ... (interleaved, like torch's
//      DistributedSampler), so every global batch comes from one contiguous block of p.
class Loader {
 public:
  explicit Loader(LoaderConfig config);  // opens and validates the DatasetFile

  const LoaderConfig& config() const { return config_; }
  const SplitInfo& info() const { return info_; }
  const DatasetFile& file() const { return file_; }
  // floor(samples / (replicas * samples_per_step)); never 0 (the constructor checks).
  std::size_t steps_per_epoch() const { return steps_per_epoch_; }

  // The indices replica `replica` sees in epoch `epoch`, in order
  // (steps_per_epoch * samples_per_step of them).
  std::vector<std::size_t> shard_indices(std::size_t epoch, std::size_t replica) const;
  // Samples [step * samples_per_step, (step + 1) * samples_per_step) of that shard.
  Batch batch(std::size_t epoch, std::size_t step, std::size_t replica) const;

 private:
  std::shared_ptr<const std::vector<std::size_t>> epoch_order(std::size_t epoch) const;

  LoaderConfig config_;
  DatasetFile file_;
  SplitInfo info_;
  std::size_t steps_per_epoch_ = 0;
  // The permutation of the most recent epoch, shared by all replicas' batch() calls.
  mutable std::mutex cache_mutex_;
  mutable std::size_t cached_epoch_ = 0;
  mutable std::shared_ptr<const std::vector<std::size_t>> cached_order_;
};

// A permutation of 0..count-1 from a Fisher-Yates shuffle driven by mt19937_64 seeded from
// (seed, epoch). Exposed for tests and for tools that want to reproduce the loader's order.
std::vector<std::size_t> epoch_permutation(std::size_t count, std::uint64_t seed,
                                           std::uint64_t epoch);

}  // namespace ipupod::host
