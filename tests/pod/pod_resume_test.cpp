// Checkpoints and --resume of `ipupod train` under mpirun, as a user runs them: a run stopped
// after one epoch (or in the middle of one) and resumed ends bitwise identical to a run never
// stopped; a resume that does not fit the run fails with exit code 2 and says what differs.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "host/checkpoint.hpp"
#include "tests/pod/run_command.hpp"

namespace {

namespace fs = std::filesystem;

using ipupod::testing_support::Result;
using ipupod::testing_support::run;

class PodResume : public ::testing::Test {
 protected:
  static fs::path dir() {
    return fs::temp_directory_path() / ("ipupod_pod_resume_" + std::to_string(getpid()));
  }
  static fs::path data() { return dir() / "fashion-mnist-small.h5"; }

  static void SetUpTestSuite() {
    fs::create_directories(dir());
    const Result r = run(std::string(IPUPOD_BINARY) + " data fashion-mnist --out " +
                         data().string() + " --limit-train 1200 --limit-test 200");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir()); }

  // 2 replicas x 10 samples x accumulation 2 x 2 device iterations: 80 samples per host step,
  // 15 host steps per epoch.
  static std::string train_command(const std::string& run_dir, const std::string& options,
                                   const std::string& hidden = "32",
                                   const std::string& layout = "--replicas 2", int ranks = 3) {
    return std::string(IPUPOD_MPIEXEC) + " -n " + std::to_string(ranks) +
           " --oversubscribe --allow-run-as-root " + IPUPOD_BINARY +
           " train --model mlp --hidden " + hidden + " --data " + data().string() + " " + layout +
           " --micro-batch 10 --gradient-accumulation 2 --device-iterations 2"
           " --learning-rate 0.1 --arch tiny --topology m2000 --run-dir " +
           (dir() / run_dir).string() + " " + options;
  }
  static Result train(const std::string& run_dir, const std::string& options,
                      const std::string& hidden = "32", const std::string& layout = "--replicas 2",
                      int ranks = 3) {
    return run(train_command(run_dir, options, hidden, layout, ranks));
  }

