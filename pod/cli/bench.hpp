// `ipupod bench NAME`: benchmark programs that print a ratio against a named peer measured in
// the same run. Each adds its own subcommand under `bench`; `exit_code` receives its result.
#pragma once

#include <CLI/CLI.hpp>

namespace ipupod::pod {

// Fabric all-reduce vs Open MPI's MPI_Allreduce on the same ranks (run under mpirun).
void add_allreduce_bench(CLI::App& bench, int& exit_code);
// Host streaming of a real data set to N IPU clients vs a plain sequential HDF5 read loop.
void add_host_bench(CLI::App& bench, int& exit_code);
// A float32 GEMM on one emulated IPU vs OpenBLAS cblas_sgemm; compile time of ResNet-50's layers.
void add_matmul_bench(CLI::App& bench, int& exit_code);
// One training step of a zoo model on one emulated IPU vs the same step in PyTorch (a child
// process, scripts/bench_step_torch.py) on the same threads.
void add_step_bench(CLI::App& bench, int& exit_code);

}  // namespace ipupod::pod
