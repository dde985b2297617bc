// Host-side checkpoints of a training job.
#include "pod/job/host_checkpoints.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

#include "host/stream_protocol.hpp"
#include "json_text/json_text.hpp"
#include "pod/report.hpp"

namespace ipupod::pod {

using json_text::brief;
using json_text::shown;

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

namespace {

// checkpoint-<host step>.h5 keeps its figures in checkpoint-<host step>.metrics.json.
constexpr const char* kMetricsSuffix = ".metrics.json";

std::string metrics_path(const std::string& checkpoint_path) {
  std::filesystem::path path(checkpoint_path);
  return (path.parent_path() / (path.stem().string() + kMetricsSuffix)).string();
}

std::uint64_t text_checksum(const std::string& text) {
  return host::crc32c(std::as_bytes(std::span(text.data(), text.size())));
}

// One field of a checkpoint's JSON records, checked for presence and type; the error names the
// record and the field.
class Fields {
 public:
  Fields(const nlohmann::json& record, std::string what, std::string path)
      : record_(record), what_(std::move(what)), path_(std::move(path)) {}

  std::uint64_t count(const char* key) const {
    const nlohmann::json& value = at(key);
    if (!value.is_number_unsigned()) wrong(key, value, "a non-negative integer");
    return value.get<std::uint64_t>();
  }
  double number(const char* key) const {
    const nlohmann::json& value = at(key);
    if (!value.is_number() || !std::isfinite(value.get<double>()))
      wrong(key, value, "a finite number");
    return value.get<double>();
  }
  std::string text(const char* key) const {
    const nlohmann::json& value = at(key);
    if (!value.is_string()) wrong(key, value, "a string");
    return value.get<std::string>();
  }
  std::vector<std::uint64_t> counts(const char* key) const {
    const nlohmann::json& value = at(key);
    if (!value.is_array()) wrong(key, value, "a list of non-negative integers");
    for (const auto& item : value)
      if (!item.is_number_unsigned()) wrong(key, value, "a list of non-negative integers");
    return value.get<std::vector<std::uint64_t>>();
  }
  const nlohmann::json& at(const char* key) const {
    if (!record_.is_object() || !record_.contains(key)) {
      throw host::CheckpointError("checkpoint '" + path_ + "': its " + what_ +
                                  " lacks the field '" + key +
                                  "'; it was written by another ipupod version or edited; resume "
                                  "from a checkpoint this build wrote, or start afresh");
    }
    return record_.at(key);
  }

 private:
  [[noreturn]] void wrong(const char* key, const nlohmann::json& value,
                          const char* expected) const {
    throw host::CheckpointError("checkpoint '" + path_ + "': field '" + key + "' of its " + what_ +
                                " is " + shown(value) + ", expected " + expected +
                                "; it was written by another ipupod version or edited");
  }

