// The host's data loader: shards each epoch of a dataset split across replicas (shuffled with a
// seeded, portable permutation, drop-last like PopTorch) and reads per-replica host-step batches,
// prefetched by a background reader.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "host/dataset.hpp"
#include "host/host_array.hpp"

namespace ipupod::host {

struct LoaderConfig {
  std::string path;
  std::string split = "train";
  std::size_t replicas = 1;
  // The replicas this loader serves (a host instance's): first_replica and the next
  // served_replicas (0: all from first_replica on). Its background reader reads only their
  // batches; the sharding over all `replicas` is the same whichever it serves.
  std::size_t first_replica = 0;
  std::size_t served_replicas = 0;
  // Per replica per host step: micro-batch x gradient accumulation x device iterations.
  std::size_t samples_per_step = 1;
  bool shuffle = true;
  // With shuffle: 0 shuffles the whole split each epoch (any sample can come next). N > 0
  // shuffles in windows of N samples, for splits larger than memory: blocks of
  // kShuffleBlockSamples consecutive samples are taken in a shuffled order, and the samples of
  // each run of ceil(N / kShuffleBlockSamples) such blocks are shuffled together (as a shuffle
  // buffer of N samples would). A window's blocks are whole stretches of the file, read ahead
  // while the window before streams, where a whole-split shuffle must first read the split.
  std::size_t shuffle_window = 0;
  std::uint64_t seed = 0;
  // Host steps (every replica's batch of a step) a background reader keeps ready ahead of the
  // batch() calls; 0 reads synchronously inside batch(). Memory: prefetch_steps global batches.
  std::size_t prefetch_steps = 2;
  // Background reader threads (with prefetch_steps > 0): each reads whole steps, so more than one
  // keeps up when copying samples out of the file is slower than streaming them on.
  std::size_t reader_threads = 1;
  // With a whole-split shuffle, the split's pages are read into memory at the start
  // (DatasetFile::preload), in file order, when they take at most this many bytes (nullopt: half of
  // the machine's physical memory; 0: never). A shuffled epoch needs samples from all over the file
  // from its first step on, so reading it all first loses nothing, and random page faults on a file
  // that is not in the page cache cost many times a sequential pass. A larger split is faulted in
  // as it is read.
  std::optional<std::size_t> max_memory_bytes{};
  // NaN or infinity in a float array of a batch is a DatasetError naming split, sample, element.
  // Each sample is scanned the first time this loader reads it (the file does not change).
  bool check_finite = true;
};

struct Batch {
  std::size_t epoch = 0, step = 0, replica = 0;
  HostArray inputs, targets;  // [samples_per_step, sample_shape...]
};

// One array of a BatchView: its samples where they lie in the loader's read-only mapping of the
// file, one span per sample in batch order.
struct ArrayView {
  DType dtype = DType::f32;
  std::vector<std::size_t> shape;  // [samples_per_step, sample_shape...]
  std::vector<std::span<const std::byte>> samples;
};

// A batch that is not copied out of the file: a gather write sends each sample from the file's
// pages straight into a socket. Valid while the loader lives.
struct BatchView {
  std::size_t epoch = 0, step = 0, replica = 0;
  ArrayView inputs, targets;
};

// Ordering of one epoch:
//   1. permutation p of 0..samples-1: identity without shuffle, else a Fisher-Yates shuffle
//      driven by std::mt19937_64 seeded from (seed, epoch) -- the same on every platform;
//   2. keep the first steps_per_epoch * replicas * samples_per_step entries (drop-last);
//   3. replica r takes p[r], p[r + R], p[r + 2R], ... (interleaved, like torch's
//      DistributedSampler), so every global batch comes from one contiguous block of p.
//
// Prefetch: the reader walks host steps in order (epoch 0 step 0, 1, ..., then epoch 1 ...),
// reading each step's global batch with one sorted gather per array, and keeps at most
// prefetch_steps steps ready. batch(e, s, r) takes replica r's batch of a ready step without
// copying; a step is dropped once every replica has taken it or asked for a later one. Any other
// request (a repeat, going back, far ahead) is read synchronously. Either way the result is the
// same: a batch is a pure function of (seed, epoch, step, replica).
class Loader {
 public:
  explicit Loader(LoaderConfig config);  // opens and validates the DatasetFile
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  const LoaderConfig& config() const { return config_; }
  // The replicas it serves, in order (LoaderConfig::first_replica, served_replicas).
  std::vector<std::size_t> served_replicas() const;
  const SplitInfo& info() const { return info_; }
  const DatasetFile& file() const { return file_; }
  // True if the split was preloaded (see LoaderConfig::max_memory_bytes).
  bool preloaded() const { return file_.preloaded(config_.split); }
  // floor(samples / (replicas * samples_per_step)); never 0 (the constructor checks).
  std::size_t steps_per_epoch() const { return steps_per_epoch_; }

  // The indices replica `replica` sees in epoch `epoch`, in order
  // (steps_per_epoch * samples_per_step of them).
  std::vector<std::size_t> shard_indices(std::size_t epoch, std::size_t replica) const;
  // Samples [step * samples_per_step, (step + 1) * samples_per_step) of that shard.
  // Safe to call from several threads (e.g. one feeder per replica).
  Batch batch(std::size_t epoch, std::size_t step, std::size_t replica) const;

