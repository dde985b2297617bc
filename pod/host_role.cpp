// The host rank of a training job: reads the HDF5 data set, streams each replica its shard over
// TCP, collects losses, evaluation outputs and predicted cycles, and writes the run directory.
#include <algorithm>
#include <boost/asio/ip/host_name.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "host/checkpoint.hpp"
#include "host/dataset.hpp"
#include "host/loader.hpp"
#include "host/stream_server.hpp"
#include "ipu_process/arch.hpp"
#include "pod/report.hpp"
#include "pod/scoring.hpp"
#include "pod/train.hpp"
#include "pod/wire.hpp"

namespace ipupod::pod {
namespace {

using Clock = std::chrono::steady_clock;

// Micro-batch m of a host step's batch, sent from where it lies (no copy); `shape` is
// [micro-batch, sample shape...] and must outlive the send.
host::FrameView micro_batch_frame(StreamId id, std::uint64_t step, const host::HostArray& a,
                                  std::size_t m, const std::vector<std::size_t>& shape) {
  const std::size_t bytes = a.bytes.size() / a.shape[0] * shape[0];
  return {id, step, a.dtype, shape, std::span(a.bytes).subspan(m * bytes, bytes)};
}
// The same from a batch's samples in the data file's mapping.
host::FrameView micro_batch_frame(StreamId id, std::uint64_t step, const host::ArrayView& a,
                                  std::size_t m, const std::vector<std::size_t>& shape) {
  return {id, step, a.dtype, shape, std::span(a.samples).subspan(m * shape[0], shape[0])};
}

std::vector<std::size_t> every_index(std::size_t n) {
  std::vector<std::size_t> all(n);
  for (std::size_t i = 0; i < n; ++i) all[i] = i;
  return all;
}

// The split's description, after checking its inputs are float32 as every model takes them.
host::SplitInfo float_input_split(const host::DatasetFile& file, const char* split) {
  host::SplitInfo info = file.info(split);
  if (info.inputs.dtype != host::DType::f32)
    throw host::DatasetError(file.path() + ": /" + split + "/inputs is " +
                             std::string(host::dtype_name(info.inputs.dtype)) +
                             ", the model needs float32 inputs");
  return info;
}

// Checks the data set suits a classifier and returns the class count (max label + 1).
std::size_t check_classification_data(const host::DatasetFile& file) {
  std::int32_t max_label = -1;
  for (const char* split : {"train", "test"}) {
    const host::SplitInfo info = float_input_split(file, split);
    if (info.targets.dtype != host::DType::i32 || !info.targets.sample_shape.empty())
      throw host::DatasetError(file.path() + ": /" + split +
                               "/targets must hold one int32 class "
                               "label per sample for a classifier, got " +
                               std::string(host::dtype_name(info.targets.dtype)) + " of shape " +
                               host::shape_string(info.targets.sample_shape));
    const host::HostArray labels = file.read_targets(split, every_index(info.samples));
    for (std::size_t i = 0; i < labels.elements(); ++i) {
      const std::int32_t y = labels.as<const std::int32_t>()[i];
      if (y < 0)
        throw host::DatasetError(file.path() + ": /" + split + "/targets[" + std::to_string(i) +
                                 "] is " + std::to_string(y) + "; class labels must be >= 0");
      max_label = std::max(max_label, y);
    }
  }
  return static_cast<std::size_t>(max_label) + 1;
}

// What the host scores a model's test outputs against, read from the data set once.
struct Scoring {
  models::Task task = models::Task::classification;
  double target_range = 1, train_mean = 0, compression_ratio = 0;
  TestScores scores() const { return {task, target_range, train_mean, compression_ratio}; }
};

// Checks the data set suits a model that is not a classifier: float32 inputs, and float32
// targets of the shape the model's labels take per sample. Returns what the scores need: the
// range of the test targets (of a field, over its valid cells) and the mean training target.
Scoring check_target_data(const host::DatasetFile& file, const models::Model& model) {
  const models::TensorInfo& labels = model.graph.info(model.labels);
  const std::vector<std::size_t> expected(labels.shape.begin() + 1, labels.shape.end());
  const bool field = model.task == models::Task::reconstruction;
  for (const char* split : {"train", "test"}) {
    const host::SplitInfo info = float_input_split(file, split);
    if (info.targets.dtype != host::DType::f32 || info.targets.sample_shape != expected)
      throw host::DatasetError(
          file.path() + ": /" + split + "/targets must be float32 of shape " +
          host::shape_string(expected) + " per sample for model " + model.name + " (" +
          std::string(models::task_name(model.task)) + (field ? ": the field, then its mask" : "") +
          "), got " + std::string(host::dtype_name(info.targets.dtype)) + " of shape " +
          host::shape_string(info.targets.sample_shape) +
          " (check --model and --data, or convert the data with `ipupod data`)");
  }
  Scoring scoring;
  scoring.task = model.task;
  scoring.compression_ratio = model.compression_ratio;
  const host::HostArray test = file.read_targets("test", every_index(file.info("test").samples));
  const auto t = test.as<const float>();
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  const std::size_t cells = expected.empty() ? 1 : host::shape_elements(expected) / (field ? 2 : 1);
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (field) {  // sample k's field occupies [2k cells, 2k cells + cells); its mask follows
      const std::size_t k = i / (2 * cells), c = i % (2 * cells);
      if (c >= cells || t[(2 * k + 1) * cells + c] == 0) continue;
    }
    lo = std::min<double>(lo, t[i]);
    hi = std::max<double>(hi, t[i]);
  }
  scoring.target_range = hi > lo ? hi - lo : 1;
  if (model.task == models::Task::regression) {
    const host::HostArray train =
        file.read_targets("train", every_index(file.info("train").samples));
    double sum = 0;
    for (float v : train.as<const float>()) sum += v;
    scoring.train_mean = train.elements() ? sum / static_cast<double>(train.elements()) : 0;
  }
  return scoring;
}

struct EpochMetrics {
  std::size_t epoch = 0;
  double train_loss = 0, test_loss = 0;
  std::map<std::string, double> scores;  // by the model's task (scoring.hpp)
  std::size_t test_samples = 0;
  double measured_samples_per_s = 0, predicted_samples_per_s = 0;
};

std::uint64_t cycles_total(const host::HostArray& a, std::vector<std::uint64_t>* parts) {
  auto v = a.as<const std::uint32_t>();
  std::uint64_t total = 0;
  for (std::size_t i = 0; i + 1 < v.size(); i += 2) {
    const std::uint64_t c = (std::uint64_t{v[i]} << 32) | v[i + 1];
    if (parts) parts->push_back(c);
    total += c;
  }
  return total;
}

host::Frame expect_frame(host::StreamServer& server, std::size_t replica, StreamId id) {
  host::Frame f = server.receive(replica);
  if (f.stream != id)
    throw std::runtime_error("replica " + std::to_string(replica) + " sent stream " +
                             std::to_string(f.stream) + " where stream " + std::to_string(id) +
                             " was expected");
  return f;
}

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
nlohmann::json checkpoint_config(const TrainConfig& c, const Startup& startup) {
  nlohmann::json j = config_json(c);
  j["train_steps"] = startup.train_steps;
  j["test_steps"] = startup.test_steps;
  j["sample_shape"] = startup.sample_shape;
  j["classes"] = startup.classes;
  return j;
}

// Writes checkpoint-<host step>.h5 from replica 0's manifest and tensors, then removes the
// oldest of this run's checkpoints beyond --checkpoint-keep.
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

// Reads --resume, checks that this run continues the checkpoint's, and fills the start-up
// record and the host's progress from it. UsageError / CheckpointError on a mismatch.
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

}  // namespace

