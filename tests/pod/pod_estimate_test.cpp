// `ipupod estimate`: its prediction is train's (one cost model: the same compiled programs and
// cycle accounting, timed instead of run), the pipeline's waits are played as the engine's
// external syncs release them, and the bound it names is the part that takes longest.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "pod/job/step_timing.hpp"
#include "tests/pod/run_command.hpp"

namespace {

namespace fs = std::filesystem;

using ipupod::ipu::CycleBreakdown;
using ipupod::pod::play_pipeline;
using ipupod::pod::StageTiming;
using ipupod::testing_support::Result;
using ipupod::testing_support::run;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// A grouped pipeline by hand: G micro-batches over S stages in G + S - 1 slots, stage s busy
// for `busy` cycles in slots s .. s + G - 1 and idle in the others, an external sync after
// every slot. Stage 0 ends after (G + S - 1) x busy cycles, of which (S - 1) x busy waiting:
// the pipeline's bubble.
// The rows of an estimate CSV after its header, each split into cells.
std::vector<std::vector<std::string>> csv_rows(const fs::path& p, std::string* header = nullptr) {
  std::ifstream csv(p);
  std::string row;
  std::getline(csv, row);
  if (header) *header = row;
  std::vector<std::vector<std::string>> rows;
  while (std::getline(csv, row)) {
    std::vector<std::string>& cells = rows.emplace_back();
    std::stringstream cells_of(row);
    for (std::string cell; std::getline(cells_of, cell, ',');) cells.push_back(cell);
  }
  return rows;
}

TEST(PlayPipeline, TheGroupedPipelinesBubbleIsTheRampOfItsStages) {
  const std::size_t micro_batches = 5, stages = 3, slots = micro_batches + stages - 1;
  const std::uint64_t busy = 1000;
  std::vector<StageTiming> timings(stages);
  for (std::size_t s = 0; s < stages; ++s) {
    CycleBreakdown clock;
    for (std::size_t slot = 0; slot < slots; ++slot) {
      if (slot >= s && slot < s + micro_batches) clock.compute += busy;
      timings[s].at_syncs.push_back(clock);
    }
    timings[s].step_ends.push_back(clock);
    timings[s].syncs_at_step_ends.push_back(slots);
    timings[s].collectives_at_step_ends.push_back(0);
  }
  const auto played = play_pipeline(timings);
  for (std::size_t s = 0; s < stages; ++s) {
    const auto step = played.steps(s, 0, 1);
    EXPECT_EQ(step.cycles.compute, micro_batches * busy) << s;
    EXPECT_EQ(step.waits, (stages - 1) * busy) << s;
    EXPECT_EQ(step.cycles.total(), slots * busy) << s;
  }
}

// Stages that do not reach the same syncs cannot be one pipeline.
TEST(PlayPipeline, StagesWithDifferentSyncsAreRefused) {
  std::vector<StageTiming> timings(2);
  timings[0].at_syncs = {CycleBreakdown{.compute = 1}};
  timings[0].step_ends = {CycleBreakdown{.compute = 1}};
  timings[0].syncs_at_step_ends = {1};
  timings[0].collectives_at_step_ends = {0};
  timings[1].step_ends = {CycleBreakdown{.compute = 1}};
  timings[1].syncs_at_step_ends = {0};
  timings[1].collectives_at_step_ends = {0};
  EXPECT_THROW(play_pipeline(timings), std::invalid_argument);
}

std::string mpirun(int ranks) {
  return std::string(IPUPOD_MPIEXEC) + " -n " + std::to_string(ranks) +
         " --oversubscribe --allow-run-as-root " + IPUPOD_BINARY + " ";
}

class PodEstimate : public ::testing::Test {
 protected:
  static constexpr std::size_t kTrainSamples = 768;
  static fs::path dir() {
    return fs::temp_directory_path() / ("ipupod_pod_estimate_" + std::to_string(getpid()));
  }
  static fs::path data() { return dir() / "fashion-mnist-small.h5"; }
  static void SetUpTestSuite() {
    fs::create_directories(dir());
    const Result r =
        run(std::string(IPUPOD_BINARY) + " data fashion-mnist --out " + data().string() +
            " --limit-train " + std::to_string(kTrainSamples) + " --limit-test 64");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir()); }
};

