// The `ipupod data` subcommands as the command line sees them: the printed summary, exit code 0
// on success and 2 with an actionable message on bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "datasets/cli.hpp"
#include "tests/datasets/datasets_test_support.hpp"
#include "tests/host/temp_dir.hpp"

namespace ipupod::datasets {
namespace {

using ipupod::testing::TempDir;

struct CliRun {
  int exit_code = -1;
  std::string out, err;
};

// Parses `args` (after "data") as the ipupod command does, capturing stdout and stderr.
CliRun run_data(std::vector<std::string> args) {
  CLI::App app{"test"};
  CLI::App* data = app.add_subcommand("data", "");
  CliRun run;
  add_data_commands(*data, run.exit_code);
  args.insert(args.begin(), "data");
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments in reverse order
  std::ostringstream out, err;
  std::streambuf* old_out = std::cout.rdbuf(out.rdbuf());
  std::streambuf* old_err = std::cerr.rdbuf(err.rdbuf());
  try {
    app.parse(args);
  } catch (const CLI::ParseError& error) {
    run.exit_code = 2;
    run.err = error.what();
  }
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  run.out = out.str();
  run.err += err.str();
  return run;
}

TEST(DataCli, MicrostructurePrintsWhatItWrote) {
  TempDir dir;
  const std::string out = dir.file("m.h5");
  const CliRun run = run_data({"microstructure", "--out", out, "--size", "16", "--train", "2",
                               "--test", "2", "--kind", "grf", "--seed", "1"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("train: 2 samples"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("inputs float32[2,3,16,16] (6144 bytes)"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("wrote " + out), std::string::npos) << run.out;
  // Again without --force: refused with exit code 2; with it: accepted.
  CliRun again = run_data({"microstructure", "--out", out, "--size", "16"});
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_NE(again.err.find("--force"), std::string::npos) << again.err;
  again = run_data(
      {"microstructure", "--out", out, "--size", "16", "--train", "1", "--test", "1", "--force"});
  EXPECT_EQ(again.exit_code, 0) << again.err;
}

TEST(DataCli, BadInputExitsWithCodeTwo) {
  TempDir dir;
  CliRun run =
      run_data({"climate", "--out", dir.file("c.h5"), "--field", dir.file("none.nc") + ":X"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("does not exist"), std::string::npos) << run.err;
  run = run_data({"sr-images", "--out", dir.file("s.h5"), "--image", dir.file("none.jpg")});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("plasma-workspace-wallpapers"), std::string::npos) << run.err;
  run = run_data({"microstructure", "--out", dir.file("m.h5"), "--contrast", "0"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("--contrast"), std::string::npos) << run.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("m.h5")));
}

TEST(DataCli, SrImagesNativeFlag) {
  const std::vector<std::string> photos = {
      "/usr/share/wallpapers/Path/contents/images/2560x1600.jpg",
      "/usr/share/wallpapers/Kite/contents/images/2560x1600.jpg"};
  SKIP_WITHOUT(photos, "plasma-workspace-wallpapers");
  TempDir dir;
  const CliRun run = run_data({"sr-images", "--out", dir.file("s.h5"), "--image", photos[0],
                               "--image", photos[1], "--crops-per-image", "2", "--lr-native"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("inputs float32[2,3,16,16]"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("targets float32[2,3,64,64]"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("lr_small"), std::string::npos) << run.out;
}

}  // namespace
}  // namespace ipupod::datasets
