// The numeric options of `ipupod train`, `compile`, `estimate`, `data` and `bench` at and past
// their limits: every integer option with 0, -1, 2^31, 2^63 and 2^64 - 1, products of options that
// overflow, and real options that are not finite or out of range. Each case runs the command
// itself, in one process (the checks come before any MPI work), and must end with exit code 2 and a
// message naming the option: never a crash, an abort or a wrapped value that passes.
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

struct IntegerOption {
  std::string name;
  std::vector<std::string> accepted;  // of kValues
};

// A command whose only fault, when `option value` is in range, is a deliberate one that is
// checked after the options: --split bogus for the training commands (which validate the
// options together); for data and bench a required option left out, or an argument nobody takes
// (CLI11 reports both after the options' validators ran). `accepted` is the message of that fault.
struct Probe {
  std::string fault, accepted;
};
const Probe kTrainingProbe{"--split bogus", "--split must be model"};
const Probe kExtraArgumentProbe{"--no-such-option",
                                "The following argument was not expected: --no-such-option"};
const Probe kNoOutputProbe{"", "--out is required"};  // checked before extras
const Probe kNoDataProbe{"", "--data is required"};

std::string command(const std::string& subcommand, const Probe& probe, const std::string& option,
                    const std::string& value) {
  std::string c = std::string(IPUPOD_BINARY) + " " + subcommand + " " + probe.fault;
  if (subcommand == "train") c += " --data absent.h5";
  return c + " " + option + "=" + value;
}

void expect_refused(const Result& r, const Probe& probe, const std::string& option,
                    const std::string& what) {
  EXPECT_EQ(r.exit_code, 2) << what << "\n" << r.output;
  EXPECT_NE(r.output.find(option), std::string::npos) << what << ": no '" << option << "' in\n"
                                                      << r.output;
  EXPECT_EQ(r.output.find(probe.accepted), std::string::npos) << what << " was accepted\n"
                                                              << r.output;
}

void check_integer_options(const std::string& subcommand, const std::vector<IntegerOption>& options,
                           const Probe& probe = kTrainingProbe) {
  for (const auto& option : options)
    for (const auto& value : kValues) {
      const std::string what = subcommand + " " + option.name + "=" + value;
      const Result r = run(command(subcommand, probe, option.name, value), 60);
      if (std::find(option.accepted.begin(), option.accepted.end(), value) !=
          option.accepted.end()) {
        EXPECT_EQ(r.exit_code, 2) << what << "\n" << r.output;
        EXPECT_NE(r.output.find(probe.accepted), std::string::npos) << what << "\n" << r.output;
      } else {
        expect_refused(r, probe, option.name, what);
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

TEST(CliLimits, EveryIntegerOptionOfEstimateIsBounded) {
  check_integer_options("estimate", {{"--hidden", {}},
                                     {"--stages", {}},
                                     {"--micro-batch", {}},
                                     {"--gradient-accumulation", {}},
                                     {"--device-iterations", {}},
                                     {"--sample-shape", {}},
                                     {"--classes", {}},
                                     {"--seed", kEverySeed},
                                     {"--replicas", {}},
                                     {"--hosts", {"0"}},
                                     {"--steps", {}},
                                     {"--warm-up-steps", {"0"}},
                                     {"--sweep-replicas", {}},
                                     {"--sweep-stages", {}},
                                     {"--sweep-gradient-accumulation", {}},
                                     {"--sweep-device-iterations", {}}});
}

// The converters and benchmarks read counts too: -1 wrapped into a huge count before (a whole
// data set converted for --limit-train -1, a vector length error for --size -1).
TEST(CliLimits, EveryIntegerOptionOfDataAndBenchIsBounded) {
  check_integer_options("data fashion-mnist", {{"--limit-train", {"0"}}, {"--limit-test", {"0"}}},
                        kNoOutputProbe);
  check_integer_options(
      "data climate", {{"--patch", {}}, {"--stride", {}}, {"--max-slices", {"0"}}}, kNoOutputProbe);
  check_integer_options("data sr-images",
                        {{"--crop", {}},
                         {"--scale", {}},
                         {"--crops-per-image", {}},
                         {"--seed", kEverySeed},
                         {"--max-images", {"0"}}},
                        kNoOutputProbe);
  check_integer_options("data microstructure",
                        {{"--size", {}},
                         {"--train", {}},
                         {"--test", {}},
                         {"--seed", kEverySeed},
                         {"--threads", {"0"}}},
                        kNoOutputProbe);
  check_integer_options("bench host",
                        {{"--clients", {}},
                         {"--samples-per-step", {}},
                         {"--prefetch-steps", {"0"}},
                         {"--reader-threads", {}},
                         {"--max-memory-mb", {"0", "2147483648"}},
                         {"--credits", {}},
                         {"--runs", {}},
                         {"--warm-up-epochs", {"0"}},
                         {"--seed", kEverySeed},
                         {"--shuffle-window", {"0"}}},
                        kNoDataProbe);
  check_integer_options(
      "bench step",
      {{"--threads", {}}, {"--repeats", {}}, {"--warmup", {"0"}}, {"--micro-batch", {"0"}}},
      kExtraArgumentProbe);
  check_integer_options("bench matmul",
                        {{"--m", {}},
                         {"--k", {}},
                         {"--n", {}},
                         {"--threads", {"0"}},
                         {"--runs", {}},
                         {"--batch", {}}},
                        kExtraArgumentProbe);
  check_integer_options("bench allreduce",
                        {{"--min-bytes", {"2147483648"}},
                         {"--max-bytes", {"2147483648"}},
                         {"--iterations", {}},
                         {"--large-iterations", {}},
                         {"--segment-kib", {}}},
                        kExtraArgumentProbe);
}

// Each option is in range; their product is not (it wrapped to 0 or a small number before).
TEST(CliLimits, ProductsOfOptionsThatOverflowAreRefused) {
  const std::string big = "2147483647";
  for (const std::string subcommand : {"train", "compile"}) {
    const std::string samples = command(subcommand, kTrainingProbe, "--micro-batch", big) +
                                " --gradient-accumulation " + big + " --device-iterations " + big;
    const Result r = run(samples, 60);
    expect_refused(r, kTrainingProbe,
                   "--micro-batch 2147483647 x --gradient-accumulation 2147483647", samples);
    EXPECT_NE(r.output.find("samples per host step"), std::string::npos) << r.output;
  }
  // 1 + replicas x stages ranks must fit MPI's int (cast, it wrapped).
  const Result ranks =
      run(command("train", kTrainingProbe, "--replicas", "65536") + " --stages 65536", 60);
  expect_refused(ranks, kTrainingProbe, "--replicas 65536 x --stages 65536", "ranks");
  EXPECT_NE(ranks.output.find("MPI world"), std::string::npos) << ranks.output;
  const Result shape =
      run(command("compile", kTrainingProbe, "--sample-shape", "65536,65536,65536"), 60);
  expect_refused(shape, kTrainingProbe, "--sample-shape", "sample shape");
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
      expect_refused(run(command("train", kTrainingProbe, option, value), 60), kTrainingProbe,
                     option, what);
    }
  for (const std::string value : {"0.5", "1e-3", "600"}) {
    const Result r = run(command("train", kTrainingProbe, "--timeout", value), 60);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(kTrainingProbe.accepted), std::string::npos)
        << "--timeout " << value << "\n"
        << r.output;
  }
}

}  // namespace