// For jobs train can run here (data parallel, pipelined, both; with accumulation and device
// iterations), the estimate is train's predicted samples/s: exactly when it times the same
// steps (no warm-up, as many steps as the epoch), within 1% with its defaults (the steady
// steps after a warm-up one).
TEST_F(PodEstimate, EqualsTrainsPredictionOnJobsTrainCanRun) {
  struct Job {
    std::size_t replicas, stages, accumulation, iterations;
  };
  for (const Job& job : {Job{1, 1, 1, 1}, Job{2, 1, 2, 2}, Job{1, 2, 3, 1}, Job{2, 2, 2, 2}}) {
    const std::string name = std::to_string(job.replicas) + "x" + std::to_string(job.stages) +
                             "-g" + std::to_string(job.accumulation) + "-d" +
                             std::to_string(job.iterations);
    const std::size_t micro_batch = 8;
    const std::string options =
        " --model mlp --hidden 24 --arch tiny --topology m2000 --micro-batch " +
        std::to_string(micro_batch) + " --replicas " + std::to_string(job.replicas) + " --stages " +
        std::to_string(job.stages) + " --gradient-accumulation " +
        std::to_string(job.accumulation) + " --device-iterations " + std::to_string(job.iterations);
    const fs::path train_dir = dir() / ("train-" + name);
    const Result trained =
        run(mpirun(static_cast<int>(1 + job.replicas * job.stages)) + "train --data " +
            data().string() + " --epochs 1 --run-dir " + train_dir.string() + options);
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    const double train_predicted =
        read_json(train_dir / "summary.json").at("predicted_ipu_samples_per_s");
    ASSERT_GT(train_predicted, 0) << name;
    const std::size_t steps =
        kTrainSamples / (micro_batch * job.accumulation * job.iterations * job.replicas);

    const fs::path same_steps = dir() / ("estimate-" + name);
    const Result exact = run(std::string(IPUPOD_BINARY) + " estimate --warm-up-steps 0 --steps " +
                             std::to_string(steps) + " --run-dir " + same_steps.string() + options);
    ASSERT_EQ(exact.exit_code, 0) << exact.output;
    const double estimated = read_json(same_steps / "estimate.json").at("predicted_samples_per_s");
    EXPECT_NEAR(estimated / train_predicted, 1.0, 1e-9)
        << name << ": train " << train_predicted << ", estimate " << estimated;

    const fs::path defaults = dir() / ("estimate-default-" + name);
    const Result steady =
        run(std::string(IPUPOD_BINARY) + " estimate --run-dir " + defaults.string() + options);
    ASSERT_EQ(steady.exit_code, 0) << steady.output;
    const auto estimate = read_json(defaults / "estimate.json");
    EXPECT_NEAR(estimate.at("predicted_samples_per_s").get<double>() / train_predicted, 1.0, 0.01)
        << name;
    EXPECT_EQ(estimate.at("stages").size(), job.stages);
    EXPECT_NE(steady.output.find("predicted: "), std::string::npos) << steady.output;
  }
}

// Under mpirun the stages compile on different ranks and the estimate is the same.
TEST_F(PodEstimate, StagesOnSeveralRanksGiveTheSameEstimate) {
  const std::string options =
      " --model mlp --hidden 24 --arch tiny --topology m2000 --micro-batch 4 --replicas 2 "
      "--stages 2 --gradient-accumulation 4";
  const Result alone = run(std::string(IPUPOD_BINARY) + " estimate --run-dir " +
                           (dir() / "alone").string() + options);
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  const Result spread =
      run(mpirun(2) + "estimate --run-dir " + (dir() / "spread").string() + options);
  ASSERT_EQ(spread.exit_code, 0) << spread.output;
  EXPECT_EQ(read_json(dir() / "alone" / "estimate.json").at("predicted_samples_per_s"),
            read_json(dir() / "spread" / "estimate.json").at("predicted_samples_per_s"));
}

