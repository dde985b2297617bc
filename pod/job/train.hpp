// `ipupod train`: rank 0 plays the host (data, streams, reports), ranks 1..R*S the IPUs.
#pragma once

#include <mpi.h>

#include <string>

#include "pod/config.hpp"

namespace ipupod::pod {

// Runs this rank's role; returns the process exit code (0, 1 runtime failure, 2 bad input).
// Runtime failures after start-up abort the whole MPI job so no rank is left waiting.
int run_train(const TrainConfig& config, MPI_Comm world);

int run_host(const TrainConfig& config, MPI_Comm world);
// Prints what failed on this rank and ends the whole MPI job at once (exit code 1). Called
// where the failure happens, before any clean-up could make a peer fail first and hide the cause.
[[noreturn]] void abort_job(MPI_Comm world, const std::string& what);
int run_ipu(const TrainConfig& config, MPI_Comm world);

}  // namespace ipupod::pod
