// Loader: epoch permutation, drop-last sharding across replicas, batch reads through DatasetFile,
// the prefetching reader thread, and the check for non-finite values.
// std::shuffle and std::uniform_int_distribution are implementation-defined, so we use our own.
#include "host/loader.hpp"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "host/data_scan.hpp"

namespace ipupod::host {
namespace {

// SplitMix64 finaliser: spreads (seed, epoch) over all 64 bits before seeding the engine.
std::uint64_t mix(std::uint64_t value) {
  value += 0x9E3779B97F4A7C15ULL;
  value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9ULL;
  value = (value ^ (value >> 27)) * 0x94D049BB133111EBULL;
  return value ^ (value >> 31);
}

// Uniform integer in [0, bound) by rejection (unbiased, portable).
std::uint64_t uniform_below(std::mt19937_64& engine, std::uint64_t bound) {
  const std::uint64_t limit =
      std::numeric_limits<std::uint64_t>::max() - std::numeric_limits<std::uint64_t>::max() % bound;
  std::uint64_t value = engine();
  while (value >= limit) value = engine();
  return value % bound;
}

}  // namespace

// ---------------------------------------------------------------- Prefetcher

class Loader::Prefetcher {
 public:
  explicit Prefetcher(const Loader& loader)
      : loader_(loader), cursor_(loader.served_replicas().size(), 0) {
    // Several readers take the next unclaimed step each; a step is read by exactly one of them.
    for (std::size_t t = 0; t < std::max<std::size_t>(1, loader.config().reader_threads); ++t)
      threads_.emplace_back([this] { run(); });
  }
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    for (std::thread& thread : threads_) thread.join();
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Hands out replica's batch of host step `position` (epoch * steps_per_epoch + step) if the
  // window has it, waiting while it is being read; false if the request must be read directly.
  bool take(std::uint64_t position, std::size_t replica, Batch& out) {
    const std::size_t first = loader_.config().first_replica;
    if (replica < first || replica - first >= cursor_.size()) return false;  // not served here
    replica -= first;
    std::unique_lock<std::mutex> lock(mutex_);
    if (position + 1 <= cursor_[replica]) return false;  // a repeat or a step back
    cursor_[replica] = position + 1;
    std::shared_ptr<Slot> slot;
    for (const auto& candidate : window_) {
      if (candidate->position == position) slot = candidate;
    }
    if (!slot && position == next_ && window_.size() < capacity_) {
      // The reader has not got here yet (e.g. it has only just started): queue the step for it
      // rather than reading it twice.
      slot = std::make_shared<Slot>();
      slot->position = next_++;
      window_.push_back(slot);
      changed_.notify_all();
    }
    std::exception_ptr error;
    bool served = false;
    if (slot) {
      changed_.wait(lock,
                    [&] { return slot->ready || stop_ || (slot->dropped && !slot->claimed); });
      if (slot->ready) {
        served = true;
        error = slot->errors[replica];
        out = std::move(slot->batches[replica]);
      }
    }
    // Steps every replica has taken or passed are dropped; the reader never goes back to them.
    const std::uint64_t done = *std::min_element(cursor_.begin(), cursor_.end());
    while (!window_.empty() && window_.front()->position < done) {
      window_.front()->dropped = true;  // a waiter on it reads synchronously unless it is claimed
      window_.pop_front();
    }
    if (next_ < done) next_ = done;
    lock.unlock();
    changed_.notify_all();
    if (error) std::rethrow_exception(error);
    return served;
  }

 private:
  struct Slot {
    std::uint64_t position = 0;
    bool claimed = false;  // the reader is reading it
    bool dropped = false;  // left the window; if unclaimed, nobody will read it
    bool ready = false;
    std::vector<Batch> batches;
    std::vector<std::exception_ptr> errors;
  };

