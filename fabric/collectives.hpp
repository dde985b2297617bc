// Collectives over any Transport: ring all-reduce, binomial-tree broadcast, dissemination
// barrier. Every rank of the transport must call the same collective with the same arguments.
#pragma once

#include <cstddef>
#include <span>

#include "fabric/transport.hpp"

namespace ipupod::fabric {

enum class ReduceOp { sum, mean, max };

// Tags the collectives use; point-to-point traffic of callers should use tags below these.
namespace collective_tags {
inline constexpr int all_reduce_scatter = 32001;
inline constexpr int all_reduce_gather = 32002;
inline constexpr int broadcast = 32003;
inline constexpr int barrier = 32004;
}  // namespace collective_tags

// The part of a buffer a ring rank owns: chunk c of `participants` is elements
// [begin, end) with the remainder spread over the first chunks (sizes differ by at most one).
struct RingChunk {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t size() const { return end - begin; }
};
RingChunk ring_chunk(std::size_t length, int participants, int chunk);

// Ring all-reduce (reduce-scatter then all-gather) over every rank of the transport. Works
// for any participant count and any length (including 0 and lengths below the rank count).
// Deterministic: element i of chunk c (see ring_chunk) is reduced in ring order starting at
// rank c, i.e. ((x_c op x_{c+1}) op x_{c+2}) ... op x_{c-1} (indices mod n); for mean the
// sum is then divided by n once. All ranks end bitwise identical, run after run.
void all_reduce(Transport& t, std::span<float> data, ReduceOp op);

// Copies data of `root` into data of every rank (binomial tree); sizes must agree.
void broadcast(Transport& t, std::span<std::byte> data, int root);

// Returns on every rank only after every rank has entered (dissemination, ceil(log2 n) rounds).
void barrier(Transport& t);

const char* to_string(ReduceOp op);

}  // namespace ipupod::fabric
