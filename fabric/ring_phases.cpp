// The ring engine: each lane is a small state machine (post, wait for a segment, process it,
// post what depends on it), and the lanes of a phase advance step by step in turn.
#include "fabric/ring_phases.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>

namespace ipupod::fabric::impl {
namespace {

int wrap(int value, int size) {
  return ((value % size) + size) % size;
}

std::size_t segment_count(const Range& block, std::size_t segment_elements) {
  return (block.size() + segment_elements - 1) / segment_elements;
}

Range segment_of(const Range& block, std::size_t k, std::size_t segment_elements) {
  const std::size_t begin = block.begin + k * segment_elements;
  return {begin, std::min(block.end, begin + segment_elements)};
}

// Adds (or maxes) one block of 8: a fixed trip count over non-aliasing pointers, which the
// compiler turns into vector instructions even at -O2 (where loops of unknown length with
// possible aliasing stay scalar).
constexpr std::size_t kFoldBlock = 8;
template <typename Op>
void fold_with(float* __restrict acc, const float* __restrict incoming, std::size_t n, Op op) {
  std::size_t i = 0;
  for (; i + kFoldBlock <= n; i += kFoldBlock) {
    for (std::size_t k = 0; k < kFoldBlock; ++k) acc[i + k] = op(incoming[i + k], acc[i + k]);
  }
  for (; i < n; ++i) acc[i] = op(incoming[i], acc[i]);
}

void fold(std::span<float> acc, std::span<const float> incoming, ReduceOp op) {
  // The incoming partial result is the left operand: ((x_a op x_b) op x_c) ...
  if (op == ReduceOp::max) {
    fold_with(acc.data(), incoming.data(), acc.size(),
              [](float left, float right) { return std::max(left, right); });
  } else {
    fold_with(acc.data(), incoming.data(), acc.size(),
              [](float left, float right) { return left + right; });
  }
}

class LaneMachine {
 public:
  virtual ~LaneMachine() = default;
  virtual void start() = 0;
  // Handles every segment of the lane's current ring step, forwarding each as it lands; false
  // once the lane has no steps left. Lanes advance a whole step in turn: a rank's step s needs
  // only its neighbours' step s-1, so by induction over steps no lane waits forever.
  virtual bool advance() = 0;
  virtual void finish() = 0;
};

class ReduceLane final : public LaneMachine {
 public:
  ReduceLane(Transport& t, const Lane& lane, int lane_index, std::span<float> acc, ReduceOp op,
             std::size_t segment_elements)
      : t_(t),
        lane_(lane),
        acc_(acc),
        op_(op),
        segment_elements_(segment_elements),
        size_(static_cast<int>(lane.members.size())),
        right_(lane.members[static_cast<std::size_t>(wrap(lane.position + 1, size_))]),
        left_(lane.members[static_cast<std::size_t>(wrap(lane.position - 1, size_))]) {
    std::size_t largest = 0;
    for (const Range& block : lane.blocks) largest = std::max(largest, block.size());
    if (size_ > 1) {
      scratch_[0] = scratch(lane_index * 2, largest);
      scratch_[1] = scratch(lane_index * 2 + 1, largest);
    }
  }

  void start() override {
    if (size_ < 2) return;
    post_receives(0);
    if (steps() > 1) post_receives(1);
    const Range block = send_block(0);
    for (std::size_t k = 0; k < segment_count(block, segment_elements_); ++k) {
      post_send(segment_of(block, k, segment_elements_));
    }
  }

  bool advance() override {
    if (step_ >= steps()) return false;
    const Range block = receive_block(step_);
    auto& requests = receives_[static_cast<std::size_t>(step_ % 2)];
    const std::span<const float> buffer = scratch_[static_cast<std::size_t>(step_ % 2)];
    for (std::size_t k = 0; k < segment_count(block, segment_elements_); ++k) {
      const Range segment = segment_of(block, k, segment_elements_);
      t_.wait(requests[k]);
      fold(acc_.subspan(segment.begin, segment.size()),
           buffer.subspan(segment.begin - block.begin, segment.size()), op_);
      // The block just reduced is what the next step sends on.
      if (step_ + 1 < steps()) post_send(segment);
    }
    ++step_;
    if (step_ + 1 < steps()) post_receives(step_ + 1);
    return step_ < steps();
  }

  void finish() override { t_.wait_all(sends_); }

 private:
  int steps() const { return size_ - 1; }
  const Range& send_block(int step) const {
    return lane_.blocks[static_cast<std::size_t>(wrap(lane_.position - step - 1, size_))];
  }
  const Range& receive_block(int step) const {
    return lane_.blocks[static_cast<std::size_t>(wrap(lane_.position - step - 2, size_))];
  }

  void post_receives(int step) {
    const Range block = receive_block(step);
    const std::span<float> buffer = scratch_[static_cast<std::size_t>(step % 2)];
    auto& requests = receives_[static_cast<std::size_t>(step % 2)];
    requests.clear();
    for (std::size_t k = 0; k < segment_count(block, segment_elements_); ++k) {
      const Range segment = segment_of(block, k, segment_elements_);
      auto target = buffer.subspan(segment.begin - block.begin, segment.size());
      requests.push_back(t_.irecv(left_, std::as_writable_bytes(target), lane_.tag));
    }
  }