  void run() {
    const std::vector<std::size_t> replicas = loader_.served_replicas();
    const std::size_t steps = loader_.steps_per_epoch();
    std::unique_lock<std::mutex> lock(mutex_);
    const auto unclaimed = [&] {
      return std::find_if(window_.begin(), window_.end(),
                          [](const std::shared_ptr<Slot>& slot) { return !slot->claimed; });
    };
    for (;;) {
      changed_.wait(lock, [&] {
        return stop_ || window_.size() < capacity_ || unclaimed() != window_.end();
      });
      if (stop_) return;
      std::shared_ptr<Slot> slot;
      if (const auto queued = unclaimed(); queued != window_.end()) {
        slot = *queued;
      } else {
        slot = std::make_shared<Slot>();
        slot->position = next_++;
        window_.push_back(slot);
      }
      slot->claimed = true;
      lock.unlock();
      std::vector<Batch> batches;
      std::vector<std::exception_ptr> errors(replicas.size());
      try {
        batches =
            loader_.read_batches(slot->position / steps, slot->position % steps, replicas, errors);
      } catch (...) {
        batches.resize(replicas.size());
        std::fill(errors.begin(), errors.end(), std::current_exception());
      }
      lock.lock();
      slot->batches = std::move(batches);
      slot->errors = std::move(errors);
      slot->ready = true;
      changed_.notify_all();
    }
  }