// A host that prepares too few samples bounds the job; without a host input rate the bound is
// the largest part of the IPUs' own time.
TEST_F(PodEstimate, NamesTheHostInputOrThePartOfTheIpusTimeThatBoundsTheJob) {
  const std::string options =
      " --model mlp --hidden 24 --arch tiny --topology m2000 --micro-batch 16 --run-dir ";
  const Result ipu =
      run(std::string(IPUPOD_BINARY) + " estimate" + options + (dir() / "ipu-bound").string());
  ASSERT_EQ(ipu.exit_code, 0) << ipu.output;
  const auto ipu_bound = read_json(dir() / "ipu-bound" / "estimate.json");
  const auto& parts = ipu_bound.at("breakdown_seconds_per_host_step");
  std::string largest;
  double most = -1;
  for (const auto& [name, seconds] : parts.items())
    if (seconds.get<double>() > most) most = seconds, largest = name;
  EXPECT_EQ(ipu_bound.at("bound"), largest);
  EXPECT_NE(largest, "host input");
  EXPECT_EQ(ipu_bound.at("predicted_samples_per_s"), ipu_bound.at("predicted_ipu_samples_per_s"));

  // 16 samples per step at 100 samples/s: 0.16 s, far longer than the IPU's microseconds.
  const Result host = run(std::string(IPUPOD_BINARY) + " estimate --host-input-rate 100" + options +
                          (dir() / "host-bound").string());
  ASSERT_EQ(host.exit_code, 0) << host.output;
  const auto host_bound = read_json(dir() / "host-bound" / "estimate.json");
  EXPECT_EQ(host_bound.at("bound"), "host input");
  EXPECT_NEAR(host_bound.at("predicted_samples_per_s").get<double>(), 100.0, 1e-6);
  EXPECT_NE(host.output.find("bound by host input"), std::string::npos) << host.output;
}

// The syncs across IPUs cost what the topology says for the scope the job's IPUs span: the same
// 2-stage job on two IPUs of one machine and on two machines (with identical links) differs
// only in its sync time.
TEST_F(PodEstimate, ASyncAcrossMachinesCostsTheTopologysWiderScope) {
  const auto topology = [&](const std::string& name, int machines, int ipus_per_machine) {
    const fs::path file = dir() / (name + ".json");
    std::ofstream(file) << R"({"name": ")" << name << R"(", "layout": "test", "pods": 1,
      "machines_per_pod": )"
                        << machines << R"(, "ipus_per_machine": )" << ipus_per_machine << R"(,
      "links": {"within_machine": {"bandwidth_gbytes_per_s": 32, "latency_us": 1, "source": "test"},
                "between_machines": {"bandwidth_gbytes_per_s": 32, "latency_us": 1, "source": "test"},
                "between_pods": {"bandwidth_gbytes_per_s": 32, "latency_us": 1, "source": "test"}},
      "sync_us": {"within_machine": 0.4, "within_pod": 20, "between_pods": 40, "source": "test"}})";
    return file.string();
  };
  const auto estimate = [&](const std::string& topology_file, const std::string& name) {
    const Result r = run(std::string(IPUPOD_BINARY) +
                         " estimate --model mlp --hidden 24 --arch tiny --micro-batch 8 "
                         "--stages 2 --topology " +
                         topology_file + " --run-dir " + (dir() / name).string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return read_json(dir() / name / "estimate.json");
  };
  const auto one_machine = estimate(topology("one-machine", 1, 2), "sync-one-machine");
  const auto two_machines = estimate(topology("two-machines", 2, 1), "sync-two-machines");
  const auto part = [](const nlohmann::json& e, const char* name) {
    return e.at("breakdown_seconds_per_host_step").at(name).get<double>();
  };
  EXPECT_GT(part(two_machines, "sync"), part(one_machine, "sync") + 19e-6)
      << "at least one 20 us sync instead of a 0.4 us one";
  EXPECT_LT(two_machines.at("predicted_samples_per_s").get<double>(),
            one_machine.at("predicted_samples_per_s").get<double>());
  for (const char* same : {"IPU compute", "exchange", "pipeline transfers"})
    EXPECT_DOUBLE_EQ(part(two_machines, same), part(one_machine, same)) << same;
}