  const nlohmann::json& record_;
  std::string what_, path_;
};

// A position that contradicts itself (an edited step counter, a record from another run).
[[noreturn]] void inconsistent(const std::string& path, const std::string& what) {
  throw host::CheckpointError("checkpoint '" + path + "': " + what +
                              "; the checkpoint is inconsistent (edited, or put together from "
                              "different runs); resume from another checkpoint");
}

}  // namespace

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
  char name[64];
  std::snprintf(name, sizeof name, "checkpoint-%06llu",
                static_cast<unsigned long long>(progress.host_step));
  // The figures grow with the run: they go to a file of their own beside the checkpoint, which
  // names it and holds its checksum (written first, so no checkpoint lacks its figures).
  nlohmann::json epochs = nlohmann::json::array();
  for (const auto& m : progress.epochs) epochs.push_back(metrics_json(m));
  const std::string metrics_name = std::string(name) + kMetricsSuffix;
  const std::string metrics =
      nlohmann::json{{"epochs", epochs}, {"metrics_csv", progress.csv}}.dump();
  write_file_atomically(c.run_dir, metrics_name, metrics);
  checkpoint.state_json = nlohmann::json{
      {"epoch", progress.epoch},
      {"step", progress.step},
      {"host_step", progress.host_step},
      {"epoch_loss", progress.epoch_loss},
      {"train_seconds", progress.train_seconds},
      {"metrics_file", metrics_name},
      {"metrics_crc32c", text_checksum(metrics)},
      {"cycles",
       progress.cycles}}.dump();
  // The loader's order is a pure function of (seed, epoch): that pair is its whole RNG state.
  checkpoint.rng_states["loader_shuffle"] = nlohmann::json{
      {"generator", "mt19937_64 Fisher-Yates, seeded from (seed, epoch)"},
      {"seed", c.seed},
      {"shuffle", c.shuffle},
      {"shuffle_window", c.shuffle_window},
      {"epoch", progress.epoch}}.dump();
  const std::string path = (std::filesystem::path(c.run_dir) / name).string() + ".h5";
  host::save_checkpoint(path, checkpoint);
  std::erase(written, path);  // a resumed run writes again what its checkpoint's run wrote
  written.push_back(path);
  while (c.checkpoint_keep > 0 && written.size() > c.checkpoint_keep) {
    std::error_code ignored;
    std::filesystem::remove(written.front(), ignored);
    std::filesystem::remove(metrics_path(written.front()), ignored);
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

std::deque<std::string> prepare_checkpoint_directory(const TrainConfig& c, const Startup& startup) {
  namespace fs = std::filesystem;
  // What ipupod writes through a temporary file in the run directory (save_checkpoint and
  // write_file_atomically add ".tmp"): a crash leaves at most these behind. (Matched by hand:
  // GCC 12's <regex> trips -Wmaybe-uninitialized in the sanitizer build.)
  const auto digits = [](std::string_view s) {
    return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
  };
  // The step of "checkpoint-<digits><suffix>", or nothing.
  const auto checkpoint_step = [&](std::string_view name,
                                   std::string_view suffix) -> std::optional<std::string_view> {
    constexpr std::string_view prefix = "checkpoint-";
    if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) ||
        !name.ends_with(suffix))
      return std::nullopt;
    const std::string_view step =
        name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (!digits(step)) return std::nullopt;
    return step;
  };
  const auto temporary = [&](std::string_view name) {
    for (const std::string_view report : {"summary.json.tmp", "metrics.csv.tmp", "memory.json.tmp",
                                          "trace.json.tmp", "stopped.txt.tmp"})
      if (name == report) return true;
    return checkpoint_step(name, ".h5.tmp").has_value() ||
           checkpoint_step(name, ".metrics.json.tmp").has_value();
  };
  std::vector<std::pair<std::uint64_t, std::string>> found;
  std::vector<std::string> removed;
  for (const fs::directory_entry& entry : fs::directory_iterator(c.run_dir)) {
    const std::string name = entry.path().filename().string();
    const std::optional<std::string_view> step = checkpoint_step(name, ".h5");
    if (temporary(name) && entry.is_regular_file()) {
      fs::remove(entry.path());
      removed.push_back(name);
    } else if (startup.resume && step && step->size() <= 19 && entry.is_regular_file()) {
      const std::uint64_t n = std::stoull(std::string(*step));
      if (n <= startup.resume_host_step) found.emplace_back(n, entry.path().string());
    }
  }
  if (!removed.empty()) {
    std::sort(removed.begin(), removed.end());
    std::string list;
    for (const std::string& name : removed) list += (list.empty() ? "" : ", ") + name;
    std::cout << "ipupod: removed " << removed.size() << " temporary file(s) an interrupted run "
              << "left in " << c.run_dir << ": " << list << std::endl;
  }
  std::sort(found.begin(), found.end());
  std::deque<std::string> written;
  for (auto& [step, path] : found) written.push_back(std::move(path));
  return written;
}

