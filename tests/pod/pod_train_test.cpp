// End-to-end runs of `ipupod train` under mpirun, as a user runs it: real processes, real
// Fashion-MNIST data converted by `ipupod data`, real TCP streams, and the bad inputs a user
// makes, each of which must end with a clear message and exit code 2, never a hang.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/pod/run_command.hpp"

namespace {

namespace fs = std::filesystem;

using ipupod::testing_support::Result;
using ipupod::testing_support::run;

std::string mpirun(int ranks) {
  return std::string(IPUPOD_MPIEXEC) + " -n " + std::to_string(ranks) +
         " --oversubscribe --allow-run-as-root " + IPUPOD_BINARY + " ";
}

class PodTrain : public ::testing::Test {
 protected:
  static fs::path dir() {
    return fs::temp_directory_path() / ("ipupod_pod_train_" + std::to_string(getpid()));
  }
  static fs::path data() { return dir() / "fashion-mnist-small.h5"; }

  static void SetUpTestSuite() {
    fs::create_directories(dir());
    const Result r = run(std::string(IPUPOD_BINARY) + " data fashion-mnist --out " +
                         data().string() + " --limit-train 4000 --limit-test 800");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir()); }

  static void expect_bad_input(const Result& r, const std::string& message) {
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << "expected '" << message << "' in:\n"
                                                         << r.output;
  }
};

