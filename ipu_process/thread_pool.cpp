// ThreadPool: workers wait for a generation counter to change, run their range, report done.
#include "ipu_process/thread_pool.hpp"

#include <algorithm>
#include <cstdint>

namespace ipupod::ipu {

ThreadPool::ThreadPool(unsigned threads) {
  for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
std::pair<std::size_t, std::size_t> range_of(std::size_t n, unsigned parts, unsigned index) {
  const std::size_t per = (n + parts - 1) / parts;
  return {std::min(n, index * per), std::min(n, (index + 1) * per)};
}
}  // namespace

void ThreadPool::parallel_for(std::size_t n,
                              const std::function<void(std::size_t, std::size_t)>& fn) {
  if (workers_.empty() || n < 2) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_size_ = n;
    pending_ = static_cast<unsigned>(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  start_.notify_all();
  std::exception_ptr mine;
  try {
    const auto [b, e] = range_of(n, threads(), 0);
    fn(b, e);
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::worker(unsigned index) {
  std::uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lock(mutex_);
    start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    const auto* job = job_;
    const auto [b, e] = range_of(job_size_, threads(), index);
    lock.unlock();
    try {
      (*job)(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> guard(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    lock.lock();
    if (--pending_ == 0) done_.notify_all();
  }
}

}  // namespace ipupod::ipu
