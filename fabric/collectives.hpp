// Collectives over any Transport: all-reduce, reduce-scatter, all-gather (float32 and float16),
// broadcast and barrier, with ring, bidirectional-ring and hierarchical algorithms, each
// reporting its predicted time on a real topology. Every rank of the transport must call the
// same collective with the same sizes and options.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "fabric/topology.hpp"
#include "fabric/transport.hpp"
#include "float16/half.hpp"

namespace ipupod::fabric {

enum class ReduceOp { sum, mean, max };
enum class DataType { float32, float16 };
enum class Collective { all_reduce, reduce_scatter, all_gather, broadcast, barrier };

// How a collective moves its data.
//  ring: one ring in rank order; the buffer is cut into one block per rank.
//  bidirectional_ring: each block is halved; first halves go round the ring clockwise, second
//    halves anticlockwise, at the same time (on IPU-Links both directions of a link carry data).
//  hierarchical (all_reduce only): reduce-scatter inside each machine, then the same across
//    machines of a pod, then across pods, each on the block the previous level left; then
//    all-gather back out. Needs the same number of participants on every machine (and the same
//    number of machines in every pod) and a topology in the options.
//  tree (broadcast only): binomial tree; broadcast's ring is scatter + ring all-gather.
//  dissemination (barrier only).
//  automatic: the fastest predicted on the options' topology; without one: ring (measured on
//    one node, the two lanes of bidirectional_ring bring nothing there), and for broadcast the
//    tree below 256 KiB, the ring above.
enum class Algorithm { automatic, ring, bidirectional_ring, hierarchical, tree, dissemination };

// Tags the collectives use; point-to-point traffic of callers must use tags below these.
namespace collective_tags {
inline constexpr int first_reserved = 32000;
inline constexpr int broadcast = 32003;
inline constexpr int barrier = 32004;
}  // namespace collective_tags

// 1 MiB: large messages are cut into segments of this size so that the reduction of one
// segment overlaps the transfer of the next (chosen by measurement, see bench allreduce).
inline constexpr std::size_t kDefaultSegmentBytes = std::size_t{1} << 20;

struct CollectiveOptions {
  Algorithm algorithm = Algorithm::automatic;
  // Where the participants sit. With a topology every collective predicts its time on the real
  // links, advances the transport's model clock by it, and may pick the hierarchical algorithm.
  const Topology* topology = nullptr;  // not owned
  // ipus[r] is the IPU of transport rank r on the topology; empty means rank r is IPU r.
  std::vector<int> ipus;
  // Largest message on the wire; > 0. Smaller segments overlap more, larger ones cost less
  // per-message overhead.
  std::size_t segment_bytes = kDefaultSegmentBytes;
};

struct CollectiveReport {
  Collective collective = Collective::all_reduce;
  Algorithm algorithm = Algorithm::ring;  // the one that ran (never automatic)
  int participants = 0;
  std::size_t bytes = 0;           // size of the whole buffer on one rank
  double predicted_seconds = 0.0;  // on the topology's links; 0 without a topology
};

// The algorithm a collective would choose and its predicted time, without running it (the
// estimator uses this). `elements` is the whole buffer's length on one rank (for broadcast:
// bytes, type ignored). FabricError for an algorithm the collective does not have.
CollectiveReport predict(Collective collective, DataType type, std::size_t elements,
                         int participants, const CollectiveOptions& options = {});

// Block r of a reduce-scatter / all-gather buffer (and the unit of a ring): chunk c of
// `participants` is elements [begin, end), the remainder spread over the first chunks.
struct RingChunk {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t size() const { return end - begin; }
};
RingChunk ring_chunk(std::size_t length, int participants, int chunk);

// Every rank ends with the element-wise reduction of all ranks' buffers, bitwise identical on
// every rank and run after run. Order of operations (x_r = rank r's value, a op b with the
// partial result on the left, indices mod n):
//  ring: an element of block c is reduced as ((x_{c+1} op x_{c+2}) op ...) op x_c.
//  bidirectional_ring: first half of block c as ring; second half ((x_{c-1} op x_{c-2}) ...) op
//  x_c. hierarchical: each level reduces like ring over that level's ring of partial results; the
//    rings are the machines (IPUs in IPU order), then the machines of a pod, then the pods.
// Mean divides the sum by n once at the end. float16 buffers are widened to float32, reduced
// in float32 (partial results travel as float32) and rounded once to nearest even.
CollectiveReport all_reduce(Transport& t, std::span<float> data, ReduceOp op,
                            const CollectiveOptions& options = {});
CollectiveReport all_reduce(Transport& t, std::span<float16::Half> data, ReduceOp op,
                            const CollectiveOptions& options = {});

// Rank r receives block r (ring_chunk(input.size(), n, r)) of the reduction, with the order of
// operations of all_reduce (ring or bidirectional_ring). `block` must have that block's size.
CollectiveReport reduce_scatter(Transport& t, std::span<const float> input, std::span<float> block,
                                ReduceOp op, const CollectiveOptions& options = {});
CollectiveReport reduce_scatter(Transport& t, std::span<const float16::Half> input,
                                std::span<float16::Half> block, ReduceOp op,
                                const CollectiveOptions& options = {});

// Every rank ends with `output` = the concatenation of every rank's block; rank r's block is
// ring_chunk(output.size(), n, r) and `block` must have that size (ring or bidirectional_ring).
CollectiveReport all_gather(Transport& t, std::span<const float> block, std::span<float> output,
                            const CollectiveOptions& options = {});
CollectiveReport all_gather(Transport& t, std::span<const float16::Half> block,
                            std::span<float16::Half> output, const CollectiveOptions& options = {});

// Copies data of `root` into data of every rank; sizes must agree (tree or ring).
CollectiveReport broadcast(Transport& t, std::span<std::byte> data, int root,
                           const CollectiveOptions& options = {});

// Returns on every rank only after every rank has entered (dissemination, ceil(log2 n) rounds).
// The predicted time is the topology's cross-IPU sync cost (predict_barrier_seconds).
CollectiveReport barrier(Transport& t, const CollectiveOptions& options = {});

// Collectives keep their receive buffers and float32 working copies between calls (per
// thread), because fresh large allocations cost page faults on every call; this frees them.
void release_collective_buffers();

const char* to_string(ReduceOp op);
const char* to_string(Algorithm algorithm);
const char* to_string(Collective collective);
const char* to_string(DataType type);
// "automatic", "ring", "bidirectional_ring", ...; FabricError listing the names otherwise.
Algorithm algorithm_from_string(std::string_view name);

}  // namespace ipupod::fabric
