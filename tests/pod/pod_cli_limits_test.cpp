// The numeric options of `ipupod train` and `ipupod compile` at and past their limits: every
// integer option with 0, -1, 2^31, 2^63 and 2^64 - 1, products of options that overflow, and
// real options that are not finite or out of range. Each case runs the command itself, in one
// process (the checks come before any MPI work), and must end with exit code 2 and a message
// naming the option: never a crash, an abort or a wrapped value that passes.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "tests/pod/run_command.hpp"

namespace {

using ipupod::testing_support::Result;
using ipupod::testing_support::run;

const std::vector<std::string> kValues = {"0", "-1", "2147483648", "9223372036854775808",
                                          "18446744073709551615"};

// Every check of the options passed: validation went on to the deliberately bad --split.
constexpr const char* kAccepted = "--split must be model";

struct IntegerOption {
  std::string name;
  std::vector<std::string> accepted;  // of kValues
};

// A command whose only fault, when `option value` is in range, is --split bogus.
std::string command(const std::string& subcommand, const std::string& option,
                    const std::string& value) {
  std::string c = std::string(IPUPOD_BINARY) + " " + subcommand + " --split bogus";
  if (subcommand == "train") c += " --data absent.h5";
  return c + " " + option + "=" + value;
}

void expect_refused(const Result& r, const std::string& option, const std::string& what) {
  EXPECT_EQ(r.exit_code, 2) << what << "\n" << r.output;
  EXPECT_NE(r.output.find(option), std::string::npos) << what << ": no '" << option << "' in\n"
                                                      << r.output;
  EXPECT_EQ(r.output.find(kAccepted), std::string::npos) << what << " was accepted\n" << r.output;
}

void check_integer_options(const std::string& subcommand,
                           const std::vector<IntegerOption>& options) {
  for (const auto& option : options)
    for (const auto& value : kValues) {
      const std::string what = subcommand + " " + option.name + "=" + value;
      const Result r = run(command(subcommand, option.name, value), 60);
      if (std::find(option.accepted.begin(), option.accepted.end(), value) !=
          option.accepted.end()) {
        EXPECT_EQ(r.exit_code, 2) << what << "\n" << r.output;
        EXPECT_NE(r.output.find(kAccepted), std::string::npos) << what << "\n" << r.output;
      } else {
        expect_refused(r, option.name, what);
      }
    }
}

const std::vector<std::string> kEverySeed = {"0", "2147483648", "9223372036854775808",
                                             "18446744073709551615"};

TEST(CliLimits, EveryIntegerOptionOfTrainIsBounded) {
  check_integer_options("train", {{"--hidden", {}},
                                  {"--stages", {}},
                                  {"--micro-batch", {}},
                                  {"--gradient-accumulation", {}},
                                  {"--device-iterations", {}},
                                  {"--replicas", {}},
                                  {"--epochs", {}},
                                  {"--warmup-steps", {"0"}},
                                  {"--seed", kEverySeed},
                                  {"--shuffle-window", {"0"}},
                                  {"--trace-events", {"0"}},
                                  {"--checkpoint-every", {"0"}},
                                  {"--checkpoint-keep", {"0"}}});
}

TEST(CliLimits, EveryIntegerOptionOfCompileIsBounded) {
  check_integer_options("compile", {{"--hidden", {}},
                                    {"--stages", {}},
                                    {"--micro-batch", {}},
                                    {"--gradient-accumulation", {}},
                                    {"--device-iterations", {}},
                                    {"--sample-shape", {}},
                                    {"--classes", {}},
                                    {"--stage", {"0"}},
                                    {"--seed", kEverySeed}});
}

// Each option is in range; their product is not (it wrapped to 0 or a small number before).
TEST(CliLimits, ProductsOfOptionsThatOverflowAreRefused) {
  const std::string big = "2147483647";
  for (const std::string subcommand : {"train", "compile"}) {
    const std::string samples = command(subcommand, "--micro-batch", big) +
                                " --gradient-accumulation " + big + " --device-iterations " + big;
    const Result r = run(samples, 60);
    expect_refused(r, "--micro-batch 2147483647 x --gradient-accumulation 2147483647", samples);
    EXPECT_NE(r.output.find("samples per host step"), std::string::npos) << r.output;
  }
  // 1 + replicas x stages ranks must fit MPI's int (cast, it wrapped).
  const Result ranks = run(command("train", "--replicas", "65536") + " --stages 65536", 60);
  expect_refused(ranks, "--replicas 65536 x --stages 65536", "ranks");
  EXPECT_NE(ranks.output.find("MPI world"), std::string::npos) << ranks.output;
  const Result shape = run(command("compile", "--sample-shape", "65536,65536,65536"), 60);
  expect_refused(shape, "--sample-shape", "sample shape");
}

TEST(CliLimits, RealOptionsMustBeFiniteAndInRange) {
  const std::map<std::string, std::vector<std::string>> refused = {
      {"--timeout", {"0", "-1", "nan", "inf", "1e300"}},
      {"--learning-rate", {"0", "-0.1", "nan", "inf", "-inf"}},
      {"--momentum", {"-0.5", "1", "nan", "inf"}},
      {"--weight-decay", {"-1", "nan", "inf"}},
      {"--clip-norm", {"-1", "nan", "inf"}},
      {"--loss-scaling", {"0", "nan", "inf"}},
      {"--available-memory-proportion", {"0", "1.5", "nan"}},
      {"--width", {"0", "nan", "inf", "1e300"}},
      {"--depth", {"0", "nan", "inf"}}};
  for (const auto& [option, values] : refused)
    for (const auto& value : values) {
      const std::string what = "train " + option + "=" + value;
      expect_refused(run(command("train", option, value), 60), option, what);
    }
  for (const std::string value : {"0.5", "1e-3", "600"}) {
    const Result r = run(command("train", "--timeout", value), 60);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(kAccepted), std::string::npos) << "--timeout " << value << "\n"
                                                           << r.output;
  }
}

}  // namespace