// Two pipeline stages over real MPI (grouped and sequential schedules) train exactly like one
// IPU: same per-step losses, same test metrics; the later stage reports its memory too.
TEST_F(PodTrain, PipelinedStagesOverMpiTrainLikeOneIpu) {
  const std::string common = "train --model mlp --hidden 24 --data " + data().string() +
                             " --micro-batch 8 --gradient-accumulation 3 --epochs 1"
                             " --learning-rate 0.1 --arch tiny --topology m2000 --run-dir ";
  const Result one = run(mpirun(2) + common + (dir() / "one").string());
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto read = [](const fs::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const auto summary_of = [&](const fs::path& run_dir) {
    return nlohmann::json::parse(read(run_dir / "summary.json"));
  };
  const auto reference = summary_of(dir() / "one");
  // The third run takes its pipeline options from a config file, and recomputes.
  const fs::path config = dir() / "recompute.json";
  std::ofstream(config) << R"({"stages": 2, "pipeline_schedule": "grouped", "recompute": true})";
  for (const std::string schedule : {"grouped", "sequential", "recompute"}) {
    const fs::path run_dir = dir() / ("two-stages-" + schedule);
    const std::string options = schedule == "recompute"
                                    ? " --config " + config.string()
                                    : " --stages 2 --pipeline-schedule " + schedule;
    const Result r = run(mpirun(3) + common + run_dir.string() + options);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto summary = summary_of(run_dir);
    EXPECT_EQ(summary.at("test_loss"), reference.at("test_loss")) << schedule;
    EXPECT_EQ(summary.at("test_accuracy"), reference.at("test_accuracy")) << schedule;
    // Per-step losses (the metrics' loss column) match the single IPU's exactly.
    const auto losses = [&](const fs::path& d) {
      std::istringstream csv(read(d / "metrics.csv"));
      std::vector<std::string> out;
      for (std::string line; std::getline(csv, line);)
        out.push_back(line.substr(0, line.rfind(',')));
      return out;
    };
    EXPECT_EQ(losses(run_dir), losses(dir() / "one")) << schedule;
    const auto memory = nlohmann::json::parse(read(run_dir / "memory.json"));
    ASSERT_TRUE(memory[0].contains("later_stages")) << memory[0].dump().substr(0, 300);
    EXPECT_EQ(memory[0].at("later_stages").size(), 1u);
    EXPECT_EQ(summary.at("config").at("recompute").get<bool>(), schedule == "recompute");
  }
  // The grouped pipeline needs at least one micro-batch per stage.
  expect_bad_input(run(mpirun(3) + "train --model mlp --data " + data().string() +
                       " --arch tiny --stages 2 --gradient-accumulation 1 --run-dir " +
                       (dir() / "bad").string()),
                   "the grouped pipeline needs at least one micro-batch per stage");
}

TEST_F(PodTrain, TwoReplicasLearnAndEndWithBitwiseIdenticalWeights) {
  const fs::path run_dir = dir() / "run";
  const Result r = run(mpirun(3) + "train --model mlp --hidden 32 --data " + data().string() +
                       " --replicas 2 --micro-batch 10 --gradient-accumulation 2"
                       " --device-iterations 2 --epochs 2 --learning-rate 0.1 --arch tiny"
                       " --topology m2000 --run-dir " +
                       run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(run_dir / "summary.json");
  ASSERT_TRUE(in) << "no summary.json; output:\n" << r.output;
  const auto summary = nlohmann::json::parse(in);
  EXPECT_TRUE(summary.at("replica_weights_identical").get<bool>());
  const auto checksums = summary.at("replica_weight_checksums");
  ASSERT_EQ(checksums.size(), 2u);
  EXPECT_EQ(checksums[0], checksums[1]);
  // 4000 real images, two epochs: far above the 10% of guessing.
  EXPECT_GT(summary.at("test_accuracy").get<double>(), 0.70) << r.output;
  const auto epochs = summary.at("epochs");
  ASSERT_EQ(epochs.size(), 2u);
  EXPECT_LT(epochs[1].at("train_loss").get<double>(), epochs[0].at("train_loss").get<double>());
  EXPECT_GT(summary.at("measured_samples_per_s").get<double>(), 0);
  EXPECT_GT(summary.at("predicted_ipu_samples_per_s").get<double>(), 0);
  EXPECT_GT(summary.at("predicted_seconds_per_host_step").at("fabric").get<double>(), 0);
  EXPECT_EQ(summary.at("samples_trained").get<std::size_t>(), 2u * 4000u / 40u * 40u);
  std::ifstream mem(run_dir / "memory.json");
  const auto memory = nlohmann::json::parse(mem);
  ASSERT_EQ(memory.size(), 2u);
  EXPECT_EQ(memory[0].at("per_tile").size(), 32u);
  EXPECT_EQ(memory[0].at("tiles_over_capacity").get<int>(), 0);
  EXPECT_TRUE(fs::exists(run_dir / "metrics.csv"));
  std::ifstream tr(run_dir / "trace.json");
  const auto trace = nlohmann::json::parse(tr);
  std::set<int> pids;
  std::set<std::string> categories;
  for (const auto& e : trace.at("traceEvents")) {
    pids.insert(e.at("pid").get<int>());
    if (e.at("ph") == "X") categories.insert(e.at("cat").get<std::string>());
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
  for (const char* c : {"compute", "exchange", "sync", "host", "fabric"})
    EXPECT_TRUE(categories.count(c)) << c;
}

// trace.json of a pipelined pod: every IPU (both stages of both replicas) is a named process
// with named threads, each a window of at most --trace-events events from --trace-from-step on,
// in the Chrome trace format's shape (integer pid and tid, ts and dur in microseconds).
TEST_F(PodTrain, TraceJsonShowsEveryIpuOfThePodFromTheChosenStep) {
  std::map<int, double> first_event;  // earliest event of IPU 0 by --trace-from-step
  for (int from : {0, 3}) {
    const fs::path run_dir = dir() / ("trace-from-" + std::to_string(from));
    const Result r = run(mpirun(5) + "train --model mlp --hidden 16 --data " + data().string() +
                         " --replicas 2 --stages 2 --micro-batch 10 --gradient-accumulation 2"
                         " --epochs 1 --arch tiny --topology m2000 --trace-events 300"
                         " --trace-from-step " +
                         std::to_string(from) + " --run-dir " + run_dir.string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ifstream in(run_dir / "trace.json");
    const auto trace = nlohmann::json::parse(in);
    std::map<int, std::string> process_names;
    std::map<int, std::set<int>> named_threads, used_threads;
    std::map<int, std::size_t> events;
    std::map<int, double> earliest;
    std::map<int, std::vector<std::pair<double, double>>> compute;  // [begin, end) per IPU
    for (const auto& e : trace.at("traceEvents")) {
      const int pid = e.at("pid").get<int>();
      const std::string ph = e.at("ph");
      if (ph == "M") {
        if (e.at("name") == "process_name") process_names[pid] = e.at("args").at("name");
        if (e.at("name") == "thread_name") named_threads[pid].insert(e.at("tid").get<int>());
        continue;
      }
      ASSERT_EQ(ph, "X") << e.dump();
      const double ts = e.at("ts").get<double>(), dur = e.at("dur").get<double>();
      EXPECT_GE(ts, 0) << e.dump();
      EXPECT_GE(dur, 0) << e.dump();
      used_threads[pid].insert(e.at("tid").get<int>());
      if (e.at("cat") == "compute") compute[pid].emplace_back(ts, ts + dur);
      ++events[pid];
      earliest[pid] = earliest.count(pid) ? std::min(earliest[pid], ts) : ts;
    }
    ASSERT_EQ(process_names.size(), 4u) << "one process per IPU";
    EXPECT_EQ(process_names[3], "IPU 3 (replica 1, stage 1)");
    for (int ipu = 0; ipu < 4; ++ipu) {
      EXPECT_GT(events[ipu], 0u) << "IPU " << ipu;
      EXPECT_LE(events[ipu], 300u) << "IPU " << ipu;
      for (int tid : used_threads[ipu]) EXPECT_TRUE(named_threads[ipu].count(tid)) << tid;
    }
    // On one clock (the pipeline's syncs align the stages), replica 0's two stages compute at
    // the same time: the pipeline overlaps them.
    std::size_t overlapping = 0;
    for (const auto& [b0, e0] : compute[0])
      for (const auto& [b1, e1] : compute[1]) overlapping += b0 < e1 && b1 < e0 ? 1 : 0;
    EXPECT_GT(overlapping, 0u) << "the stages' compute never overlaps";
    first_event[from] = earliest[0];
  }
  // The window begins at host step 3: after the compile-time set-up and three steps' work.
  EXPECT_GT(first_event[3], first_event[0]);
}

// PopRun-style host instances: two host ranks, each serving one replica (of two stages) from
// its own reader, train the same weights, losses and test metrics as one host, bit for bit; a
// checkpoint of the two-instance run resumes under one host to the same end.
TEST_F(PodTrain, TwoHostInstancesTrainBitwiseLikeOneAndResumeUnderOne) {
  const std::string common = "train --model mlp --hidden 16 --data " + data().string() +
                             " --replicas 2 --stages 2 --micro-batch 10 --gradient-accumulation 2"
                             " --epochs 1 --arch tiny --topology m2000 --checkpoint-every 40"
                             " --checkpoint-keep 0 --run-dir ";
  const Result one = run(mpirun(5) + common + (dir() / "one-host").string());
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const Result two =
      run(mpirun(6) + common + (dir() / "two-hosts").string() + " --host-instances 2");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const auto read = [](const fs::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const auto summary = [&](const std::string& name) {
    return nlohmann::json::parse(read(dir() / name / "summary.json"));
  };
  const auto losses = [&](const std::string& name) {  // the csv without the measured rate
    std::istringstream csv(read(dir() / name / "metrics.csv"));
    std::vector<std::string> out;
    for (std::string line; std::getline(csv, line);) out.push_back(line.substr(0, line.rfind(',')));
    return out;
  };
  const auto a = summary("one-host"), b = summary("two-hosts");
  EXPECT_EQ(b.at("replica_weight_checksums"), a.at("replica_weight_checksums"));
  EXPECT_TRUE(b.at("replica_weights_identical").get<bool>());
  EXPECT_EQ(losses("two-hosts"), losses("one-host"));
  EXPECT_EQ(b.at("test_loss"), a.at("test_loss"));
  EXPECT_EQ(b.at("test_accuracy"), a.at("test_accuracy"));
  EXPECT_EQ(b.at("predicted_ipu_samples_per_s"), a.at("predicted_ipu_samples_per_s"));
  ASSERT_EQ(b.at("host_instances").size(), 2u);
  EXPECT_EQ(b.at("host_instances")[1].at("replicas"), nlohmann::json({1, 1}));
  EXPECT_EQ(b.at("ipu_ranks_host_memory").size(), 4u);  // every IPU's report reached the first
  // Only the first instance speaks: one banner, one line per epoch.
  EXPECT_EQ(two.output.find("replica(s) x"), two.output.rfind("replica(s) x")) << two.output;
  // The checkpoint after host step 40 of the two-instance run, resumed by one host.
  const Result resumed =
      run(mpirun(5) + common + (dir() / "resumed-one-host").string() + " --resume " +
          (dir() / "two-hosts" / "checkpoint-000040.h5").string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(summary("resumed-one-host").at("replica_weight_checksums"),
            a.at("replica_weight_checksums"));
  // Host instances must divide the replicas.
  expect_bad_input(run(mpirun(5) + "train --model mlp --data " + data().string() +
                       " --arch tiny --replicas 3 --host-instances 2 --run-dir " +
                       (dir() / "bad-instances").string()),
                   "--host-instances 2 must divide --replicas 3");
}

// A model exported from PyTorch (tests/models/onnx: the zoo's CNN at width 1/8) trains on two
// replicas from its exported weights, as a user's own model would; a missing file is bad input.
TEST_F(PodTrain, AnOnnxModelExportedFromPyTorchTrainsOnTheReplicas) {
  const fs::path run_dir = dir() / "onnx";
  const Result r = run(mpirun(3) + "train --model " + IPUPOD_ONNX_DIR + "/cnn_w0125.onnx" +
                       " --data " + data().string() +
                       " --replicas 2 --micro-batch 8 --epochs 1 --learning-rate 0.05"
                       " --arch tiny --topology m2000 --run-dir " +
                       run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(run_dir / "summary.json");
  const auto summary = nlohmann::json::parse(in);
  EXPECT_EQ(summary.at("parameters").get<std::size_t>(), 6806u);
  EXPECT_TRUE(summary.at("replica_weights_identical").get<bool>());
  EXPECT_GT(summary.at("test_accuracy").get<double>(), 0.5) << r.output;  // 10%: guessing
  expect_bad_input(run(mpirun(2) + "train --model " + (dir() / "missing.onnx").string() +
                       " --data " + data().string() + " --arch tiny"),
                   "no such ONNX file");
}

// A user's own split of an exported model (--split-at, as PopTorch's BeginBlock): the second
// convolution block begins stage 1, the job says so and trains; a block that names no op is
// bad input.
TEST_F(PodTrain, AnOnnxModelTrainsOnTheStagesItsSplitAtBlocksBegin) {
  const fs::path run_dir = dir() / "onnx-split";
  const std::string model = std::string(" --model ") + IPUPOD_ONNX_DIR + "/cnn_w0125.onnx";
  const Result r = run(mpirun(3) + "train" + model + " --data " + data().string() +
                       " --stages 2 --split-at features.4 --micro-batch 8"
                       " --gradient-accumulation 2 --epochs 1 --learning-rate 0.05"
                       " --arch tiny --topology m2000 --run-dir " +
                       run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("split at the --split-at blocks into 2 stages"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("stage 1: /features/features.4/Conv .."), std::string::npos) << r.output;
  std::ifstream in(run_dir / "summary.json");
  const auto summary = nlohmann::json::parse(in);
  EXPECT_EQ(summary.at("config").at("split_at"), nlohmann::json::array({"features.4"}));
  EXPECT_EQ(summary.at("parameters").get<std::size_t>(), 6806u);
  EXPECT_GT(summary.at("test_accuracy").get<double>(), 0.3) << r.output;  // 10%: guessing
  expect_bad_input(run(mpirun(3) + "train" + model + " --data " + data().string() +
                       " --stages 2 --split-at features.9 --gradient-accumulation 2 --arch tiny"),
                   "--split-at 'features.9': no forward compute op after");
}

// The main job in small: the HAE on real climate patches (Debian's netCDF fields), split over
// two pipeline stages, Adam on the tiles; the test PSNR over the valid cells rises epoch over
// epoch and the summary carries the compression ratio of the codes.
// Replicated tensor sharding over MPI: the same weights as plain data parallelism, bitwise
// (two replicas), with each IPU's optimizer state smaller by half of the moments.
TEST_F(PodTrain, ReplicatedTensorShardingTrainsTheSameWeightsWithLessOptimizerState) {
  std::map<bool, nlohmann::json> summaries;
  std::map<bool, std::size_t> optimizer_state;  // bytes on the first IPU
  for (bool sharding : {false, true}) {
    const fs::path run_dir = dir() / (sharding ? "rts" : "no-rts");
    const Result r = run(mpirun(3) + "train --model mlp --hidden 16 --data " + data().string() +
                         " --replicas 2 --micro-batch 10 --gradient-accumulation 2 --epochs 1"
                         " --optimizer adam --learning-rate 0.002 --arch tiny --topology m2000"
                         " --run-dir " +
                         run_dir.string() + (sharding ? " --replicated-tensor-sharding" : ""));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ifstream in(run_dir / "summary.json"), mem(run_dir / "memory.json");
    summaries[sharding] = nlohmann::json::parse(in);
    const auto memory = nlohmann::json::parse(mem);
    for (const auto& tile : memory[0].at("per_tile"))
      optimizer_state[sharding] += tile.at("by_category").value("optimizer_state", 0u);
  }
  EXPECT_EQ(summaries[true].at("replica_weight_checksums"),
            summaries[false].at("replica_weight_checksums"));
  // Accumulators, Adam's two moments: 3 x 4 bytes per parameter, then 4 + 2 x 2.
  const auto params = summaries[false].at("parameters").get<std::size_t>();
  EXPECT_EQ(optimizer_state[false], 12 * params);
  EXPECT_NEAR(static_cast<double>(optimizer_state[true]), 8.0 * static_cast<double>(params), 8.0);
  expect_bad_input(run(mpirun(3) + "train --data " + data().string() +
                       " --replicas 2 --optimizer lamb --replicated-tensor-sharding"),
                   "--replicated-tensor-sharding does not support --optimizer lamb");
}

TEST_F(PodTrain, HaeOnClimatePatchesImprovesItsPsnrOverTwoStages) {
  const fs::path climate = dir() / "climate32.h5";
  const Result convert = run(std::string(IPUPOD_BINARY) + " data climate --out " +
                             climate.string() + " --patch 32 --stride 28 --max-slices 3");
  ASSERT_EQ(convert.exit_code, 0) << convert.output;
  const fs::path run_dir = dir() / "hae";
  const Result r = run(mpirun(3) + "train --model hae --width 0.125 --data " + climate.string() +
                       " --stages 2 --micro-batch 4 --gradient-accumulation 2 --epochs 3"
                       " --optimizer adam --learning-rate 0.002 --arch mk2 --topology m2000"
                       " --timeout 600 --run-dir " +
                       run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("test PSNR"), std::string::npos) << r.output;
  std::ifstream in(run_dir / "summary.json");
  const auto summary = nlohmann::json::parse(in);
  EXPECT_EQ(summary.at("task"), "reconstruction");
  // 32x32 values of 32 bits against 4x4 + 2x2 codes of log2(32) bits.
  EXPECT_NEAR(summary.at("compression_ratio").get<double>(), 32.0 * 32 * 32 / (20 * 5), 1e-9);
  const auto& epochs = summary.at("epochs");
  ASSERT_EQ(epochs.size(), 3u);
  for (std::size_t e = 1; e < epochs.size(); ++e)
    EXPECT_GT(epochs[e].at("test_psnr_db").get<double>(),
              epochs[e - 1].at("test_psnr_db").get<double>())
        << "epoch " << e + 1 << "\n"
        << r.output;
  EXPECT_FALSE(summary.contains("test_accuracy"));
}

// A user's own autoencoder exported from PyTorch (tests/models/onnx/autoencoder.onnx, output
// the input's shape) trains on real climate patches with --loss mse against the field where
// its mask is 1, scored as the HAE is; without --loss it is bad input saying what to choose,
// and a zoo model refuses --loss.
TEST_F(PodTrain, AnOnnxAutoencoderTrainsOnClimateFieldsWithTheLossItIsGiven) {
  const fs::path climate = dir() / "climate8.h5";
  const Result convert = run(std::string(IPUPOD_BINARY) + " data climate --out " +
                             climate.string() + " --patch 8 --stride 8 --max-slices 1");
  ASSERT_EQ(convert.exit_code, 0) << convert.output;
  const std::string model = std::string(" --model ") + IPUPOD_ONNX_DIR + "/autoencoder.onnx";
  const fs::path run_dir = dir() / "onnx-ae";
  const Result r = run(mpirun(2) + "train" + model + " --loss mse --data " + climate.string() +
                       " --micro-batch 8 --epochs 3 --optimizer adam --learning-rate 0.01"
                       " --arch tiny --topology m2000 --run-dir " +
                       run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(run_dir / "summary.json");
  const auto summary = nlohmann::json::parse(in);
  EXPECT_EQ(summary.at("task"), "reconstruction");
  EXPECT_EQ(summary.at("config").at("loss"), "mse");
  EXPECT_FALSE(summary.contains("compression_ratio"));  // an imported model's codes are unknown
  const auto& epochs = summary.at("epochs");
  ASSERT_EQ(epochs.size(), 3u);
  EXPECT_GT(epochs[2].at("test_psnr_db").get<double>(), epochs[0].at("test_psnr_db").get<double>())
      << r.output;
  expect_bad_input(run(mpirun(2) + "train" + model + " --data " + climate.string() +
                       " --micro-batch 8 --arch tiny --run-dir " + (dir() / "ae-auto").string()),
                   "choose --loss mse or l1");
  expect_bad_input(run(mpirun(2) + "train --model hae --loss l1 --data " + climate.string() +
                       " --arch tiny --run-dir " + (dir() / "ae-zoo").string()),
                   "--loss l1: the zoo's model 'hae' is trained on its own loss");
}

// A model whose data does not fit its task stops at start-up and says what it needs.
TEST_F(PodTrain, DataOfTheWrongKindForTheModelIsBadInput) {
  expect_bad_input(run(mpirun(2) + "train --model hae --data " + data().string() +
                       " --arch tiny --run-dir " + (dir() / "wrong").string()),
                   "model hae: hae takes single-channel square patches");
  const fs::path climate = dir() / "climate-wrong.h5";
  ASSERT_EQ(run(std::string(IPUPOD_BINARY) + " data climate --out " + climate.string() +
                " --patch 32 --stride 28 --max-slices 1")
                .exit_code,
            0);
  expect_bad_input(run(mpirun(2) + "train --model cnn --data " + climate.string() +
                       " --arch tiny --run-dir " + (dir() / "wrong").string()),
                   "/targets must hold one int32 class label per sample for a classifier");
}

// A model that does not fit: exit 1 at start-up with the worst tiles' report, said once by the
// host whatever the number of IPUs (before, every IPU rank printed it and aborted the job), and
// every IPU's memory report in memory.json.
TEST_F(PodTrain, ModelThatDoesNotFitFailsWithTheTileReport) {
  const fs::path run_dir = dir() / "oom";
  const Result r = run(mpirun(3) + "train --hidden 1024 --data " + data().string() +
                       " --arch tiny --replicas 2 --run-dir " + run_dir.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  for (const char* part :
       {"IPU 0 (replica 0, stage 0): Out of memory: Cannot fit all variable "
        "data onto one or more tiles",
        "largest tensors: 'fc0.", "Try: more pipeline stages", "IPU's memory report is in "})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << " not in:\n" << r.output;
  EXPECT_EQ(r.output.find("Out of memory"), r.output.rfind("Out of memory")) << r.output;
  EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << r.output;
  std::ifstream in(run_dir / "memory.json");
  ASSERT_TRUE(in) << r.output;
  const auto memory = nlohmann::json::parse(in);
  ASSERT_EQ(memory.size(), 2u);
  for (const auto& ipu : memory) EXPECT_GT(ipu.at("tiles_over_capacity").get<int>(), 0);
}

// --allow-out-of-memory, which the out-of-memory advice names, compiles a model that does not
// fit and reports it: the job ends at start-up with exit 2, one message from the host, and every
// IPU's memory report (before, every IPU rank wrote to tile memory that does not exist and died
// on SIGSEGV).
TEST_F(PodTrain, AllowOutOfMemoryEndsWithOneMessageAndTheMemoryReport) {
  const fs::path run_dir = dir() / "allow-oom";
  const Result r =
      run(mpirun(3) + "train --hidden 1024 --data " + data().string() +
          " --arch tiny --replicas 2 --allow-out-of-memory --run-dir " + run_dir.string());
  expect_bad_input(r, "the model does not fit IPU 0 (replica 0, stage 0)");
  EXPECT_NE(r.output.find("Try: more pipeline stages"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("does not fit"), r.output.rfind("does not fit")) << r.output;
  std::ifstream in(run_dir / "memory.json");
  ASSERT_TRUE(in) << r.output;
  const auto memory = nlohmann::json::parse(in);
  ASSERT_EQ(memory.size(), 2u);
  for (const auto& ipu : memory) EXPECT_GT(ipu.at("tiles_over_capacity").get<int>(), 0);
}

// More stages than the model's split marks make: exit 2 at start-up, one message from the host
// with the counts `ipupod compile` gives (before: exit 1 from every IPU rank).
TEST_F(PodTrain, MoreStagesThanSplitMarksIsBadInput) {
  const Result r = run(mpirun(4) + "train --hidden 24 --data " + data().string() +
                       " --arch tiny --stages 3 --gradient-accumulation 3 --run-dir " +
                       (dir() / "stages").string());
  expect_bad_input(r, "--stages 3: model 'mlp' splits into at most 2 pipeline stages");
  EXPECT_NE(r.output.find("choose --stages 2 or fewer"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("splits into"), r.output.rfind("splits into")) << r.output;
}

// A data file truncated while the job runs: both replicas' feeders find it; the job ends with
// exit 1 and the reason printed once (before: once per feeder, and at times SIGABRT when both
// called MPI_Abort).
TEST_F(PodTrain, DataTruncatedWhileTrainingEndsTheJobOnceWithTheReason) {
  const fs::path copy = dir() / "truncated.h5", log = dir() / "truncated.log",
                 script = dir() / "truncate.sh";
  fs::copy_file(data(), copy, fs::copy_options::overwrite_existing);
  // Start a long run, truncate the file once it trains, and wait for the job's end.
  std::ofstream(script) << mpirun(3) << "train --hidden 16 --data " << copy.string()
                        << " --arch tiny --replicas 2 --micro-batch 4 --epochs 1000 --run-dir "
                        << (dir() / "truncated").string() << " > " << log.string() << " 2>&1 &\n"
                        << "job=$!\n"
                        << "for i in $(seq 1 600); do grep -q ' step ' " << log.string()
                        << " && break; sleep 0.2; done\n"
                        << "truncate -s 100000 " << copy.string() << "\n"
                        << "wait $job\n"
                        << "echo \"job exit code $?\"\n"
                        << "cat " << log.string() << "\n";
  const Result r = run("sh " + script.string(), 300);
  EXPECT_NE(r.output.find("job exit code 1\n"), std::string::npos) << r.output;
  const std::string reason = "(was it truncated or rewritten while the job ran?)";
  EXPECT_NE(r.output.find(reason), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(reason), r.output.rfind(reason)) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
}

// Under mpirun every rank parses the arguments; an option out of range is reported once.
TEST_F(PodTrain, AnOptionOutOfRangeIsReportedOnceUnderMpirun) {
  const Result r =
      run(mpirun(3) + "train --replicas 2 --data " + data().string() + " --micro-batch=-1");
  expect_bad_input(r, "--micro-batch: expected a whole number in [1, 2147483647], got '-1'");
  EXPECT_EQ(r.output.find("--micro-batch:"), r.output.rfind("--micro-batch:")) << r.output;
}

TEST_F(PodTrain, MissingDataFileIsBadInput) {
  expect_bad_input(
      run(mpirun(3) + "train --data " + (dir() / "absent.h5").string() + " --replicas 2"),
      "does not exist");
}

TEST_F(PodTrain, NonHdf5DataFileIsBadInput) {
  const fs::path bogus = dir() / "bogus.h5";
  std::ofstream(bogus) << "this is not HDF5\n";
  expect_bad_input(run(mpirun(2) + "train --data " + bogus.string()), "not an HDF5 file");
}

TEST_F(PodTrain, WorldSizeNotMatchingReplicasIsBadInput) {
  expect_bad_input(run(mpirun(2) + "train --data " + data().string() + " --replicas 2"),
                   "needs 3; run with `mpirun -n 3");
}

TEST_F(PodTrain, UnknownModelIsBadInput) {
  expect_bad_input(run(mpirun(2) + "train --model resnet-5000 --data " + data().string()),
                   "unknown model 'resnet-5000'");
}

TEST_F(PodTrain, GlobalBatchLargerThanTheDataIsBadInput) {
  expect_bad_input(run(mpirun(2) + "train --data " + data().string() + " --micro-batch 5000"),
                   "fewer than one global batch");
}

// --precision fp16 from a config file: the run learns and says so in summary.json; a loss
// scale past float16's range stops the job at the first non-finite loss with advice.
TEST_F(PodTrain, Float16FromAConfigFileAndATooLargeLossScale) {
  const fs::path config = dir() / "fp16.json";
  std::ofstream(config)
      << R"({"precision": "fp16", "stochastic_rounding": "on", "loss_scaling": 64, "hidden": [24]})";
  const std::string common = "train --config " + config.string() + " --data " + data().string() +
                             " --micro-batch 16 --learning-rate 0.1 --arch tiny --run-dir ";
  const Result r = run(mpirun(2) + common + (dir() / "fp16").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(dir() / "fp16" / "summary.json");
  const auto summary = nlohmann::json::parse(in);
  EXPECT_EQ(summary.at("config").at("precision"), "fp16");
  EXPECT_EQ(summary.at("config").at("stochastic_rounding"), "on");
  EXPECT_EQ(summary.at("config").at("loss_scaling"), 64.0);
  EXPECT_GT(summary.at("test_accuracy").get<double>(), 0.6);

  const Result overflow =
      run(mpirun(2) + common + (dir() / "fp16-overflow").string() + " --loss-scaling 1e9");
  EXPECT_EQ(overflow.exit_code, 1) << overflow.output;
  EXPECT_NE(overflow.output.find("float16 overflowed"), std::string::npos) << overflow.output;
  EXPECT_NE(overflow.output.find("lower --loss-scaling"), std::string::npos) << overflow.output;
}

TEST_F(PodTrain, UsageErrorsExitTwoAndHelpDescribesEveryOption) {
  expect_bad_input(run(std::string(IPUPOD_BINARY) + " train --replicas 2"), "--data is required");
  const std::string train = std::string(IPUPOD_BINARY) + " train --data " + data().string();
  expect_bad_input(run(train + " --recompute"), "needs --stages 2 or more");
  expect_bad_input(run(train + " --available-memory-proportion 0"),
                   "--available-memory-proportion: expected a finite number in (0, 1]");
  expect_bad_input(run(train + " --shuffle-window 256 --no-shuffle"), "drop one of them");
  expect_bad_input(run(train + " --config " + (dir() / "absent.json").string()), "cannot read");
  const fs::path config = dir() / "typo.json";
  std::ofstream(config) << R"({"micro_batch": 4, "replica": 2})";
  expect_bad_input(run(train + " --config " + config.string()),
                   "names 'replica', which is not an option of `ipupod train`");
  std::ofstream(config) << "micro-batch = 4";
  expect_bad_input(run(train + " --config " + config.string()), "is not valid JSON");
  const Result help = run(std::string(IPUPOD_BINARY) + " train --help");
  EXPECT_EQ(help.exit_code, 0);
  for (const char* option : {"--model",
                             "--data",
                             "--replicas",
                             "--stages",
                             "--micro-batch",
                             "--gradient-accumulation",
                             "--device-iterations",
                             "--epochs",
                             "--arch",
                             "--run-dir",
                             "--config",
                             "--recompute",
                             "--clip-norm",
                             "lamb",
                             "--precision",
                             "--loss-scaling",
                             "--stochastic-rounding",
                             "--replicated-tensor-sharding",
                             "--available-memory-proportion",
                             "--shuffle-window"})
    EXPECT_NE(help.output.find(option), std::string::npos) << option;
}

}  // namespace
