// Collective test bodies written once against Transport&, run by the loopback harness
// (threads) and by the MPI harness (processes). Each rank calls the same case.
#pragma once

#include <cstddef>
#include <vector>

#include "fabric/collectives.hpp"
#include "fabric/transport.hpp"

namespace ipupod::fabric::testing {

// The value rank `rank` contributes at element i: varied signs and magnitudes, so a change
// in the order of additions changes the bits of the result.
float input_value(int rank, std::size_t i);
// The all-reduce result computed serially in the order all_reduce documents.
std::vector<float> reference_all_reduce(int participants, std::size_t length, ReduceOp op);

// all_reduce equals the reference bitwise on every rank, and every rank holds the same bits.
void check_all_reduce(Transport& t, std::size_t length, ReduceOp op);
// broadcast from `root` (reduced mod size) reaches every rank; sizes 0, 1, 1000 and 1 MiB.
void check_broadcast(Transport& t, int root);
// Nobody leaves the barrier before the last rank (which arrives late on purpose) entered.
void check_barrier(Transport& t);

}  // namespace ipupod::fabric::testing
