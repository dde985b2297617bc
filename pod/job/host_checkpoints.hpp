// The host's side of checkpoints: the run's progress and figures a checkpoint carries besides
// the tensors, writing checkpoint-<host step>.h5 from replica 0's frames, and reading --resume.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "host/checkpoint.hpp"
#include "host/stream_server.hpp"
#include "pod/config.hpp"
#include "pod/job/protocol.hpp"

namespace ipupod::pod {

struct EpochMetrics {
  std::size_t epoch = 0;
  double train_loss = 0, test_loss = 0;
  std::map<std::string, double> scores;  // by the model's task (scoring.hpp)
  std::size_t test_samples = 0;
  double measured_samples_per_s = 0, predicted_samples_per_s = 0;
};

nlohmann::json metrics_json(const EpochMetrics& m);
EpochMetrics metrics_from_json(const nlohmann::json& j);

// The host's side of a run that a checkpoint carries besides the tensors: where training stands
// and the running figures that the reports continue from.
struct Progress {
  std::size_t epoch = 0, step = 0;  // the next step to run
  std::uint64_t host_step = 0;      // host steps done
  double epoch_loss = 0;            // sum of the step losses of the current epoch so far
  double train_seconds = 0;
  std::vector<EpochMetrics> epochs;
  std::string csv;
  std::vector<std::uint64_t> cycles;  // predicted training cycles so far (replica 0), by kind
};

// The data-derived facts a resumed run must share with the checkpoint's, next to the options.
nlohmann::json checkpoint_config(const TrainConfig& c, const Startup& startup);

// Writes checkpoint-<host step>.h5 from replica 0's manifest and tensors, then removes the
// oldest of this run's checkpoints beyond --checkpoint-keep.
void write_checkpoint(host::StreamServer& server, const TrainConfig& c, const Startup& startup,
                      Progress progress, std::deque<std::string>& written);

// Readies the run directory for this run's checkpoints: removes the temporary files a crash
// during a write left there (of checkpoints, their metrics files and the run's reports), and
// returns the checkpoints already there that --checkpoint-keep counts with the ones this run
// writes, oldest first: on a resume those up to the step it resumes from (written before it, by
// the run it continues), on a fresh start none.
std::deque<std::string> prepare_checkpoint_directory(const TrainConfig& c, const Startup& startup);

// Reads --resume, checks that this run continues the checkpoint's, and fills the start-up
// record and the host's progress from it. UsageError / CheckpointError on a mismatch.
host::Checkpoint load_resume(const TrainConfig& c, Startup& startup, Progress& progress);

}  // namespace ipupod::pod