namespace {

// The position must agree with itself, with the data's steps per epoch and with the loader's
// recorded order: host step = epoch x steps per epoch + step, within the epoch.
void check_position(const TrainConfig& c, const Startup& startup,
                    const host::Checkpoint& checkpoint, const Progress& progress) {
  const std::string& path = c.resume;
  const std::uint64_t steps = startup.train_steps;
  if (checkpoint.step != progress.host_step)
    inconsistent(path, "the file's step attribute is " + std::to_string(checkpoint.step) +
                           " but its state record's host_step is " +
                           std::to_string(progress.host_step));
  if (progress.step >= steps)
    inconsistent(path, "state field 'step' is " + std::to_string(progress.step) +
                           ", expected less than the " + std::to_string(steps) +
                           " host steps of an epoch");
  if (progress.host_step != progress.epoch * steps + progress.step)
    inconsistent(path, "state field 'host_step' is " + std::to_string(progress.host_step) +
                           ", expected epoch " + std::to_string(progress.epoch) + " x " +
                           std::to_string(steps) + " steps + step " +
                           std::to_string(progress.step) + " = " +
                           std::to_string(progress.epoch * steps + progress.step));
  const auto shuffle = checkpoint.rng_states.find("loader_shuffle");
  if (shuffle == checkpoint.rng_states.end())
    inconsistent(path, "it holds no 'loader_shuffle' RNG state (the data order)");
  nlohmann::json order;
  try {
    order = nlohmann::json::parse(shuffle->second);
  } catch (const nlohmann::json::exception& e) {
    inconsistent(path, "its 'loader_shuffle' RNG state is not JSON: " + brief(e.what()));
  }
  const Fields loader(order, "'loader_shuffle' RNG state", path);
  if (loader.count("epoch") != progress.epoch)
    inconsistent(path, "the data order ('loader_shuffle') is that of epoch " +
                           std::to_string(loader.count("epoch")) + " but the state is at epoch " +
                           std::to_string(progress.epoch));
  if (loader.count("seed") != c.seed)
    inconsistent(path, "the data order ('loader_shuffle') was seeded with " +
                           std::to_string(loader.count("seed")) + ", the run with " +
                           std::to_string(c.seed));
}

// The figures the reports continue from, from the checkpoint's own metrics file.
void read_metrics(const std::string& path, const Fields& state, Progress& progress) {
  const std::string name = state.text("metrics_file");
  const std::uint64_t recorded = state.count("metrics_crc32c");
  const std::string file =
      (std::filesystem::path(path).parent_path() / std::filesystem::path(name).filename()).string();
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw host::CheckpointError("checkpoint '" + path + "': its metrics file '" + file +
                                "' is missing; copy it along with the checkpoint (it holds the "
                                "figures the reports continue from)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text_checksum(text.str()) != recorded) {
    throw host::CheckpointError("checkpoint '" + path + "': its metrics file '" + file +
                                "' fails its CRC32C check (computed " +
                                std::to_string(text_checksum(text.str())) + ", recorded " +
                                std::to_string(recorded) +
                                "); it was changed or belongs to another checkpoint");
  }
  nlohmann::json metrics;
  try {
    metrics = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw host::CheckpointError("checkpoint '" + path + "': its metrics file '" + file +
                                "' is not JSON: " + brief(e.what()));
  }
  const Fields fields(metrics, "metrics file", path);
  try {
    for (const auto& m : fields.at("epochs")) progress.epochs.push_back(metrics_from_json(m));
  } catch (const nlohmann::json::exception& e) {
    throw host::CheckpointError("checkpoint '" + path + "': an epoch of its metrics file '" + file +
                                "' is damaged: " + brief(e.what()));
  }
  progress.csv = fields.text("metrics_csv");
  if (progress.epochs.size() != progress.epoch)
    inconsistent(path, "its metrics file holds " + std::to_string(progress.epochs.size()) +
                           " finished epoch(s) but the state is at epoch " +
                           std::to_string(progress.epoch));
}

}  // namespace

host::Checkpoint load_resume(const TrainConfig& c, Startup& startup, Progress& progress) {
  host::Checkpoint checkpoint = host::load_checkpoint(c.resume);
  nlohmann::json saved, state;
  try {
    saved = nlohmann::json::parse(checkpoint.config_json);
    state = nlohmann::json::parse(checkpoint.state_json);
  } catch (const nlohmann::json::exception& e) {
    throw host::CheckpointError(
        "checkpoint '" + c.resume +
        "' has a damaged configuration or state record: " + brief(e.what()));
  }
  if (!saved.is_object())
    throw host::CheckpointError("checkpoint '" + c.resume + "': its configuration record is " +
                                shown(saved) +
                                ", expected a JSON object; it was written by another ipupod "
                                "version or edited");
  std::vector<std::string> differences = resume_differences(c, saved);
  const nlohmann::json now = checkpoint_config(c, startup);
  static const nlohmann::json kAbsent;
  for (const char* key : {"train_steps", "test_steps", "sample_shape", "classes"}) {
    const nlohmann::json& was = saved.contains(key) ? saved.at(key) : kAbsent;
    if (was != now.at(key))
      differences.push_back(std::string("data ") + key + ": checkpoint " + shown(was) +
                            ", this run " + now.at(key).dump() + " (another data file?)");
  }
  if (!differences.empty()) {
    std::string list;
    for (const auto& d : differences) list += (list.empty() ? "" : "; ") + d;
    throw UsageError("cannot resume from '" + c.resume +
                     "': this run differs from the checkpoint's: " + list +
                     " (resume with the same options, or start afresh without --resume)");
  }
  const Fields fields(state, "state record", c.resume);
  progress.epoch = fields.count("epoch");
  progress.step = fields.count("step");
  progress.host_step = fields.count("host_step");
  progress.epoch_loss = fields.number("epoch_loss");
  progress.train_seconds = fields.number("train_seconds");
  progress.cycles = fields.counts("cycles");
  check_position(c, startup, checkpoint, progress);
  read_metrics(c.resume, fields, progress);
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
  return checkpoint;
}

}  // namespace ipupod::pod
