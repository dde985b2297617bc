// Validators of the numeric options of every ipupod command: a count is a whole decimal number
// within its bounds and a real number is finite and within its range, checked on the option's
// text before CLI11 converts it (which would wrap -1 or 2^64 into a huge unsigned).
// Header-only, for the commands of pod/cli and datasets alike.
#pragma once

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>

namespace ipupod::cli {

// A finite real number in the range from min to max; each end is included unless it is open.
struct RealRange {
  double min = 0, max = std::numeric_limits<double>::max();
  bool min_open = false, max_open = false;
};

// whole_number(min, max): a whole decimal number in [min, max], rewritten without leading zeros
// (CLI11 would read "010" as octal). finite_number(range): a finite real number in range.

namespace detail {

inline std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace detail

inline CLI::Validator whole_number(
    std::uint64_t min, std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) {
  const std::string bounds = "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
  return CLI::Validator(
      [min, max, bounds](std::string& text) -> std::string {
        const std::string expected =
            "expected a whole number in " + bounds + ", got '" + text + "'";
        if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
          return expected + (text.starts_with('-') ? " (it cannot be negative)" : "");
        const std::size_t first = std::min(text.find_first_not_of('0'), text.size() - 1);
        const std::string digits = text.substr(first);
        // Past 20 digits, or past 2^64 - 1 at 20, the number cannot be in range.
        errno = 0;
        const unsigned long long value = std::strtoull(digits.c_str(), nullptr, 10);
        if (digits.size() > 20 || errno == ERANGE || value < min || value > max) return expected;
        text = digits;
        return {};
      },
      "INT in " + bounds, "whole_number");
}

inline CLI::Validator finite_number(RealRange r) {
  const std::string range =
      std::string(r.min_open ? "(" : "[") + detail::number_text(r.min) + ", " +
      (r.max == std::numeric_limits<double>::max() ? std::string("inf)")
                                                   : detail::number_text(r.max) + (r.max_open ? ")" : "]"));
  return CLI::Validator(
      [r, range](std::string& text) -> std::string {
        const std::string expected =
            "expected a finite number in " + range + ", got '" + text + "'";
        if (text.empty()) return expected;
        char* end = nullptr;
        errno = 0;
        const double value = std::strtod(text.c_str(), &end);
        if (end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(value))
          return expected;
        const bool above_min = r.min_open ? value > r.min : value >= r.min;
        const bool below_max = r.max_open ? value < r.max : value <= r.max;
        if (!above_min || !below_max) return expected;
        return {};
      },
      "FLOAT in " + range, "finite_number");
}

}  // namespace ipupod::cli
