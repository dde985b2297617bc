// Loader: epoch permutation, drop-last sharding across replicas, batch reads through DatasetFile.
// std::shuffle and std::uniform_int_distribution are implementation-defined, so we use our own.
#include "host/loader.hpp"

#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>

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

Loader::Loader(LoaderConfig config) : config_(std::move(config)), file_(config_.path) {
  info_ = file_.info(config_.split);
  if (config_.replicas == 0) throw DatasetError("loader: replicas must be at least 1");
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
}

std::shared_ptr<const std::vector<std::size_t>> Loader::epoch_order(std::size_t epoch) const {
  std::lock_guard<std::mutex> guard(cache_mutex_);
  if (!cached_order_ || cached_epoch_ != epoch) {
    std::vector<std::size_t> order;
    if (config_.shuffle) {
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

Batch Loader::batch(std::size_t epoch, std::size_t step, std::size_t replica) const {
  if (step >= steps_per_epoch_) {
    throw std::out_of_range("loader: step " + std::to_string(step) + " out of range (" +
                            std::to_string(steps_per_epoch_) + " steps per epoch)");
  }
  if (replica >= config_.replicas) {
    throw std::out_of_range("loader: replica " + std::to_string(replica) + " out of range (" +
                            std::to_string(config_.replicas) + " replicas)");
  }
  const auto order = epoch_order(epoch);
  std::vector<std::size_t> indices(config_.samples_per_step);
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const std::size_t position = step * config_.samples_per_step + k;
    indices[k] = (*order)[position * config_.replicas + replica];
  }
  Batch batch;
  batch.epoch = epoch;
  batch.step = step;
  batch.replica = replica;
  batch.inputs = file_.read_inputs(config_.split, indices);
  batch.targets = file_.read_targets(config_.split, indices);
  return batch;
}

}  // namespace ipupod::host