  // The job of train(run_dir, options) started in the background, its output going to the file
  // `log`: returns the pid of mpirun (which replaces the shell that starts it), or -1 if fork
  // failed.
  static pid_t start_train(const std::string& run_dir, const std::string& options,
                           const fs::path& log) {
    const std::string command =
        "exec " + train_command(run_dir, options) + " > " + log.string() + " 2>&1";
    const pid_t mpirun = fork();
    if (mpirun == 0) {
      execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    return mpirun;
  }

  // What a background job wrote to its log so far.
  static std::string read_log(const fs::path& log) {
    std::ifstream in(log);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  static void stop_and_resume(const std::string& name, int signal, const std::string& told,
                              bool relayed);

  // Waits until the job `mpirun` has written a checkpoint file into run directory `name` (the
  // directory says so at once, where mpirun relays output late), of host step `min_step` or
  // later; false, with the reason added, when the job ended first or wrote none within 2
  // minutes (then it is killed).
  static ::testing::AssertionResult wait_for_checkpoint_file(pid_t mpirun, const std::string& name,
                                                             const fs::path& log,
                                                             std::size_t min_step = 0) {
    const auto started = std::chrono::steady_clock::now();
    const auto written = [&] {
      std::error_code ec;
      for (const auto& entry : fs::directory_iterator(dir() / name, ec)) {
        const std::string file = entry.path().filename().string();
        if (file.starts_with("checkpoint-") && file.ends_with(".h5") &&
            std::stoul(file.substr(11, file.size() - 14)) >= min_step)
          return true;
      }
      return false;
    };
    for (;;) {
      if (written()) return ::testing::AssertionSuccess();
      int status = 0;
      if (waitpid(mpirun, &status, WNOHANG) != 0)
        return ::testing::AssertionFailure()
               << "the job ended before checkpoint " << min_step << ":\n"
               << read_log(log);
      if (std::chrono::steady_clock::now() - started > std::chrono::minutes(2)) {
        kill(mpirun, SIGKILL);
        waitpid(mpirun, &status, 0);
        return ::testing::AssertionFailure() << "no checkpoint within 2 minutes:\n"
                                             << read_log(log);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  static nlohmann::json summary(const std::string& run_dir) {
    std::ifstream in(dir() / run_dir / "summary.json");
    return nlohmann::json::parse(in);
  }

  // The loss column of metrics.csv (the last column is wall-clock throughput).
  static std::vector<std::string> losses(const std::string& run_dir) {
    std::ifstream in(dir() / run_dir / "metrics.csv");
    std::vector<std::string> out;
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) out.push_back(line.substr(0, line.rfind(',')));
    return out;
  }

  static void expect_same_tensors(const fs::path& a, const fs::path& b) {
    const ipupod::host::Checkpoint x = ipupod::host::load_checkpoint(a.string());
    const ipupod::host::Checkpoint y = ipupod::host::load_checkpoint(b.string());
    EXPECT_EQ(x.step, y.step);
    ASSERT_FALSE(x.tensors.empty());
    ASSERT_EQ(x.tensors.size(), y.tensors.size());
    for (const auto& [name, array] : x.tensors) {
      ASSERT_EQ(y.tensors.count(name), 1u) << name;
      EXPECT_EQ(array.dtype, y.tensors.at(name).dtype) << name;
      EXPECT_EQ(array.shape, y.tensors.at(name).shape) << name;
      EXPECT_TRUE(array.bytes == y.tensors.at(name).bytes) << name << " differs";
    }
  }

  static void expect_same_metrics(const std::string& a, const std::string& b) {
    const auto x = summary(a).at("epochs"), y = summary(b).at("epochs");
    ASSERT_EQ(x.size(), y.size());
    for (std::size_t e = 0; e < x.size(); ++e)
      for (const char* key :
           {"train_loss", "test_loss", "test_accuracy", "predicted_samples_per_s"})
        EXPECT_EQ(x[e].at(key), y[e].at(key)) << "epoch " << e + 1 << " " << key;
    EXPECT_EQ(losses(a), losses(b));
  }
};

TEST_F(PodResume, StoppedAndResumedRunsEndBitwiseIdenticalToAStraightRun) {
  const Result straight = train("straight", "--epochs 2 --checkpoint-every 4 --checkpoint-keep 0");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  // Every 4 host steps (mid-epoch when 4 does not divide 15) and at the end.
  for (const char* name : {"checkpoint-000004.h5", "checkpoint-000016.h5", "checkpoint-000030.h5"})
    EXPECT_TRUE(fs::exists(dir() / "straight" / name)) << name;
  const fs::path final_checkpoint = dir() / "straight" / "checkpoint-000030.h5";

  // One epoch, then a second from its final checkpoint (written after the evaluation).
  const Result first = train("first", "--epochs 1 --checkpoint-every 100");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const Result second = train("second", "--epochs 2 --checkpoint-every 4 --resume " +
                                            (dir() / "first" / "checkpoint-000015.h5").string());
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("resuming from"), std::string::npos) << second.output;
  expect_same_tensors(final_checkpoint, dir() / "second" / "checkpoint-000030.h5");
  expect_same_metrics("straight", "second");

  // From the middle of the second epoch (host step 16 of 30).
  const Result middle = train("middle", "--epochs 2 --checkpoint-every 4 --resume " +
                                            (dir() / "straight" / "checkpoint-000016.h5").string());
  ASSERT_EQ(middle.exit_code, 0) << middle.output;
  expect_same_tensors(final_checkpoint, dir() / "middle" / "checkpoint-000030.h5");
  expect_same_metrics("straight", "middle");
  EXPECT_EQ(summary("straight").at("replica_weight_checksums"),
            summary("middle").at("replica_weight_checksums"));

  // The comparison can fail: training moves the weights between checkpoints.
  const auto early =
      ipupod::host::load_checkpoint((dir() / "straight" / "checkpoint-000004.h5").string());
  const auto late = ipupod::host::load_checkpoint(final_checkpoint.string());
  EXPECT_FALSE(early.tensors.at("fc0.weight").bytes == late.tensors.at("fc0.weight").bytes);
  // --checkpoint-keep 2 (the default) leaves the newest two.
  std::size_t kept = 0;
  for (const auto& entry : fs::directory_iterator(dir() / "middle"))
    kept += entry.path().extension() == ".h5";
  EXPECT_EQ(kept, 2u);
}

// A pipelined replica's checkpoint gathers every stage's tensors (weights, Adam's moments, each
// stage's step counter once) through the first stage, and a resume hands each stage its own.
TEST_F(PodResume, PipelinedRunsResumeBitwiseIdenticallyToo) {
  const std::string layout = "--replicas 2 --stages 2 --optimizer adam";
  const Result straight = train(
      "pipe-straight", "--epochs 2 --checkpoint-every 4 --checkpoint-keep 0", "32", layout, 5);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const auto mid =
      ipupod::host::load_checkpoint((dir() / "pipe-straight" / "checkpoint-000016.h5").string());
  for (const char* name : {"fc0.weight", "head.weight", "head.weight/exp_avg", "optimizer/step"})
    EXPECT_EQ(mid.tensors.count(name), 1u) << name;
  const Result resumed = train("pipe-middle",
                               "--epochs 2 --checkpoint-every 4 --resume " +
                                   (dir() / "pipe-straight" / "checkpoint-000016.h5").string(),
                               "32", layout, 5);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  expect_same_tensors(dir() / "pipe-straight" / "checkpoint-000030.h5",
                      dir() / "pipe-middle" / "checkpoint-000030.h5");
  expect_same_metrics("pipe-straight", "pipe-middle");
}

TEST_F(PodResume, ResumeThatDoesNotFitTheRunIsBadInput) {
  const Result saved = train("saved", "--epochs 1 --checkpoint-every 15");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const std::string checkpoint = (dir() / "saved" / "checkpoint-000015.h5").string();

  const Result other_model = train("other", "--epochs 2 --resume " + checkpoint, "16");
  EXPECT_EQ(other_model.exit_code, 2) << other_model.output;
  EXPECT_NE(other_model.output.find("hidden: checkpoint [32], this run [16]"), std::string::npos)
      << other_model.output;

  const Result other_seed = train("seed", "--epochs 2 --seed 2 --resume " + checkpoint);
  EXPECT_EQ(other_seed.exit_code, 2) << other_seed.output;
  EXPECT_NE(other_seed.output.find("seed: checkpoint 1, this run 2"), std::string::npos)
      << other_seed.output;

  // The loader's order is part of the run: a windowed shuffle does not continue a whole-split
  // one (a checkpoint without the setting, as older ones are, counts as window 0).
  const Result windowed =
      train("windowed", "--epochs 2 --shuffle-window 512 --resume " + checkpoint);
  EXPECT_EQ(windowed.exit_code, 2) << windowed.output;
  EXPECT_NE(windowed.output.find("shuffle_window: checkpoint 0, this run 512"), std::string::npos)
      << windowed.output;

  const Result finished = train("finished", "--epochs 1 --resume " + checkpoint);
  EXPECT_EQ(finished.exit_code, 2) << finished.output;
  EXPECT_NE(finished.output.find("leaves nothing to train; raise --epochs"), std::string::npos)
      << finished.output;

  const Result not_checkpoint = train("data", "--epochs 2 --resume " + data().string());
  EXPECT_EQ(not_checkpoint.exit_code, 2) << not_checkpoint.output;
  EXPECT_NE(not_checkpoint.output.find("not an ipupod checkpoint"), std::string::npos)
      << not_checkpoint.output;

  const Result missing = train("missing", "--epochs 2 --resume " + (dir() / "nope.h5").string());
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("does not exist"), std::string::npos) << missing.output;
}

// A checkpoint that was damaged or edited after it was written is refused with exit code 2,
// naming the tensor or field, instead of training on from nonsense.
TEST_F(PodResume, DamagedOrEditedCheckpointsAreRefusedNamingWhat) {
  const Result saved = train("intact", "--epochs 1 --checkpoint-every 15");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const fs::path original = dir() / "intact" / "checkpoint-000015.h5";
  const fs::path metrics = dir() / "intact" / "checkpoint-000015.metrics.json";
  ASSERT_TRUE(fs::exists(metrics));
  // Each case gets its own copy of the checkpoint and its metrics file.
  const auto copy = [&](const std::string& name) {
    fs::create_directories(dir() / name);
    fs::copy_file(original, dir() / name / original.filename());
    fs::copy_file(metrics, dir() / name / metrics.filename());
    return (dir() / name / original.filename()).string();
  };
  const auto expect_refused = [&](const std::string& name, const std::string& path,
                                  const std::vector<std::string>& needles) {
    const Result r = train(name + "-run", "--epochs 2 --resume " + path);
    EXPECT_EQ(r.exit_code, 2) << name << ":\n" << r.output;
    for (const auto& needle : needles)
      EXPECT_NE(r.output.find(needle), std::string::npos) << name << ": " << needle << "\n"
                                                          << r.output;
  };
  using ipupod::host::Checkpoint;

  // A bit flipped in a weight on disk.
  {
    const std::string path = copy("flipped");
    const Checkpoint c = ipupod::host::load_checkpoint(path);
    const auto& bytes = c.tensors.at("head.weight").bytes;
    std::ifstream in(path, std::ios::binary);
    std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t at =
        file.find(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    ASSERT_NE(at, std::string::npos);
    file[at + 9] = static_cast<char>(file[at + 9] ^ 0x04);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << file;
    expect_refused("flipped", path, {"tensor 'head.weight' fails its CRC32C check"});
  }
  // A NaN written into a weight with valid checksums (e.g. a run that had diverged).
  {
    const std::string path = copy("nan");
    Checkpoint c = ipupod::host::load_checkpoint(path);
    c.tensors.at("fc0.weight").as<float>()[3] = std::nanf("");
    ipupod::host::save_checkpoint(path, c);
    expect_refused("nan", path, {"tensor 'fc0.weight'", "holds nan at element 3"});
  }
  // The step counter edited in the file, and in the state record with fresh checksums.
  {
    const std::string path = copy("step");
    Checkpoint c = ipupod::host::load_checkpoint(path);
    c.step = 9;
    ipupod::host::save_checkpoint(path, c);
    expect_refused("step", path, {"step attribute is 9", "host_step is 15"});
    auto state = nlohmann::json::parse(c.state_json);
    state["host_step"] = 14;
    c.step = 14;
    c.state_json = state.dump();
    ipupod::host::save_checkpoint(path, c);
    expect_refused("host-step", path, {"state field 'host_step' is 14", "= 15"});
  }
  // A renamed key: named, where it was a raw JSON library error with exit code 1.
  {
    const std::string path = copy("renamed");
    Checkpoint c = ipupod::host::load_checkpoint(path);
    auto state = nlohmann::json::parse(c.state_json);
    state["epoch_losses"] = state.at("epoch_loss");
    state.erase("epoch_loss");
    c.state_json = state.dump();
    ipupod::host::save_checkpoint(path, c);
    expect_refused("renamed", path, {"lacks the field 'epoch_loss'"});
  }
  // The metrics file is part of the checkpoint: missing or edited, it is named.
  {
    const std::string path = copy("no-metrics");
    fs::remove(dir() / "no-metrics" / metrics.filename());
    expect_refused("no-metrics", path, {"checkpoint-000015.metrics.json' is missing"});
    fs::copy_file(metrics, dir() / "no-metrics" / metrics.filename());
    std::ofstream(dir() / "no-metrics" / metrics.filename(), std::ios::app) << " ";
    expect_refused("edited-metrics", path, {"fails its CRC32C check"});
  }
}

// --checkpoint-keep counts a resumed run's checkpoints together with those its checkpoint's run
// wrote into the same directory (they were kept for ever before), and the temporary files a
// crash during a write leaves behind are removed when a run starts or resumes.
TEST_F(PodResume, CheckpointKeepPrunesAcrossResumesAndLeftoversAreRemoved) {
  const fs::path run_dir = dir() / "keep";
  fs::create_directories(run_dir);
  const auto plant = [&](const std::string& name) { std::ofstream(run_dir / name) << "torn"; };
  const auto names = [&](const std::string& suffix) {
    std::vector<std::string> found;
    for (const auto& entry : fs::directory_iterator(run_dir)) {
      const std::string name = entry.path().filename().string();
      if (name.size() >= suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
        found.push_back(name);
    }
    std::sort(found.begin(), found.end());
    return found;
  };
  plant("checkpoint-000004.h5.tmp");
  plant("notes.tmp");  // not ipupod's: left alone
  const Result first = train("keep", "--epochs 1 --checkpoint-every 4 --checkpoint-keep 2");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("removed 1 temporary file(s)"), std::string::npos) << first.output;
  EXPECT_EQ(names(".h5"),
            (std::vector<std::string>{"checkpoint-000012.h5", "checkpoint-000015.h5"}));

  // A crash while the run wrote its next checkpoint and reports.
  plant("checkpoint-000019.h5.tmp");
  plant("checkpoint-000019.metrics.json.tmp");
  plant("summary.json.tmp");
  const Result resumed =
      train("keep", "--epochs 2 --checkpoint-every 4 --checkpoint-keep 2 --resume " +
                        (run_dir / "checkpoint-000015.h5").string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("removed 3 temporary file(s)"), std::string::npos)
      << resumed.output;
  EXPECT_EQ(names(".h5"),
            (std::vector<std::string>{"checkpoint-000028.h5", "checkpoint-000030.h5"}));
  EXPECT_EQ(names(".metrics.json"), (std::vector<std::string>{"checkpoint-000028.metrics.json",
                                                              "checkpoint-000030.metrics.json"}));
  EXPECT_EQ(names(".tmp"), std::vector<std::string>{"notes.tmp"});
}

// The pid of each rank of a job that mpirun (pid `mpirun`) launched, by rank, from the ranks'
// environments (Open MPI starts local ranks as its own children).
std::map<int, pid_t> rank_pids(pid_t mpirun) {
  std::map<int, pid_t> pids;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const std::size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(line.substr(close + 2));
    char state = 0;
    pid_t parent = 0;
    fields >> state >> parent;
    if (parent != mpirun) continue;
    std::ifstream environ(entry.path() / "environ", std::ios::binary);
    std::string variable;
    while (std::getline(environ, variable, '\0'))
      if (variable.rfind("OMPI_COMM_WORLD_RANK=", 0) == 0)
        pids[std::stoi(variable.substr(21))] = static_cast<pid_t>(std::stol(name));
  }
  return pids;
}

// The ranks of `pids` still running (not ended, not a zombie), each as "rank R (pid P, state S,
// waiting in W)"; empty when none is.
std::string running_ranks(const std::map<int, pid_t>& pids) {
  std::string out;
  for (const auto& [rank, pid] : pids) {
    const fs::path proc = "/proc/" + std::to_string(pid);
    std::ifstream stat(proc / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const std::size_t close = line.rfind(')');
    const char state =
        close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
    if (state == 'Z' || state == 'X') continue;
    std::ifstream wchan(proc / "wchan");
    std::string waiting;
    std::getline(wchan, waiting);
    out += (out.empty() ? "" : ", ") + std::string("rank ") + std::to_string(rank) + " (pid " +
           std::to_string(pid) + ", state " + state + ", waiting in " + waiting + ")";
  }
  return out;
}

// Fault injection: SIGKILL to a rank (the host or an IPU, chosen by a seeded generator) at a
// seeded moment after the job's first checkpoint. Each run must end within seconds, non-zero,
// with a message; resumed from the newest checkpoint it left (in the same directory, so torn
// temporary files are met too), it must end bitwise identical to a run never killed.
TEST_F(PodResume, KilledRanksEndTheJobPromptlyAndResumingEndsIdentically) {
  // 90 host steps, a checkpoint every 2. Each kill comes at a random point after a random
  // checkpoint of the first two thirds of the run, found by watching the run directory (not by
  // time: a shared machine's speed changes from one run to the next).
  const std::string options = "--epochs 6 --checkpoint-every 2 --checkpoint-keep 2";
  const std::string last = "checkpoint-000090.h5";
  const Result straight = train("fault-straight", options);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  std::mt19937 rng(20);
  int resumed_runs = 0;
  for (int trial = 0; trial < 3; ++trial) {
    const int rank = trial < 2 ? trial : static_cast<int>(rng() % 3);  // the host, an IPU, either
    const std::size_t after_step = 2 * (2 + rng() % 29);               // checkpoint 4 .. 60
    const auto delay = std::chrono::milliseconds(rng() % 20);
    const std::string name = "fault-" + std::to_string(trial);
    SCOPED_TRACE(name + ": SIGKILL to rank " + std::to_string(rank) + " " +
                 std::to_string(delay.count()) + " ms after checkpoint " +
                 std::to_string(after_step));
    const fs::path log = dir() / (name + ".log");
    const pid_t mpirun = start_train(name, options, log);
    ASSERT_GE(mpirun, 0);
    const auto reap = [&](std::chrono::seconds limit) {
      int status = 0;
      const auto until = std::chrono::steady_clock::now() + limit;
      while (waitpid(mpirun, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > until) {
          kill(mpirun, SIGKILL);
          waitpid(mpirun, &status, 0);
          return -1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return status;
    };
    ASSERT_TRUE(wait_for_checkpoint_file(mpirun, name, log, after_step));
    std::this_thread::sleep_for(delay);
    const std::map<int, pid_t> pids = rank_pids(mpirun);
    // On a fast machine the job may be ending already (its ranks gone, or going): then it must
    // end as a run never killed.
    if (pids.count(rank) == 0 || kill(pids.at(rank), SIGKILL) != 0) {
      const int status = reap(std::chrono::seconds(60));
      ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "rank " << rank << " is not running, yet the job did not end well:\n"
          << read_log(log);
      continue;
    }
    const auto killed = std::chrono::steady_clock::now();
    // Every rank must be gone within 30 s (what ipupod answers for); mpirun's own teardown after
    // that is Open MPI's, given longer, and a timeout names what is still alive.
    std::string alive;
    while (!(alive = running_ranks(pids)).empty() &&
           std::chrono::steady_clock::now() - killed < std::chrono::seconds(30))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const int status = reap(std::chrono::seconds(alive.empty() ? 90 : 1));
    const std::string output = read_log(log);
    ASSERT_TRUE(alive.empty()) << "ranks still running 30 s after the kill: " << alive << "\n"
                               << output;
    ASSERT_NE(status, -1) << "every rank ended, but mpirun did not end within 90 s:\n" << output;
    std::cout << name << ": rank " << rank << " killed " << delay.count() << " ms after checkpoint "
              << after_step << ", the job ended "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count()
              << " s later" << std::endl;
    EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
    // mpirun names the rank that died; or a rank that saw it first says what failed.
    EXPECT_TRUE(output.find("process rank " + std::to_string(rank)) != std::string::npos ||
                output.find("ipupod train: error on rank") != std::string::npos)
        << "no message says what happened:\n"
        << output;

    // The newest checkpoint the run left, resumed in the same directory.
    std::string newest;
    for (const auto& entry : fs::directory_iterator(dir() / name)) {
      const std::string file = entry.path().filename().string();
      if (file.starts_with("checkpoint-") && file.ends_with(".h5") && file > newest) newest = file;
    }
    ASSERT_FALSE(newest.empty()) << output;
    if (newest == last) continue;  // killed after the last one: nothing to do
    std::cout << name << ": resuming from " << newest << std::endl;
    const Result resumed = train(name, options + " --resume " + (dir() / name / newest).string());
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    expect_same_tensors(dir() / "fault-straight" / last, dir() / name / last);
    expect_same_metrics("fault-straight", name);
    ++resumed_runs;
  }
  // Kills drawn from the run's own length land mid-run: a test that never resumed tested nothing.
  EXPECT_GE(resumed_runs, 1) << "every kill came after the job's last checkpoint";
}

// A failure inside the host's training loop, while its feeder threads run (here a directory
// stands where the host must move checkpoint 4), ends the job through the one error path: the
// reason printed once, exit 1, never "terminate called" with the reason lost.
TEST_F(PodResume, AFailureInTheHostsTrainingLoopEndsTheJobWithItsReasonOnce) {
  fs::create_directories(dir() / "in-the-way" / "checkpoint-000004.h5");
  const Result r = train("in-the-way", "--epochs 1 --checkpoint-every 2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::string error = "ipupod train: error on rank 0 (host): ";
  const std::size_t at = r.output.find(error);
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(error, at + 1), std::string::npos) << "said twice:\n" << r.output;
  EXPECT_NE(r.output.find("checkpoint-000004.h5", at), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir() / "in-the-way" / "checkpoint-000002.h5"));  // the one before
}

// A run's options round-trip: --export-config writes them without training, `train --config`
// of that file runs the job, and `train --config` of its summary.json (in a new --run-dir: the
// command line wins) runs it again to the same weights, bit for bit. Switches kept as values
// ("shuffle": false) and the derived global batch are read back as such.
TEST_F(PodResume, ARunsOptionsRoundTripThroughExportConfigAndSummary) {
  const fs::path exported = dir() / "exported.json";
  const std::string options =
      "--model mlp --hidden 24 --data " + data().string() +
      " --replicas 2 --micro-batch 10 --gradient-accumulation 2 --device-iterations 2"
      " --learning-rate 0.05 --arch tiny --topology m2000 --epochs 1 --no-shuffle"
      " --checkpoint-every 5 --run-dir " +
      (dir() / "round-a").string();
  const Result written = run(std::string(IPUPOD_BINARY) + " train " + options +
                             " --export-config " + exported.string());
  ASSERT_EQ(written.exit_code, 0) << written.output;
  EXPECT_FALSE(fs::exists(dir() / "round-a")) << "--export-config trained";
  const std::string mpirun = std::string(IPUPOD_MPIEXEC) +
                             " -n 3 --oversubscribe --allow-run-as-root " + IPUPOD_BINARY +
                             " train --config ";
  const Result first = run(mpirun + exported.string());
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const Result again = run(mpirun + (dir() / "round-a" / "summary.json").string() + " --run-dir " +
                           (dir() / "round-b").string());
  ASSERT_EQ(again.exit_code, 0) << again.output;
  nlohmann::json a = summary("round-a"), b = summary("round-b");
  EXPECT_EQ(a["config"]["shuffle"], false);
  EXPECT_EQ(a["config"]["hidden"], nlohmann::json::array({24}));
  EXPECT_EQ(a["config"]["checkpoint_every"], 5);
  EXPECT_EQ(b["config"]["run_dir"], (dir() / "round-b").string());
  a["config"].erase("run_dir");
  b["config"].erase("run_dir");
  EXPECT_EQ(a["config"], b["config"]);
  EXPECT_EQ(a["replica_weight_checksums"], b["replica_weight_checksums"]);
  EXPECT_EQ(a["test_loss"], b["test_loss"]);
}

// The running figures live beside the checkpoints, so a checkpoint's size does not grow with
// the number of steps trained.
TEST_F(PodResume, CheckpointsDoNotGrowWithTheRunLength) {
  const Result r = train("growth", "--epochs 2 --checkpoint-every 1 --checkpoint-keep 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto first = fs::file_size(dir() / "growth" / "checkpoint-000001.h5");
  const auto last = fs::file_size(dir() / "growth" / "checkpoint-000030.h5");
  EXPECT_LT(std::max(first, last) - std::min(first, last), 64u)
      << "checkpoint sizes " << first << " and " << last << " bytes";
}

// A stop signal to mpirun stops the job at the next step boundary with a final checkpoint, a
// message that says how to continue, and a non-zero exit code; the run resumed from that
// checkpoint ends as a run never stopped.
// The job started under `name`, stopped by `signal` sent to mpirun once it trains: it must stop
// at a step boundary with a final checkpoint and say so (in the run directory's stopped.txt, and
// through mpirun when mpirun still relays output: `relayed`); resumed from that checkpoint, it
// ends bitwise identical to a straight run.
void PodResume::stop_and_resume(const std::string& name, int signal, const std::string& told,
                                bool relayed) {
  const fs::path log = dir() / (name + ".log");
  fs::create_directories(dir() / name);
  const pid_t mpirun = start_train(name, "--epochs 4000 --checkpoint-every 100", log);
  ASSERT_GE(mpirun, 0);
  // Once a checkpoint file is there, training is under way (4000 epochs take much longer than
  // the stop).
  ASSERT_TRUE(wait_for_checkpoint_file(mpirun, name, log));
  int status = 0;
  ASSERT_EQ(kill(mpirun, signal), 0);
  const auto signalled = std::chrono::steady_clock::now();
  while (waitpid(mpirun, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - signalled > std::chrono::seconds(90)) {
      kill(mpirun, SIGKILL);
      waitpid(mpirun, &status, 0);
      FAIL() << "the job did not end within 90 s of the signal:\n" << read_log(log);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string output = read_log(log);
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_NE(WEXITSTATUS(status), 0) << output;
  std::ifstream notice_file(dir() / name / "stopped.txt");
  const std::string notice((std::istreambuf_iterator<char>(notice_file)),
                           std::istreambuf_iterator<char>());
  ASSERT_NE(notice.find("ipupod train: stopped by " + told + " after host step"), std::string::npos)
      << "stopped.txt: " << notice << "\n"
      << output;
  if (relayed) {
    EXPECT_NE(output.find(notice), std::string::npos) << output;
  }
  const std::string said = "its checkpoint is ";
  const std::size_t at = notice.find(said);
  ASSERT_NE(at, std::string::npos) << notice;
  const std::size_t from = at + said.size();
  const std::string checkpoint = notice.substr(from, notice.find(". To continue", from) - from);
  EXPECT_NE(notice.find("run the same command with --resume " + checkpoint), std::string::npos)
      << notice;
  ASSERT_TRUE(fs::exists(checkpoint)) << notice;
  EXPECT_FALSE(fs::exists(dir() / name / "summary.json")) << "the job was not stopped\n" << output;

  // Resumed to the end of the epoch it stopped in (the learning rate is constant, so --epochs
  // may change), it ends bitwise identical to a straight run of that many epochs, and the
  // notice of the stop is gone from the run directory it finished in.
  const auto state = nlohmann::json::parse(ipupod::host::load_checkpoint(checkpoint).state_json);
  const std::size_t epochs = state.at("epoch").get<std::size_t>() + 1;
  const std::string until = "--epochs " + std::to_string(epochs) + " --checkpoint-every 100";
  const Result resumed = train(name, until + " --resume " + checkpoint);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_FALSE(fs::exists(dir() / name / "stopped.txt"));
  const Result straight = train(name + "-straight", until);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  char file[64];
  std::snprintf(file, sizeof file, "checkpoint-%06zu.h5", epochs * 15);
  expect_same_tensors(dir() / (name + "-straight") / file, dir() / name / file);
  expect_same_metrics(name + "-straight", name);
}

// SIGUSR1 (what Slurm's --signal sends) mpirun passes on and leaves the ranks to finish.
TEST_F(PodResume, StopSignalStopsAtAStepBoundaryWithACheckpointToResumeFrom) {
  stop_and_resume("signalled", SIGUSR1, "SIGUSR1", true);
}

// SIGTERM or SIGINT to mpirun: it sends the ranks SIGCONT, SIGTERM odls_base_sigkill_timeout
// seconds later (1 by default; 3 here, for a loaded machine's checkpoint fsync) and SIGKILL after
// as long again, and it stops relaying their output: a rank printing into the unread pipe must
// still reach the step boundary and its checkpoint.
TEST_F(PodResume, SigtermOrSigintToMpirunStopsWithACheckpointToo) {
  ASSERT_EQ(setenv("OMPI_MCA_odls_base_sigkill_timeout", "3", 1), 0);
  stop_and_resume("terminated", SIGTERM, "SIGTERM", false);
  stop_and_resume("interrupted", SIGINT, "SIGTERM", false);  // mpirun passes on a SIGTERM
  unsetenv("OMPI_MCA_odls_base_sigkill_timeout");
}

}  // namespace