// A sweep compiles each stage once per stage count and replica class (one replica, or several)
// for all its accumulation and iteration counts, and each of its rows is the estimate of that
// configuration alone.
TEST_F(PodEstimate, ASweepSharesItsCompilesAndEachRowIsThatJobsEstimate) {
  const std::string model =
      " --model mlp --hidden 24 --arch tiny --topology pod16 --micro-batch 4 --run-dir ";
  const Result sweep =
      run(std::string(IPUPOD_BINARY) + " estimate" + model + (dir() / "sweep").string() +
          " --sweep-replicas 1,2,4 --sweep-stages 1,2"
          " --sweep-gradient-accumulation 2,4 --sweep-device-iterations 1,3");
  ASSERT_EQ(sweep.exit_code, 0) << sweep.output;
  // (1 + 2 stages) x (one replica, several replicas) compiles for 24 configurations.
  EXPECT_NE(sweep.output.find("24 configurations from 6 stage compiles"), std::string::npos)
      << sweep.output;
  std::string header;
  const auto rows = csv_rows(dir() / "sweep" / "estimate.csv", &header);
  std::map<std::string, double> predicted;  // "R S G D" -> samples/s
  for (const auto& cells : rows) {
    ASSERT_GE(cells.size(), 12u);
    predicted[cells[3] + " " + cells[4] + " " + cells[5] + " " + cells[6]] = std::stod(cells[11]);
  }
  EXPECT_EQ(rows.size(), 24u);
  EXPECT_EQ(header.substr(0, 24), "model,arch,topology,repl");
  for (const std::string job : {"2 2 4 3", "4 1 2 1", "1 2 2 3"}) {
    std::stringstream counts(job);
    std::size_t r = 0, s = 0, g = 0, d = 0;
    counts >> r >> s >> g >> d;
    const fs::path alone = dir() / ("alone-" + std::to_string(r) + std::to_string(s) +
                                    std::to_string(g) + std::to_string(d));
    const Result one =
        run(std::string(IPUPOD_BINARY) + " estimate" + model + alone.string() + " --replicas " +
            std::to_string(r) + " --stages " + std::to_string(s) + " --gradient-accumulation " +
            std::to_string(g) + " --device-iterations " + std::to_string(d));
    ASSERT_EQ(one.exit_code, 0) << one.output;
    ASSERT_TRUE(predicted.count(job)) << job;
    // A single configuration writes its row too (scripts read the CSV whatever they ask).
    const auto own = csv_rows(alone / "estimate.csv");
    ASSERT_EQ(own.size(), 1u) << one.output;
    ASSERT_GE(own[0].size(), 12u);
    EXPECT_NEAR(std::stod(own[0][11]) / predicted[job], 1.0, 1e-9) << job;
    EXPECT_NEAR(predicted[job] /
                    read_json(alone / "estimate.json").at("predicted_samples_per_s").get<double>(),
                1.0, 1e-9)
        << job;
  }
  // A configuration the pipeline cannot run is named.
  const Result bad =
      run(std::string(IPUPOD_BINARY) + " estimate" + model + (dir() / "bad-sweep").string() +
          " --sweep-stages 1,2 --sweep-gradient-accumulation 1,4");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("1 replicas x 2 stages, accumulation 1"), std::string::npos)
      << bad.output;
}

