// An in-process stand-in for the fabric between emulated IPUs in tests: point-to-point
// messages and external syncs, bound to engines through ipu::CollectiveBinding.
#pragma once

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "ipu_process/engine.hpp"

namespace ipupod::testing_support {

using ipu::CollectiveBinding;

// Messages between the devices of one test, and a sync of all of them that returns the
// latest clock: what the pod binds to MPI, in one process.
class Mailbox {
 public:
  explicit Mailbox(unsigned parties) : parties_(parties) {}
  void send(unsigned to, unsigned tag, std::span<const std::byte> data) {
    std::lock_guard lock(mutex_);
    queues_[{to, tag}].emplace_back(data.begin(), data.end());
    cv_.notify_all();
  }
  void receive(unsigned self, unsigned tag, std::span<std::byte> data) {
    std::unique_lock lock(mutex_);
    auto& q = queues_[{self, tag}];
    cv_.wait(lock, [&] { return !q.empty(); });
    if (q.front().size() != data.size()) throw std::runtime_error("mailbox: message size differs");
    std::memcpy(data.data(), q.front().data(), data.size());
    q.pop_front();
  }
  std::uint64_t sync(std::uint64_t clock) {
    std::unique_lock lock(mutex_);
    const unsigned generation = generation_;
    latest_ = std::max(latest_, clock);
    if (++arrived_ == parties_) {
      result_ = latest_;
      arrived_ = 0, latest_ = 0, ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
    return result_;
  }
  CollectiveBinding binding(unsigned self) {
    CollectiveBinding b;
    b.send = [this](unsigned peer, unsigned tag, std::span<const std::byte> d) {
      send(peer, tag, d);
    };
    b.receive = [this, self](unsigned, unsigned tag, std::span<std::byte> d) {
      receive(self, tag, d);
    };
    b.predict_transfer_seconds = [](unsigned, std::size_t bytes) {
      return static_cast<double>(bytes) * 1e-9;
    };
    b.external_sync = [this](std::uint64_t clock) { return sync(clock); };
    return b;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::pair<unsigned, unsigned>, std::deque<std::vector<std::byte>>> queues_;
  unsigned parties_, arrived_ = 0, generation_ = 0;
  std::uint64_t latest_ = 0, result_ = 0;
};

}  // namespace ipupod::testing_support
