// A small fixed pool of threads that runs index ranges in parallel, for executing the vertices
// of a compute set. Work is split into contiguous ranges, so results never depend on timing.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ipupod::ipu {

class ThreadPool {
 public:
  explicit ThreadPool(unsigned threads);  // threads <= 1: everything runs on the caller
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned threads() const { return static_cast<unsigned>(workers_.size()) + 1; }
  // Calls fn(begin, end) on disjoint ranges covering [0, n); returns when all are done and
  // rethrows the first exception any range threw.
  void parallel_for(std::size_t n, const std::function<void(std::size_t, std::size_t)>& fn);

 private:
  void worker(unsigned index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::function<void(std::size_t, std::size_t)>* job_ = nullptr;
  std::size_t job_size_ = 0;
  std::uint64_t generation_ = 0;
  unsigned pending_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace ipupod::ipu