  void post_send(const Range& segment) {
    sends_.push_back(
        t_.isend(right_, std::as_bytes(acc_.subspan(segment.begin, segment.size())), lane_.tag));
  }

  Transport& t_;
  const Lane& lane_;
  std::span<float> acc_;
  ReduceOp op_;
  std::size_t segment_elements_;
  int size_;
  int right_;
  int left_;
  std::array<std::span<float>, 2> scratch_;  // receive buffers of even and odd steps
  std::array<std::vector<Request>, 2> receives_;
  std::vector<Request> sends_;
  int step_ = 0;
};

class GatherLane final : public LaneMachine {
 public:
  GatherLane(Transport& t, const Lane& lane, std::span<std::byte> data, std::size_t element_bytes,
             std::size_t segment_elements)
      : t_(t),
        lane_(lane),
        data_(data),
        element_bytes_(element_bytes),
        segment_elements_(segment_elements),
        size_(static_cast<int>(lane.members.size())),
        right_(lane.members[static_cast<std::size_t>(wrap(lane.position + 1, size_))]),
        left_(lane.members[static_cast<std::size_t>(wrap(lane.position - 1, size_))]) {}

  void start() override {
    if (size_ < 2) return;
    // Every block lands in its own place, so all receives can be posted at once.
    for (int step = 0; step < size_ - 1; ++step) {
      const Range block = block_at(lane_.position - step - 1);
      for (std::size_t k = 0; k < segment_count(block, segment_elements_); ++k) {
        const Range segment = segment_of(block, k, segment_elements_);
        receives_.push_back({step, segment, t_.irecv(left_, bytes(segment), lane_.tag)});
      }
    }
    const Range own = block_at(lane_.position);
    for (std::size_t k = 0; k < segment_count(own, segment_elements_); ++k) {
      post_send(segment_of(own, k, segment_elements_));
    }
  }

  bool advance() override {
    if (step_ >= size_ - 1) return false;
    for (; next_ < receives_.size() && receives_[next_].step == step_; ++next_) {
      Pending& pending = receives_[next_];
      t_.wait(pending.request);
      if (step_ + 1 < size_ - 1) post_send(pending.segment);
    }
    ++step_;
    return step_ < size_ - 1;
  }

  void finish() override { t_.wait_all(sends_); }

 private:
  struct Pending {
    int step;
    Range segment;
    Request request;
  };

  const Range& block_at(int position) const {
    return lane_.blocks[static_cast<std::size_t>(wrap(position, size_))];
  }
  std::span<std::byte> bytes(const Range& segment) const {
    return data_.subspan(segment.begin * element_bytes_, segment.size() * element_bytes_);
  }
  void post_send(const Range& segment) {
    sends_.push_back(t_.isend(right_, bytes(segment), lane_.tag));
  }

  Transport& t_;
  const Lane& lane_;
  std::span<std::byte> data_;
  std::size_t element_bytes_;
  std::size_t segment_elements_;
  int size_;
  int right_;
  int left_;
  std::vector<Pending> receives_;
  std::size_t next_ = 0;
  int step_ = 0;
  std::vector<Request> sends_;
};

void run(std::vector<std::unique_ptr<LaneMachine>>& machines) {
  for (auto& machine : machines) machine->start();
  bool busy = true;
  while (busy) {
    busy = false;
    for (auto& machine : machines) busy = machine->advance() || busy;
  }
  for (auto& machine : machines) machine->finish();
}

}  // namespace

namespace {
std::array<std::vector<float>, kWorkingCopySlot + 1>& scratch_pool() {
  thread_local std::array<std::vector<float>, kWorkingCopySlot + 1> pool;
  return pool;
}
}  // namespace

void release_scratch() {
  for (auto& buffer : scratch_pool()) std::vector<float>().swap(buffer);
}

std::span<float> scratch(int slot, std::size_t elements) {
  auto& buffer = scratch_pool().at(static_cast<std::size_t>(slot));
  if (buffer.size() < elements) {
    buffer.clear();
    buffer.shrink_to_fit();
    buffer.resize(elements);
  }
  return std::span<float>(buffer).first(elements);
}

void reduce_phase(Transport& t, std::span<const Lane> lanes, std::span<float> acc, ReduceOp op,
                  std::size_t segment_elements) {
  std::vector<std::unique_ptr<LaneMachine>> machines;
  for (std::size_t i = 0; i < lanes.size(); ++i) {
    machines.push_back(
        std::make_unique<ReduceLane>(t, lanes[i], static_cast<int>(i), acc, op, segment_elements));
  }
  run(machines);
}

void gather_phase(Transport& t, std::span<const Lane> lanes, std::span<std::byte> data,
                  std::size_t element_bytes, std::size_t segment_elements) {
  std::vector<std::unique_ptr<LaneMachine>> machines;
  for (const Lane& lane : lanes) {
    machines.push_back(
        std::make_unique<GatherLane>(t, lane, data, element_bytes, segment_elements));
  }
  run(machines);
}

}  // namespace ipupod::fabric::impl
