// `ipupod data NAME`: one subcommand per converter of real data into ipupod's HDF5 layout.
#pragma once

#include <CLI/CLI.hpp>

namespace ipupod::datasets {

// Adds every converter as a subcommand of `data`; the chosen one runs in its parse callback
// and leaves its exit code (0, 1 runtime failure, 2 bad input) in exit_code.
void add_data_commands(CLI::App& data, int& exit_code);

}  // namespace ipupod::datasets
