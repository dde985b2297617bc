// Validators of the numeric options of `ipupod train` and `compile`: a count is a whole decimal
// number within its bounds and a real number is finite and within its range, checked on the
// option's text before CLI11 converts it (which would wrap -1 or 2^64 into a huge unsigned).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>

namespace ipupod::pod {

// A whole decimal number in [min, max], rewritten without leading zeros (CLI11 would read
// "010" as octal).
CLI::Validator whole_number(std::uint64_t min,
                            std::uint64_t max = std::numeric_limits<std::uint64_t>::max());

// A finite real number in the range from min to max; each end is included unless it is open.
struct RealRange {
  double min = 0, max = std::numeric_limits<double>::max();
  bool min_open = false, max_open = false;
};
CLI::Validator finite_number(RealRange range);

}  // namespace ipupod::pod
