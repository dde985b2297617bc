// Host-side checkpoints of a training job.
#include "pod/job/host_checkpoints.hpp"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>

namespace ipupod::pod {

nlohmann::json metrics_json(const EpochMetrics& m) {
  nlohmann::json j = {{"epoch", m.epoch + 1},
                      {"train_loss", m.train_loss},
                      {"test_loss", m.test_loss},
                      {"test_samples", m.test_samples},
                      {"measured_samples_per_s", m.measured_samples_per_s},
                      {"predicted_samples_per_s", m.predicted_samples_per_s}};
  for (const auto& [name, value] : m.scores) j[name] = value;
  return j;
}

EpochMetrics metrics_from_json(const nlohmann::json& j) {
  EpochMetrics m;
  m.epoch = j.at("epoch").get<std::size_t>() - 1;
  m.train_loss = j.at("train_loss");
  m.test_loss = j.at("test_loss");
  m.test_samples = j.at("test_samples");
  m.measured_samples_per_s = j.at("measured_samples_per_s");
  m.predicted_samples_per_s = j.at("predicted_samples_per_s");
  static const std::set<std::string> common = {"epoch",
                                               "train_loss",
                                               "test_loss",
                                               "test_samples",
                                               "measured_samples_per_s",
                                               "predicted_samples_per_s"};
  for (const auto& [name, value] : j.items())
    if (!common.contains(name) && value.is_number()) m.scores[name] = value.get<double>();
  return m;
}

nlohmann::json checkpoint_config(const TrainConfig& c, const Startup& startup) {
  nlohmann::json j = config_json(c);
  j["train_steps"] = startup.train_steps;
  j["test_steps"] = startup.test_steps;
  j["sample_shape"] = startup.sample_shape;
  j["classes"] = startup.classes;
  return j;
}

void write_checkpoint(host::StreamServer& server, const TrainConfig& c, const Startup& startup,
                      Progress progress, std::deque<std::string>& written) {
  const host::Frame manifest_frame = expect_frame(server, 0, kCheckpointFrames);
  const auto text = manifest_frame.array.as<const std::uint8_t>();
  const nlohmann::json manifest = nlohmann::json::parse(text.begin(), text.end());
  host::Checkpoint checkpoint;
  checkpoint.step = progress.host_step;
  for (const auto& name : manifest.at("names"))
    checkpoint.tensors[name.get<std::string>()] =
        std::move(expect_frame(server, 0, kCheckpointFrames).array);
  progress.cycles = manifest.at("cycles").get<std::vector<std::uint64_t>>();
  checkpoint.config_json = checkpoint_config(c, startup).dump();
  nlohmann::json epochs = nlohmann::json::array();
  for (const auto& m : progress.epochs) epochs.push_back(metrics_json(m));
  checkpoint.state_json = nlohmann::json{
      {"epoch", progress.epoch},
      {"step", progress.step},
      {"host_step", progress.host_step},
      {"epoch_loss", progress.epoch_loss},
      {"train_seconds", progress.train_seconds},
      {"epochs", epochs},
      {"metrics_csv", progress.csv},
      {"cycles",
       progress.cycles}}.dump();
  // The loader's order is a pure function of (seed, epoch): that pair is its whole RNG state.
  checkpoint.rng_states["loader_shuffle"] = nlohmann::json{
      {"generator", "mt19937_64 Fisher-Yates, seeded from (seed, epoch)"},
      {"seed", c.seed},
      {"shuffle", c.shuffle},
      {"shuffle_window", c.shuffle_window},
      {"epoch", progress.epoch}}.dump();
  char name[64];
  std::snprintf(name, sizeof name, "checkpoint-%06llu.h5",
                static_cast<unsigned long long>(progress.host_step));
  const std::string path = (std::filesystem::path(c.run_dir) / name).string();
  host::save_checkpoint(path, checkpoint);
  written.push_back(path);
  while (c.checkpoint_keep > 0 && written.size() > c.checkpoint_keep) {
    std::error_code ignored;
    std::filesystem::remove(written.front(), ignored);
    written.pop_front();
  }
  std::cout << "  checkpoint " << path << " ("
            << (progress.step == 0
                    ? "after epoch " + std::to_string(progress.epoch) + " and its evaluation"
                    : "epoch " + std::to_string(progress.epoch + 1) + ", step " +
                          std::to_string(progress.step) + " of " +
                          std::to_string(startup.train_steps))
            << ")" << std::endl;
}

host::Checkpoint load_resume(const TrainConfig& c, Startup& startup, Progress& progress) {
  host::Checkpoint checkpoint = host::load_checkpoint(c.resume);
  nlohmann::json saved, state;
  try {
    saved = nlohmann::json::parse(checkpoint.config_json);
    state = nlohmann::json::parse(checkpoint.state_json);
  } catch (const nlohmann::json::exception& e) {
    throw host::CheckpointError("checkpoint '" + c.resume +
                                "' has a damaged configuration or state record: " + e.what());
  }
  std::vector<std::string> differences = resume_differences(c, saved);
  const nlohmann::json now = checkpoint_config(c, startup);
  for (const char* key : {"train_steps", "test_steps", "sample_shape", "classes"})
    if (saved.value(key, nlohmann::json()) != now.at(key))
      differences.push_back(std::string("data ") + key + ": checkpoint " +
                            saved.value(key, nlohmann::json()).dump() + ", this run " +
                            now.at(key).dump() + " (another data file?)");
  if (!differences.empty()) {
    std::string list;
    for (const auto& d : differences) list += (list.empty() ? "" : "; ") + d;
    throw UsageError("cannot resume from '" + c.resume +
                     "': this run differs from the checkpoint's: " + list +
                     " (resume with the same options, or start afresh without --resume)");
  }
  progress.epoch = state.at("epoch");
  progress.step = state.at("step");
  progress.host_step = state.at("host_step");
  progress.epoch_loss = state.at("epoch_loss");
  progress.train_seconds = state.at("train_seconds");
  for (const auto& m : state.at("epochs")) progress.epochs.push_back(metrics_from_json(m));
  progress.csv = state.at("metrics_csv");
  progress.cycles = state.at("cycles").get<std::vector<std::uint64_t>>();
  if (progress.epoch >= c.epochs)
    throw UsageError("cannot resume from '" + c.resume + "': it was written after epoch " +
                     std::to_string(progress.epoch) + " (host step " +
                     std::to_string(progress.host_step) + ") and --epochs " +
                     std::to_string(c.epochs) + " leaves nothing to train; raise --epochs");
  startup.resume = true;
  startup.resume_epoch = progress.epoch;
  startup.resume_step = progress.step;
  startup.resume_host_step = progress.host_step;
  startup.resume_cycles = progress.cycles;
  for (const auto& [name, array] : checkpoint.tensors) startup.resume_shapes[name] = array.shape;
  std::cout << "ipupod: resuming from " << c.resume << " at epoch " << progress.epoch + 1
            << ", step " << progress.step << " (host step " << progress.host_step << ")"
            << std::endl;
  return checkpoint;
}

}  // namespace ipupod::pod
