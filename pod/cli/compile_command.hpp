// `ipupod compile`: compiles each pipeline stage of a zoo model (rank r of the world takes
// stages r, r + size, ...), gathers the reports on rank 0, writes and prints them.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

#include "pod/compiler/stage_compile.hpp"

namespace ipupod::pod {

// Rank 0 writes memory.json and compile.json into the run directory and prints the report.
// Returns the exit code: 0 every stage fits; 1 a stage does not fit (as training would fail:
// the report is written all the same) or the compile failed; 2 bad usage.
int run_compile(const CompileConfig& config, MPI_Comm world);

// For the commands that spread stages over the ranks (compile, estimate): the world's rank and
// size; the options checked by `check` (on a UsageError rank 0 prints "ipupod COMMAND: what"
// and usage_status returns 2, else 0); and the end of every rank after one rank's failure.
struct Ranks {
  int rank = 0, size = 1;
};
Ranks ranks_of(MPI_Comm world);
int usage_status(const Ranks& ranks, const char* command, const std::function<void()>& check);
[[noreturn]] void abort_command(MPI_Comm world, const char* command, const std::string& what);

// The threads each rank of `world` gives a stage's memory plan (CompileConfig::threads): the
// `asked` number (--threads), or when it is 0 the CPUs the rank may run on divided among the
// world's ranks on its machine, at least 1. Collective over `world`.
unsigned plan_threads(unsigned asked, MPI_Comm world);

}  // namespace ipupod::pod
