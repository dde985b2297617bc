// `ipupod bench NAME`: benchmark programs that print a ratio against a named peer measured in
// the same run. Each adds its own subcommand under `bench`; `exit_code` receives its result.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <exception>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli_checks/option_checks.hpp"

namespace ipupod::pod {

using cli::finite_number;
using cli::whole_number;

// Bounds of the benchmarks' counts, checked on the option's text (cli_checks): sizes and samples,
// repetitions and look-ahead depths, threads and clients.
inline constexpr std::uint64_t kMaxBenchCount = 2147483647;
inline constexpr std::uint64_t kMaxBenchRounds = 1000000;
inline constexpr std::uint64_t kMaxBenchThreads = 4096;

// Seconds from `start` to now on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The median of the values (the mean of the middle two of an even count); values not empty.
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Runs a benchmark's body for its subcommand's callback: its result, or exit 2 for bad input
// (std::invalid_argument) and 1 for any other failure, with the reason on stderr.
template <class Run>
int run_bench(Run&& run) {
  try {
    return run();
  } catch (const std::invalid_argument& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}

// A benchmark's peer script: `given` (the value of `option`), else scripts/FILE in a folder
// above the executable (build trees inside the sources) or share/ipupod/FILE of an install
// tree, else in the sources this binary was built from; std::invalid_argument if none is.
std::string find_peer_script(const std::string& file, const std::string& given,
                             const std::string& option);

// Host input: decoding and augmenting real PNG/JPEG images as a data loader's workers do, vs
// Pillow and NumPy in as many processes (scripts/bench_input_pil.py).
void add_input_bench(CLI::App& bench, int& exit_code);
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