int run_host(const TrainConfig& c, MPI_Comm world) {
  Startup startup;
  std::unique_ptr<host::Loader> train, test;
  std::unique_ptr<host::StreamServer> server;
  Progress progress;
  Scoring scoring;
  host::Checkpoint resume;
  const auto timeout = std::chrono::milliseconds(static_cast<long>(c.timeout_s * 1000));
  try {
    train = std::make_unique<host::Loader>(
        host::LoaderConfig{.path = c.data,
                           .split = "train",
                           .replicas = c.replicas,
                           .samples_per_step = c.samples_per_replica_step(),
                           .shuffle = c.shuffle,
                           .shuffle_window = c.shuffle_window,
                           .seed = c.seed,
                           .prefetch_steps = 2,
                           .check_finite = true});
    // The test split is read again every epoch by the feeders and the metrics loop, out of the
    // order a prefetching reader follows: read it synchronously.
    test = std::make_unique<host::Loader>(host::LoaderConfig{.path = c.data,
                                                             .split = "test",
                                                             .replicas = c.replicas,
                                                             .samples_per_step = c.micro_batch,
                                                             .shuffle = false,
                                                             .seed = c.seed,
                                                             .prefetch_steps = 0,
                                                             .check_finite = true});
    // The evaluation model (built here only to learn its task and shapes) says how the data
    // must look and how its outputs are scored; a classifier's class count comes from the data.
    startup.sample_shape = train->info().inputs.sample_shape;
    Startup probe = startup;
    probe.classes = 2;
    const models::Model model = models::build_model(c.model, model_options(c, probe, false));
    if (model.task == models::Task::classification) {
      startup.classes = check_classification_data(train->file());
    } else {
      scoring = check_target_data(train->file(), model);
    }
    startup.train_steps = train->steps_per_epoch();
    startup.test_steps = test->steps_per_epoch();
    startup.secret = host::make_secret();
    server = std::make_unique<host::StreamServer>(host::ServerConfig{.bind_address = c.bind_address,
                                                                     .port = 0,
                                                                     .secret = startup.secret,
                                                                     .clients = c.replicas,
                                                                     .timeout = timeout,
                                                                     .hello_timeout = timeout,
                                                                     .log = {}});
    startup.address = c.bind_address == "0.0.0.0" ? boost::asio::ip::host_name() : c.bind_address;
    startup.port = server->port();
    if (!c.resume.empty()) resume = load_resume(c, startup, progress);
    std::filesystem::create_directories(c.run_dir);
  } catch (const host::DatasetError& e) {
    startup.status = 2;
    startup.message = e.what();
  } catch (const std::invalid_argument& e) {  // the model cannot take this data's samples
    startup.status = 2;
    startup.message = "model " + c.model + ": " + e.what();
  } catch (const host::CheckpointError& e) {
    startup.status = 2;
    startup.message = "cannot resume: " + std::string(e.what());
  } catch (const UsageError& e) {
    startup.status = 2;
    startup.message = e.what();
  } catch (const std::exception& e) {
    startup.status = 1;
    startup.message = e.what();
  }
  broadcast_startup(startup, 0, world);
  MPI_Comm none = MPI_COMM_NULL;
  MPI_Comm_split(world, MPI_UNDEFINED, 0, &none);  // the IPUs' replica groups
  MPI_Comm_split(world, MPI_UNDEFINED, 0, &none);  // the IPUs' pipelines
  if (startup.status != 0) {
    std::cerr << "ipupod train: " << startup.message << "\n";
    return startup.status;
  }
  {
    // The IPUs compile, then (resuming) check the checkpoint's tensors against their compiled
    // model; IPU 0 (rank 1) says what does not fit. The stream timeouts start after this: a
    // compile of minutes is no stall. A rank that dies meanwhile ends the job through MPI.
    int status = 0, verdict = 0;
    MPI_Allreduce(&status, &verdict, 1, MPI_INT, MPI_MAX, world);
    if (verdict != 0) {
      int length = 0;
      MPI_Recv(&length, 1, MPI_INT, 1, 0, world, MPI_STATUS_IGNORE);
      std::string message(static_cast<std::size_t>(length), '\0');
      MPI_Recv(message.data(), length, MPI_CHAR, 1, 0, world, MPI_STATUS_IGNORE);
      std::cerr << "ipupod train: cannot resume from '" << c.resume << "': " << message << "\n";
      return verdict;
    }
  }
  server->accept_clients();
  if (startup.resume) {
    for (std::size_t r = 0; r < c.replicas; ++r) {
      std::uint64_t index = 0;
      for (const auto& [name, array] : resume.tensors)
        server->send(r, {kCheckpointFrames, index++, array});
    }
    resume = {};
  }
  const ipu::ArchPreset& arch = ipu::ArchPreset::get(c.arch);
  const std::size_t micro_batches_per_step = c.gradient_accumulation * c.device_iterations;
  const std::size_t samples_per_host_step = c.samples_per_replica_step() * c.replicas;
  std::cout << "ipupod: " << c.replicas << " replica(s) x " << c.stages << " stage(s) on "
            << arch.description << "; " << startup.train_steps << " host steps/epoch of "
            << samples_per_host_step << " samples (micro-batch " << c.micro_batch
            << ", gradient accumulation " << c.gradient_accumulation << ", device iterations "
            << c.device_iterations << "), " << startup.test_steps * c.micro_batch * c.replicas
            << " test samples" << std::endl;

  // One feeder per replica sends its shard ahead of the IPU, as far as its credits allow.
  std::vector<std::thread> feeders;
  for (std::size_t r = 0; r < c.replicas; ++r)
    feeders.emplace_back([&, r] {
      try {
        std::uint64_t step = startup.resume_host_step;
        for (std::size_t e = startup.resume_epoch; e < c.epochs; ++e) {
          const std::size_t first = e == startup.resume_epoch ? startup.resume_step : 0;
          for (std::size_t s = first; s < startup.train_steps; ++s, ++step) {
            // Uncompressed preloaded data goes from the file's pages into the socket (the file
            // checked for truncation once each frame has its credit, just before its pages are
            // read); other data is copied out of the file by the loader's readers first.
            const auto send = [&](const auto& inputs, const auto& targets,
                                  const std::function<void()>& before_write) {
              std::vector<std::size_t> input_shape = inputs.shape, label_shape = targets.shape;
              input_shape[0] = label_shape[0] = c.micro_batch;
              for (std::size_t m = 0; m < micro_batches_per_step; ++m) {
                server->send(r, micro_batch_frame(kInputFrames, step, inputs, m, input_shape),
                             before_write);
                server->send(r, micro_batch_frame(kLabelFrames, step, targets, m, label_shape),
                             before_write);
              }
            };
            if (train->serves_views()) {
              const host::BatchView b = train->batch_view(e, s, r);
              send(b.inputs, b.targets, [&] { train->check_views(); });
              continue;
            }
            host::Batch b = train->batch(e, s, r);
            send(b.inputs, b.targets, {});
            train->recycle(std::move(b));
          }
          for (std::size_t t = 0; t < startup.test_steps; ++t) {
            const host::Batch b = test->batch(0, t, r);
            server->send(r, {kInputFrames, step, b.inputs});
            server->send(r, {kLabelFrames, step, b.targets});
          }
        }
      } catch (const std::exception& e) {
        // A closed stream usually means the IPU failed: give its own report time to arrive.
        std::this_thread::sleep_for(std::chrono::seconds(2));
        abort_job(world, "host feeder of replica " + std::to_string(r) + ": " + e.what());
      }
    });

  std::ostringstream csv;
  csv << (progress.csv.empty() ? "epoch,step,loss,measured_samples_per_s\n" : progress.csv);
  std::vector<EpochMetrics> epochs = progress.epochs;
  double train_seconds = progress.train_seconds;
  std::vector<std::uint64_t> cycle_parts;
  std::uint64_t max_cycles = 0;
  std::deque<std::string> checkpoints_written;
  const std::size_t every = c.checkpoint_every;
  // Replica 0's tensors and the host's figures as they stand after `host_step` host steps.
  const auto checkpoint = [&](std::size_t e, std::size_t next_step, std::uint64_t host_step,
                              double epoch_loss, double seconds) {
    Progress now;
    now.epoch = e;
    now.step = next_step;
    now.host_step = host_step;
    now.epoch_loss = epoch_loss;
    now.train_seconds = seconds;
    now.epochs = epochs;
    now.csv = csv.str();
    write_checkpoint(*server, c, startup, std::move(now), checkpoints_written);
  };
  const std::size_t progress_every = std::max<std::size_t>(1, startup.train_steps / 5);
  for (std::size_t e = startup.resume_epoch; e < c.epochs; ++e) {
    EpochMetrics m;
    m.epoch = e;
    const auto t0 = Clock::now();
    const bool resumed_epoch = startup.resume && e == startup.resume_epoch;
    double epoch_loss = resumed_epoch ? progress.epoch_loss : 0;
    for (std::size_t s = resumed_epoch ? startup.resume_step : 0; s < startup.train_steps; ++s) {
      double step_loss = 0;
      for (std::size_t r = 0; r < c.replicas; ++r)
        for (std::size_t k = 0; k < micro_batches_per_step; ++k)
          step_loss += expect_frame(*server, r, kLossFrames).array.as<const float>()[0];
      step_loss /= static_cast<double>(c.replicas * micro_batches_per_step);
      if (!std::isfinite(step_loss))  // the feeders are still running: end the whole job
        abort_job(
            world,
            "the training loss is " + std::to_string(step_loss) + " at epoch " +
                std::to_string(e + 1) + " step " + std::to_string(s + 1) + ": " +
                (c.precision == "fp16"
                     ? "float16 overflowed (it holds at most 65504); lower --loss-scaling (now " +
                           std::to_string(c.loss_scaling) +
                           ") or the learning rate, or train with "
                           "--precision fp32"
                     : std::string("lower the learning rate")));
      epoch_loss += step_loss;
      const double elapsed =
          train_seconds + std::chrono::duration<double>(Clock::now() - t0).count();
      const double done =
          static_cast<double>((e * startup.train_steps + s + 1) * samples_per_host_step);
      csv << e << "," << s << "," << step_loss << "," << done / elapsed << "\n";
      if ((s + 1) % progress_every == 0 || s + 1 == startup.train_steps)
        std::cout << "  epoch " << e + 1 << "/" << c.epochs << " step " << s + 1 << "/"
                  << startup.train_steps << "  loss " << std::fixed << std::setprecision(4)
                  << step_loss << "  " << std::setprecision(0) << done / elapsed
                  << " samples/s (emulator)" << std::endl;
      const std::uint64_t done_steps = e * startup.train_steps + s + 1;
      // A checkpoint due at the end of an epoch waits for its evaluation (below).
      if (every > 0 && done_steps % every == 0 && s + 1 < startup.train_steps)
        checkpoint(e, s + 1, done_steps, epoch_loss,
                   train_seconds + std::chrono::duration<double>(Clock::now() - t0).count());
    }
    train_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    m.train_loss = epoch_loss / static_cast<double>(std::max<std::size_t>(startup.train_steps, 1));
    // Predicted cycles of the training so far: the slowest replica sets the pace.
    max_cycles = 0;
    for (std::size_t r = 0; r < c.replicas; ++r) {
      std::vector<std::uint64_t> parts;
      const std::uint64_t total =
          cycles_total(expect_frame(*server, r, kCycleFrames).array, &parts);
      if (total >= max_cycles) max_cycles = total, cycle_parts = parts;
    }
    const double trained =
        static_cast<double>((e + 1) * startup.train_steps * samples_per_host_step);
    m.measured_samples_per_s = trained / train_seconds;
    m.predicted_samples_per_s =
        max_cycles ? trained / (static_cast<double>(max_cycles) / arch.clock_hz) : 0;
    // Evaluation on each replica's shard of the test split.
    TestScores scores = scoring.scores();
    double test_loss = 0;
    for (std::size_t t = 0; t < startup.test_steps; ++t)
      for (std::size_t r = 0; r < c.replicas; ++r) {
        const host::Frame logits = expect_frame(*server, r, kLogitsFrames);
        const host::Frame loss = expect_frame(*server, r, kLossFrames);
        test_loss += loss.array.as<const float>()[0];
        const host::Batch b = test->batch(0, t, r);
        scores.add(logits.array.as<const float>(), b.inputs, b.targets);
      }
    m.test_samples = startup.test_steps * c.replicas * c.micro_batch;
    m.test_loss =
        test_loss / static_cast<double>(std::max<std::size_t>(startup.test_steps * c.replicas, 1));
    m.scores = scores.finish();
    std::cout << "epoch " << e + 1 << "/" << c.epochs << ": train loss " << std::setprecision(4)
              << m.train_loss << ", test loss " << m.test_loss << ", "
              << TestScores::describe(scoring.task, m.scores) << " (" << m.test_samples
              << " samples); " << std::fixed << std::setprecision(0) << m.measured_samples_per_s
              << " samples/s measured, " << m.predicted_samples_per_s << " samples/s predicted on "
              << arch.name << std::endl;
    epochs.push_back(m);
    const std::uint64_t done_steps = (e + 1) * startup.train_steps;
    if (every > 0 && (done_steps % every == 0 || e + 1 == c.epochs))
      checkpoint(e + 1, 0, done_steps, 0, train_seconds);
  }
  for (auto& f : feeders) f.join();

  // Reports and final weights from every replica; the replicas must agree bit for bit.
  nlohmann::json memory = nlohmann::json::array();
  nlohmann::json trace = {{"displayTimeUnit", "ns"}, {"traceEvents", nlohmann::json::array()}};
  std::vector<std::vector<std::vector<std::byte>>> weights(c.replicas);
  for (std::size_t r = 0; r < c.replicas; ++r) {
    const host::Frame report = expect_frame(*server, r, kReportFrames);
    const auto text = report.array.as<const std::uint8_t>();
    nlohmann::json j = nlohmann::json::parse(text.begin(), text.end());
    j["ipu"] = r * c.stages;
    j["replica"] = r;
    const std::size_t tensors = j.at("parameter_tensors");
    for (auto& event : j.at("trace")) {
      event["pid"] = r * c.stages;
      trace["traceEvents"].push_back(std::move(event));
    }
    trace["traceEvents"].push_back({{"name", "process_name"},
                                    {"ph", "M"},
                                    {"pid", r * c.stages},
                                    {"args",
                                     {{"name", "IPU " + std::to_string(r * c.stages) +
                                                   " (replica " + std::to_string(r) + ")"}}}});
    j.erase("trace");
    for (std::size_t p = 0; p < tensors; ++p)
      weights[r].push_back(std::move(expect_frame(*server, r, kWeightFrames).array.bytes));
    memory.push_back(std::move(j));
  }
  bool identical = true;
  std::size_t parameters = 0;
  std::vector<std::string> checksums;
  for (std::size_t r = 0; r < c.replicas; ++r) {
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a over every weight byte
    for (const auto& tensor : weights[r]) {
      for (std::byte b : tensor) h = (h ^ static_cast<std::uint8_t>(b)) * 1099511628211ull;
      if (r == 0) parameters += tensor.size() / sizeof(float);
    }
    std::ostringstream hex;
    hex << std::hex << std::setw(16) << std::setfill('0') << h;
    checksums.push_back(hex.str());
    identical = identical && weights[r] == weights[0];
  }
  server->close();

  const auto breakdown_seconds = [&](std::size_t i) {
    return i < cycle_parts.size() ? static_cast<double>(cycle_parts[i]) / arch.clock_hz : 0.0;
  };
  const double host_steps = static_cast<double>(c.epochs * startup.train_steps);
  nlohmann::json per_step = {{"compute", breakdown_seconds(0) / host_steps},
                             {"exchange", breakdown_seconds(1) / host_steps},
                             {"sync", breakdown_seconds(2) / host_steps},
                             {"host", breakdown_seconds(3) / host_steps},
                             {"fabric", breakdown_seconds(4) / host_steps}};
  nlohmann::json epoch_json = nlohmann::json::array();
  for (const auto& m : epochs) epoch_json.push_back(metrics_json(m));
  const EpochMetrics& last = epochs.back();
  nlohmann::json summary = {
      {"config", config_json(c)},
      {"samples_trained", static_cast<std::size_t>(host_steps) * samples_per_host_step},
      {"train_seconds", train_seconds},
      {"measured_samples_per_s", last.measured_samples_per_s},
      {"predicted_ipu_samples_per_s", last.predicted_samples_per_s},
      {"predicted_seconds_per_host_step", per_step},
      {"task", models::task_name(scoring.task)},
      {"test_loss", last.test_loss},
      {"epochs", epoch_json},
      {"parameters", parameters},
      {"replica_weight_checksums", checksums},
      {"replica_weights_identical", identical}};
  for (const auto& [name, value] : last.scores) summary[name] = value;
  write_file_atomically(c.run_dir, "summary.json", summary.dump(2) + "\n");
  write_file_atomically(c.run_dir, "metrics.csv", csv.str());
  write_file_atomically(c.run_dir, "memory.json", memory.dump(1) + "\n");
  write_file_atomically(c.run_dir, "trace.json", trace.dump() + "\n");
  std::cout << "ipupod: replicas' final weights are "
            << (identical ? "bitwise identical" : "DIFFERENT") << "; wrote " << c.run_dir
            << "/{summary.json,metrics.csv,memory.json,trace.json}" << std::endl;
  return identical ? 0 : 1;
}

}  // namespace ipupod::pod
