// What the host instances of a job (--host-instances) pass to instance 0 over MPI: each serves
// its own replicas' streams, and instance 0 sees every replica's losses, evaluation outputs,
// cycles, reports and weights in replica order, as one host would have received them.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "host/host_array.hpp"

namespace ipupod::pod {

// Collective over the host instances' communicator (instance i is its rank i): every instance
// gives the same number of values; instance 0 gets them all, in instance order (the others get
// an empty vector). With one instance, the values themselves.
std::vector<float> gather_to_first(MPI_Comm hosts, std::span<const float> values);
std::vector<std::uint64_t> gather_to_first(MPI_Comm hosts, std::span<const std::uint64_t> values);

// Arrays (evaluation outputs and the samples they are scored on) as one message, and back.
std::string pack_arrays(const std::vector<const host::HostArray*>& arrays);
std::vector<host::HostArray> unpack_arrays(const std::string& packed);

// Bytes (a weight tensor) from one rank to another, the length found on arrival.
void send_bytes(std::span<const std::byte> bytes, int to, int tag, MPI_Comm comm);
std::vector<std::byte> receive_bytes(int from, int tag, MPI_Comm comm);

}  // namespace ipupod::pod
