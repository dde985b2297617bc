// `ipupod compile`: compiles each pipeline stage of a zoo model (rank r of the world takes
// stages r, r + size, ...), gathers the reports on rank 0, writes and prints them.
#pragma once

#include <mpi.h>

#include "pod/compiler/stage_compile.hpp"

namespace ipupod::pod {

// Rank 0 writes memory.json and compile.json into the run directory and prints the report.
// Returns the exit code: 0 every stage fits; 1 a stage does not fit (as training would fail:
// the report is written all the same) or the compile failed; 2 bad usage.
int run_compile(const CompileConfig& config, MPI_Comm world);

}  // namespace ipupod::pod
