// Internal to fabric: the pipelined ring engine the collectives are built from. A phase is
// one reduce-scatter or all-gather round of a ring over blocks of a buffer; several lanes
// (rings over different blocks) run at the same time.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "fabric/collectives.hpp"
#include "fabric/transport.hpp"

namespace ipupod::fabric::impl {

struct Range {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t size() const { return end - begin; }
};

// One ring: members are transport ranks in ring order (data flows from position p to p+1);
// blocks[p] is the block that ends up complete at position p after a reduce phase, and
// the one position p starts with in a gather phase.
struct Lane {
  std::vector<int> members;
  std::vector<Range> blocks;
  int position = 0;  // this rank's position in members
  int tag = 0;
};

// Scratch memory kept between collectives, per thread: slot 0..3 for the receive buffers of
// two lanes (even and odd steps), slot 4 for float32 working copies. Fresh large allocations
// are expensive (the first touch of every page faults; on a VM it can cost more than the
// transfer), and the same gradient sizes come back every training step.
std::span<float> scratch(int slot, std::size_t elements);
inline constexpr int kWorkingCopySlot = 4;
void release_scratch();  // this thread's

// Reduce-scatter round: after it, acc[blocks[position]] holds the reduction over the ring of
// that block, folded in ring order starting at position+1. Messages carry float32 partials
// cut into segments of at most segment_elements; segment k of step s is sent on as soon as
// it is reduced, so transfer and reduction overlap along the ring.
void reduce_phase(Transport& t, std::span<const Lane> lanes, std::span<float> acc, ReduceOp op,
                  std::size_t segment_elements);

// All-gather round over a buffer of elements of element_bytes each: every position ends with
// every block; received segments are forwarded as soon as they land.
void gather_phase(Transport& t, std::span<const Lane> lanes, std::span<std::byte> data,
                  std::size_t element_bytes, std::size_t segment_elements);

}  // namespace ipupod::fabric::impl