  // True if batch_view serves this loader: both arrays are read from the file's mapping
  // (uncompressed) and the split was preloaded. A split too large to preload is better served by
  // batch(), whose background readers take the page faults ahead of the sender.
  bool serves_views() const;
  // The same samples as batch(epoch, step, replica), in the same order, as views into the
  // mapping (see BatchView); each sample is checked for NaN and infinity the first time, as in
  // batch(). No background reader is involved: there is nothing to copy ahead. Throws
  // std::logic_error if !serves_views().
  BatchView batch_view(std::size_t epoch, std::size_t step, std::size_t replica) const;
  // DatasetError if the file has since been truncated (DatasetFile::check_not_truncated): call
  // it just before sending a view that was made a while ago.
  void check_views() const { file_.check_not_truncated(config_.split); }

  // Gives a batch's buffers back once its data has been sent or copied: later batches are read
  // into them instead of into freshly allocated memory, whose first touch costs a page fault
  // per 4 KiB. Optional; a batch that is never given back is simply freed.
  void recycle(Batch&& batch) const;

  // Counters for tests and benchmarks: batches handed out from the prefetched window,
  // batches read synchronously in batch(), and batches read from the file (by either way).
  struct Stats {
    std::size_t prefetched = 0;
    std::size_t synchronous = 0;
    std::size_t read = 0;
  };
  Stats stats() const;

 private:
  class Prefetcher;
  std::shared_ptr<const std::vector<std::size_t>> epoch_order(std::size_t epoch) const;
  void check_position(std::size_t step, std::size_t replica) const;
  // The batches of `replicas` at (epoch, step); a failed check is stored per replica.
  std::vector<Batch> read_batches(std::size_t epoch, std::size_t step,
                                  std::span<const std::size_t> replicas,
                                  std::vector<std::exception_ptr>& errors) const;

  LoaderConfig config_;
  DatasetFile file_;
  SplitInfo info_;
  std::size_t steps_per_epoch_ = 0;
  // The permutations of the two most recent epochs, shared by all replicas' batch() calls.
  mutable std::mutex cache_mutex_;
  mutable std::size_t cached_epoch_ = 0;
  mutable std::shared_ptr<const std::vector<std::size_t>> cached_order_;
  mutable std::size_t previous_epoch_ = 0;
  mutable std::shared_ptr<const std::vector<std::size_t>> previous_order_;
  // Scans file samples `indices` (sample(k, field) gives the bytes of indices[k]) for NaN and
  // infinity unless an earlier call found them finite; DatasetError on the first bad one.
  void check_samples(
      std::span<const std::size_t> indices,
      const std::function<std::span<const std::byte>(std::size_t, Field)>& sample) const;
  // A buffer of exactly `bytes` bytes, from the recycled ones when one fits.
  std::vector<std::byte> take_buffer(std::size_t bytes) const;
  mutable std::mutex spare_mutex_;
  mutable std::vector<std::vector<std::byte>> spare_;
  bool windowed() const { return config_.shuffle && config_.shuffle_window > 0; }
  // The file indices of replica's batch at `step` of an epoch in `order`.
  std::vector<std::size_t> batch_indices(const std::vector<std::size_t>& order, std::size_t step,
                                         std::size_t replica) const;
  // [samples_per_step, sample shape...]
  std::vector<std::size_t> batch_shape(const ArraySpec& spec) const;
  // Windowed shuffle: asks the system to read the blocks of the samples at order positions
  // [from, from + window + one global batch) that it has not been asked for this epoch.
  void read_ahead(std::size_t epoch, const std::vector<std::size_t>& order, std::size_t from) const;
  struct ReadAhead {
    std::vector<std::uint64_t> block_epoch;  // per block: 1 + the last epoch it was asked for
    std::uint64_t epoch = 0;                 // 1 + the epoch the scans have reached into,
    std::size_t reached = 0;                 // and the order position they reached
  };
  mutable std::mutex read_ahead_mutex_;
  mutable ReadAhead read_ahead_state_;
  // Per sample of the split: already found finite (see LoaderConfig::check_finite).
  std::unique_ptr<std::atomic<bool>[]> finite_checked_;
  mutable std::mutex stats_mutex_;
  mutable Stats stats_;
  // Started by the first batch() call (a loader serving only views needs no reader).
  void start_prefetcher() const;
  mutable std::once_flag prefetcher_started_;
  mutable std::unique_ptr<Prefetcher> prefetcher_;  // last: stopped before the rest is destroyed
};

// A permutation of 0..count-1 from a Fisher-Yates shuffle driven by mt19937_64 seeded from
// (seed, epoch). Exposed for tests and for tools that want to reproduce the loader's order.
std::vector<std::size_t> epoch_permutation(std::size_t count, std::uint64_t seed,
                                           std::uint64_t epoch);

// Consecutive samples a windowed shuffle keeps together (see LoaderConfig::shuffle_window).
inline constexpr std::size_t kShuffleBlockSamples = 256;

// The order of a windowed shuffle of `window` samples (> 0): the blocks of kShuffleBlockSamples
// (the last one may be shorter) in the order epoch_permutation(blocks, seed, epoch) gives, cut
// into windows of ceil(window / kShuffleBlockSamples) blocks; each window's samples shuffled by
// Fisher-Yates with one mt19937_64 seeded from (seed, epoch) and a constant, window after window.
std::vector<std::size_t> windowed_permutation(std::size_t count, std::size_t window,
                                              std::uint64_t seed, std::uint64_t epoch);

// Half of the machine's physical memory: the default of LoaderConfig::max_memory_bytes.
std::size_t default_max_memory_bytes();

}  // namespace ipupod::host