  const Loader& loader_;
  const std::size_t capacity_ = loader_.config().prefetch_steps;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::shared_ptr<Slot>> window_;  // ascending positions
  std::uint64_t next_ = 0;                    // the next position the reader reads
  std::vector<std::uint64_t> cursor_;         // per replica: 1 + the last position asked for
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// ---------------------------------------------------------------- Loader

std::vector<std::size_t> epoch_permutation(std::size_t count, std::uint64_t seed,
                                           std::uint64_t epoch) {
  std::vector<std::size_t> order(count);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937_64 engine(mix(seed ^ mix(epoch)));
  for (std::size_t i = count; i > 1; --i) {
    std::swap(order[i - 1], order[uniform_below(engine, i)]);
  }
  return order;
}

std::vector<std::size_t> windowed_permutation(std::size_t count, std::size_t window,
                                              std::uint64_t seed, std::uint64_t epoch) {
  if (window == 0) throw std::invalid_argument("windowed_permutation: window must be at least 1");
  const auto whole_blocks = [](std::size_t n) {  // ceil(n / block) without overflow
    return n / kShuffleBlockSamples + (n % kShuffleBlockSamples != 0 ? 1 : 0);
  };
  const std::size_t blocks = whole_blocks(count);
  // A window as large as the split or larger is one window of every block.
  const std::size_t window_blocks =
      std::max<std::size_t>(1, std::min(blocks, whole_blocks(window)));
  const std::vector<std::size_t> block_order = epoch_permutation(blocks, seed, epoch);
  std::vector<std::size_t> order;
  order.reserve(count);
  // A stream of its own: not the one that ordered the blocks.
  std::mt19937_64 engine(mix(seed ^ mix(epoch ^ 0x5748554646'4C4557ULL)));
  for (std::size_t first = 0; first < blocks; first += window_blocks) {
    const std::size_t start = order.size();
    for (std::size_t b = first; b < std::min(blocks, first + window_blocks); ++b) {
      const std::size_t begin = block_order[b] * kShuffleBlockSamples;
      for (std::size_t i = begin; i < std::min(count, begin + kShuffleBlockSamples); ++i)
        order.push_back(i);
    }
    for (std::size_t i = order.size() - start; i > 1; --i) {
      std::swap(order[start + i - 1], order[start + uniform_below(engine, i)]);
    }
  }
  return order;
}

std::size_t default_max_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_bytes = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return 0;  // unknown: stay with the file
  return static_cast<std::size_t>(pages) / 2 * static_cast<std::size_t>(page_bytes);
}

Loader::Loader(LoaderConfig config) : config_(std::move(config)), file_(config_.path) {
  info_ = file_.info(config_.split);
  if (config_.replicas == 0) throw DatasetError("loader: replicas must be at least 1");
  if (config_.first_replica >= config_.replicas ||
      config_.served_replicas > config_.replicas - config_.first_replica)
    throw DatasetError("loader: serves replicas " + std::to_string(config_.first_replica) + " + " +
                       std::to_string(config_.served_replicas) + " of " +
                       std::to_string(config_.replicas));
  if (config_.samples_per_step == 0) {
    throw DatasetError(
        "loader: samples per step (micro-batch x gradient accumulation x device "
        "iterations) must be at least 1");
  }
  const std::size_t global = config_.replicas * config_.samples_per_step;
  steps_per_epoch_ = info_.samples / global;
  if (steps_per_epoch_ == 0) {
    throw DatasetError("split '" + config_.split + "' of '" + config_.path + "' has " +
                       std::to_string(info_.samples) + " samples, fewer than one global batch of " +
                       std::to_string(global) + " (" + std::to_string(config_.replicas) +
                       " replicas x " + std::to_string(config_.samples_per_step) +
                       " samples per step); use fewer replicas, a smaller batch or more data");
  }
  finite_checked_ = std::make_unique<std::atomic<bool>[]>(info_.samples);
  if (windowed()) {
    // Each window's blocks are read ahead as the epoch reaches them.
    read_ahead_state_.block_epoch.assign(
        (info_.samples + kShuffleBlockSamples - 1) / kShuffleBlockSamples, 0);
  } else if (config_.shuffle) {
    // A whole-split shuffle needs samples from all over the file from its first step on.
    file_.preload(config_.split, config_.max_memory_bytes.value_or(default_max_memory_bytes()));
  }
  // In file order, the system's own read-ahead of sequential page faults serves.
}

void Loader::start_prefetcher() const {
  std::call_once(prefetcher_started_, [this] {
    if (config_.prefetch_steps > 0) prefetcher_ = std::make_unique<Prefetcher>(*this);
  });
}

Loader::~Loader() {
  prefetcher_.reset();
}

Loader::Stats Loader::stats() const {
  std::lock_guard<std::mutex> guard(stats_mutex_);
  return stats_;
}

std::shared_ptr<const std::vector<std::size_t>> Loader::epoch_order(std::size_t epoch) const {
  std::lock_guard<std::mutex> guard(cache_mutex_);
  // Two epochs are kept: the reader may already be in the next one while batch() is not.
  if (previous_order_ && previous_epoch_ == epoch) {
    std::swap(previous_order_, cached_order_);
    std::swap(previous_epoch_, cached_epoch_);
  }
  if (!cached_order_ || cached_epoch_ != epoch) {
    previous_order_ = std::move(cached_order_);
    previous_epoch_ = cached_epoch_;
    std::vector<std::size_t> order;
    if (windowed()) {
      order = windowed_permutation(info_.samples, config_.shuffle_window, config_.seed, epoch);
    } else if (config_.shuffle) {
      order = epoch_permutation(info_.samples, config_.seed, epoch);
    } else {
      order.resize(info_.samples);
      std::iota(order.begin(), order.end(), std::size_t{0});
    }
    cached_order_ = std::make_shared<const std::vector<std::size_t>>(std::move(order));
    cached_epoch_ = epoch;
  }
  return cached_order_;
}

std::vector<std::size_t> Loader::shard_indices(std::size_t epoch, std::size_t replica) const {
  if (replica >= config_.replicas) {
    throw std::out_of_range("loader: replica " + std::to_string(replica) + " out of range (" +
                            std::to_string(config_.replicas) + " replicas)");
  }
  const auto order = epoch_order(epoch);
  const std::size_t per_replica = steps_per_epoch_ * config_.samples_per_step;
  std::vector<std::size_t> shard(per_replica);
  for (std::size_t k = 0; k < per_replica; ++k) {
    shard[k] = (*order)[k * config_.replicas + replica];
  }
  return shard;
}

void Loader::check_position(std::size_t step, std::size_t replica) const {
  if (step >= steps_per_epoch_) {
    throw std::out_of_range("loader: step " + std::to_string(step) + " out of range (" +
                            std::to_string(steps_per_epoch_) + " steps per epoch)");
  }
  if (replica >= config_.replicas) {
    throw std::out_of_range("loader: replica " + std::to_string(replica) + " out of range (" +
                            std::to_string(config_.replicas) + " replicas)");
  }
}

std::vector<Batch> Loader::read_batches(std::size_t epoch, std::size_t step,
                                        std::span<const std::size_t> replicas,
                                        std::vector<std::exception_ptr>& errors) const {
  const auto order = epoch_order(epoch);
  const std::size_t per_batch = config_.samples_per_step;
  {
    std::lock_guard<std::mutex> guard(stats_mutex_);
    stats_.read += replicas.size();
  }
  if (windowed()) read_ahead(epoch, *order, step * per_batch * config_.replicas);
  std::vector<Batch> batches(replicas.size());
  std::vector<std::vector<std::size_t>> indices(replicas.size());
  std::vector<SampleRead> inputs, targets;
  inputs.reserve(replicas.size() * per_batch);
  targets.reserve(replicas.size() * per_batch);
  const std::size_t input_bytes =
      shape_elements(info_.inputs.sample_shape) * dtype_size(info_.inputs.dtype);
  const std::size_t target_bytes =
      shape_elements(info_.targets.sample_shape) * dtype_size(info_.targets.dtype);
  for (std::size_t b = 0; b < replicas.size(); ++b) {
    Batch& batch = batches[b];
    batch.epoch = epoch;
    batch.step = step;
    batch.replica = replicas[b];
    // Every byte is overwritten by the gather below, so recycled buffers need no clearing.
    batch.inputs.dtype = info_.inputs.dtype;
    batch.inputs.shape = batch_shape(info_.inputs);
    batch.inputs.bytes = take_buffer(per_batch * input_bytes);
    batch.targets.dtype = info_.targets.dtype;
    batch.targets.shape = batch_shape(info_.targets);
    batch.targets.bytes = take_buffer(per_batch * target_bytes);
    indices[b] = batch_indices(*order, step, replicas[b]);
    for (std::size_t k = 0; k < per_batch; ++k) {
      inputs.push_back({indices[b][k], batch.inputs.bytes.data() + k * input_bytes});
      targets.push_back({indices[b][k], batch.targets.bytes.data() + k * target_bytes});
    }
  }
  // One gather per array for the whole step: sorted by file position, chunk by chunk.
  file_.read_samples(config_.split, Field::inputs, inputs);
  file_.read_samples(config_.split, Field::targets, targets);
  errors.assign(replicas.size(), nullptr);
  for (std::size_t b = 0; b < replicas.size(); ++b) {
    try {
      check_samples(indices[b], [&](std::size_t k, Field field) {
        const std::span<const std::byte> bytes =
            field == Field::inputs ? batches[b].inputs.bytes : batches[b].targets.bytes;
        const std::size_t row = field == Field::inputs ? input_bytes : target_bytes;
        return bytes.subspan(k * row, row);
      });
    } catch (const DatasetError&) {
      errors[b] = std::current_exception();
    }
  }
  return batches;
}

void Loader::check_samples(
    std::span<const std::size_t> indices,
    const std::function<std::span<const std::byte>(std::size_t, Field)>& sample) const {
  if (!config_.check_finite) return;
  for (std::size_t k = 0; k < indices.size(); ++k) {
    // The file is mapped read-only for the loader's life: a sample found finite once stays so,
    // and later epochs skip the scan.
    std::atomic<bool>& checked = finite_checked_[indices[k]];
    if (checked.load(std::memory_order_relaxed)) continue;
    check_finite_sample(sample(k, Field::inputs), info_.inputs, config_.path, config_.split,
                        Field::inputs, indices[k]);
    check_finite_sample(sample(k, Field::targets), info_.targets, config_.path, config_.split,
                        Field::targets, indices[k]);
    checked.store(true, std::memory_order_relaxed);
  }
}

bool Loader::serves_views() const {
  return file_.preloaded(config_.split) && file_.reads_directly(config_.split, Field::inputs) &&
         file_.reads_directly(config_.split, Field::targets);
}

BatchView Loader::batch_view(std::size_t epoch, std::size_t step, std::size_t replica) const {
  check_position(step, replica);
  if (!serves_views()) {
    throw std::logic_error("loader: batch_view on '" + config_.path + "' split '" + config_.split +
                           "', which is compressed or was not preloaded; use batch()");
  }
  const std::vector<std::size_t> indices = batch_indices(*epoch_order(epoch), step, replica);
  BatchView view;
  view.epoch = epoch;
  view.step = step;
  view.replica = replica;
  for (const auto& [array, spec, field] :
       {std::tuple{&view.inputs, &info_.inputs, Field::inputs},
        std::tuple{&view.targets, &info_.targets, Field::targets}}) {
    array->dtype = spec->dtype;
    array->shape = batch_shape(*spec);
    file_.mapped_samples(config_.split, field, indices, array->samples);
  }
  check_samples(indices, [&](std::size_t k, Field field) {
    return field == Field::inputs ? view.inputs.samples[k] : view.targets.samples[k];
  });
  return view;
}

void Loader::read_ahead(std::size_t epoch, const std::vector<std::size_t>& order,
                        std::size_t from) const {
  // Positions [from, to): this step's and a window beyond (no overflow for huge windows).
  const std::size_t ahead =
      std::min(config_.shuffle_window, order.size()) + config_.samples_per_step * config_.replicas;
  const std::size_t to = from + std::min(ahead, order.size() - std::min(from, order.size()));
  std::vector<std::size_t> blocks;
  {
    std::lock_guard<std::mutex> guard(read_ahead_mutex_);
    ReadAhead& state = read_ahead_state_;
    if (state.epoch != epoch + 1) {
      state.epoch = epoch + 1;
      state.reached = 0;
    }
    // Positions an earlier step of this epoch has scanned are skipped: each step scans about
    // one global batch of new positions, not the whole window again.
    for (std::size_t p = std::max(from, state.reached); p < to; ++p) {
      const std::size_t block = order[p] / kShuffleBlockSamples;
      if (state.block_epoch[block] == epoch + 1) continue;
      state.block_epoch[block] = epoch + 1;
      blocks.push_back(block);
    }
    state.reached = std::max(state.reached, to);
  }
  // In file order: the device reads them as one pass over that stretch of the file.
  std::sort(blocks.begin(), blocks.end());
  for (const std::size_t block : blocks) {
    const std::size_t first = block * kShuffleBlockSamples;
    file_.read_ahead(config_.split, first, std::min(kShuffleBlockSamples, info_.samples - first));
  }
}

std::vector<std::size_t> Loader::batch_indices(const std::vector<std::size_t>& order,
                                               std::size_t step, std::size_t replica) const {
  const std::size_t per_batch = config_.samples_per_step;
  std::vector<std::size_t> indices(per_batch);
  for (std::size_t k = 0; k < per_batch; ++k)
    indices[k] = order[(step * per_batch + k) * config_.replicas + replica];
  return indices;
}

std::vector<std::size_t> Loader::batch_shape(const ArraySpec& spec) const {
  std::vector<std::size_t> shape{config_.samples_per_step};
  shape.insert(shape.end(), spec.sample_shape.begin(), spec.sample_shape.end());
  return shape;
}

std::vector<std::byte> Loader::take_buffer(std::size_t bytes) const {
  {
    std::lock_guard<std::mutex> guard(spare_mutex_);
    for (auto it = spare_.begin(); it != spare_.end(); ++it) {
      if (it->size() == bytes) {
        std::vector<std::byte> buffer = std::move(*it);
        *it = std::move(spare_.back());
        spare_.pop_back();
        return buffer;
      }
    }
  }
  return std::vector<std::byte>(bytes);
}

void Loader::recycle(Batch&& batch) const {
  // Enough for the prefetch window and the batches the feeders hold, both arrays.
  const std::size_t keep = 2 * config_.replicas * (config_.prefetch_steps + 2);
  std::lock_guard<std::mutex> guard(spare_mutex_);
  for (HostArray* array : {&batch.inputs, &batch.targets}) {
    if (array->bytes.empty() || spare_.size() >= keep) continue;
    spare_.push_back(std::move(array->bytes));
    array->bytes.clear();
  }
}

std::vector<std::size_t> Loader::served_replicas() const {
  const std::size_t count = config_.served_replicas > 0 ? config_.served_replicas
                                                        : config_.replicas - config_.first_replica;
  std::vector<std::size_t> out(count);
  std::iota(out.begin(), out.end(), config_.first_replica);
  return out;
}

Batch Loader::batch(std::size_t epoch, std::size_t step, std::size_t replica) const {
  check_position(step, replica);
  start_prefetcher();
  if (prefetcher_) {
    Batch batch;
    if (prefetcher_->take(static_cast<std::uint64_t>(epoch) * steps_per_epoch_ + step, replica,
                          batch)) {
      std::lock_guard<std::mutex> guard(stats_mutex_);
      ++stats_.prefetched;
      return batch;
    }
  }
  {
    std::lock_guard<std::mutex> guard(stats_mutex_);
    ++stats_.synchronous;
  }
  const std::size_t replicas[] = {replica};
  std::vector<std::exception_ptr> errors;
  std::vector<Batch> batches = read_batches(epoch, step, replicas, errors);
  if (errors[0]) std::rethrow_exception(errors[0]);
  return std::move(batches[0]);
}

}  // namespace ipupod::host
