// Collective test bodies written once against Transport&, run by the loopback harness
// (threads) and by the MPI harness (processes). Each rank calls the same case.
#pragma once

#include <cstddef>
#include <vector>

#include "fabric/collectives.hpp"
#include "fabric/transport.hpp"

namespace ipupod::fabric::testing {

// The value rank `rank` contributes at element i: varied signs and magnitudes, so a change
// in the order of additions changes the bits of the result. float16 cases use its rounding.
float input_value(int rank, std::size_t i);

// Rings of one stage of a plan (transport ranks in ring order); a plan is a list of stages.
using Rings = std::vector<std::vector<int>>;

// The result the collectives document, computed serially: each stage reduce-scatters over its
// rings (a block is folded starting at the position after its owner), `lanes` 2 meaning the
// second half of every block goes round the reversed rings. float16: inputs rounded to
// float16, reduced in float32, result rounded once.
std::vector<float> reference_all_reduce(int participants, std::size_t length, ReduceOp op,
                                        DataType type, const std::vector<Rings>& stages, int lanes);
// The single-ring plan of `algorithm` (ring or bidirectional_ring) over ranks 0..n-1.
std::vector<Rings> flat_plan(int participants);
int lanes_of(Algorithm algorithm);

struct CaseOptions {
  DataType type = DataType::float32;
  CollectiveOptions collective;
  std::vector<Rings> stages;  // the plan the algorithm runs; empty = flat ring
};

// all_reduce equals the reference bitwise on every rank, and every rank holds the same bits.
void check_all_reduce(Transport& t, std::size_t length, ReduceOp op, const CaseOptions& options);
// Rank r's block of reduce_scatter equals the same block of the all-reduce reference.
void check_reduce_scatter(Transport& t, std::size_t length, ReduceOp op,
                          const CaseOptions& options);
// all_gather puts every rank's block in place on every rank.
void check_all_gather(Transport& t, std::size_t length, const CaseOptions& options);
// broadcast from `root` (reduced mod size) reaches every rank; sizes 0, 1, 1000 and 1 MiB.
void check_broadcast(Transport& t, int root, Algorithm algorithm);
// Nobody leaves the barrier before the last rank (which arrives late on purpose) entered.
void check_barrier(Transport& t);

// Every collective, op, type and both ring algorithms at the given lengths; small segments
// so that blocks are cut into many pipelined messages.
void check_every_collective(Transport& t, std::span<const std::size_t> lengths);

}  // namespace ipupod::fabric::testing