// A sweep over topologies times the same compiled stages on each: one compile per stage, and
// each row equals the estimate on that topology alone.
TEST_F(PodEstimate, ASweepOverTopologiesTimesTheSameCompiles) {
  const std::string model =
      " --model mlp --hidden 24 --arch tiny --micro-batch 4 --stages 2 --replicas 4 --run-dir ";
  const Result sweep =
      run(std::string(IPUPOD_BINARY) + " estimate" + model + (dir() / "topology-sweep").string() +
          " --sweep-topologies pod16,pod64,pod256");
  ASSERT_EQ(sweep.exit_code, 0) << sweep.output;
  EXPECT_NE(sweep.output.find("3 configurations from 2 stage compiles"), std::string::npos)
      << sweep.output;
  std::map<std::string, double> predicted;  // topology -> samples/s
  for (const auto& cells : csv_rows(dir() / "topology-sweep" / "estimate.csv")) {
    ASSERT_GE(cells.size(), 12u);
    predicted[cells[2]] = std::stod(cells[11]);
  }
  ASSERT_EQ(predicted.size(), 3u);
  // Across topologies, a combination a topology is too small for is left out.
  const Result mixed =
      run(std::string(IPUPOD_BINARY) +
          " estimate --model mlp --hidden 24 --arch tiny --micro-batch 4 --run-dir " +
          (dir() / "topology-sizes").string() +
          " --sweep-topologies m2000,pod16 --sweep-replicas 4,16");
  ASSERT_EQ(mixed.exit_code, 0) << mixed.output;
  EXPECT_EQ(csv_rows(dir() / "topology-sizes" / "estimate.csv").size(), 3u) << mixed.output;
  const Result none = run(
      std::string(IPUPOD_BINARY) +
      " estimate --model mlp --hidden 24 --arch tiny --micro-batch 4 --run-dir " +
      (dir() / "topology-none").string() + " --sweep-topologies m2000,pod16 --sweep-replicas 32");
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("no configuration of the sweep fits"), std::string::npos)
      << none.output;
  for (const std::string topology : {"pod16", "pod256"}) {
    const fs::path alone = dir() / ("topology-" + topology);
    const Result one = run(std::string(IPUPOD_BINARY) + " estimate" + model + alone.string() +
                           " --topology " + topology);
    ASSERT_EQ(one.exit_code, 0) << one.output;
    EXPECT_NEAR(predicted[topology] /
                    read_json(alone / "estimate.json").at("predicted_samples_per_s").get<double>(),
                1.0, 1e-9)
        << topology;
  }
}

// A training run's config file serves an estimate as it is: the options that do not shape the
// timing (data, epochs, learning rate) are left out, the others taken.
TEST_F(PodEstimate, TakesATrainingRunsConfigFile) {
  const fs::path config = dir() / "train.json";
  std::ofstream(config) << R"({"model": "mlp", "hidden": [24], "data": "elsewhere.h5", )"
                        << R"("epochs": 3, "learning-rate": 0.5, "arch": "tiny", "stages": 2, )"
                        << R"("gradient_accumulation": 4, "micro-batch": 4})";
  const Result r = run(std::string(IPUPOD_BINARY) + " estimate --config " + config.string() +
                       " --run-dir " + (dir() / "from-config").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto estimate = read_json(dir() / "from-config" / "estimate.json");
  EXPECT_EQ(estimate.at("stages").size(), 2u);
  EXPECT_EQ(estimate.at("config").at("gradient_accumulation"), 4);
  EXPECT_EQ(estimate.at("samples_per_host_step"), 16.0);
  // An option of neither command is still an error.
  std::ofstream(config) << R"({"model": "mlp", "no-such-option": 1})";
  const Result bad = run(std::string(IPUPOD_BINARY) + " estimate --config " + config.string());
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("no-such-option"), std::string::npos) << bad.output;
}

TEST_F(PodEstimate, BadJobsAreBadInput) {
  const std::string estimate = std::string(IPUPOD_BINARY) + " estimate --run-dir " +
                               (dir() / "bad").string() + " --arch tiny ";
  const auto expect_bad = [](const Result& r, const std::string& message) {
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << "expected '" << message << "' in:\n"
                                                         << r.output;
  };
  expect_bad(run(estimate + "--model mlp --topology pod7"), "--topology");
  expect_bad(run(estimate + "--model mlp --topology m2000 --replicas 8"),
             "--topology m2000 has 4 IPUs, the run needs 8");
  expect_bad(run(estimate + "--model mlp --stages 9 --topology pod16"), "stages");
  expect_bad(run(estimate + "--model mlp --host-input-rate -1"), "--host-input-rate");
  expect_bad(run(estimate + "--model nosuch"), "unknown model");
}

}  // namespace
