// The host rank of a training job: reads the HDF5 data set, streams each replica its shard over
// TCP, collects losses, evaluation outputs and predicted cycles, and writes the run directory.
#include <algorithm>
#include <atomic>
#include <boost/asio/ip/host_name.hpp>
#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "host/checkpoint.hpp"
#include "host/data_scan.hpp"
#include "host/dataset.hpp"
#include "host/loader.hpp"
#include "host/stream_server.hpp"
#include "ipu_process/arch.hpp"
#include "pod/job/data_checks.hpp"
#include "pod/job/host_checkpoints.hpp"
#include "pod/job/host_instances.hpp"
#include "pod/job/protocol.hpp"
#include "pod/job/scoring.hpp"
#include "pod/job/stop_signal.hpp"
#include "pod/job/train.hpp"
#include "pod/report.hpp"

namespace ipupod::pod {
namespace {

// A rate of samples per second: whole numbers from 100 up, else three significant digits (a
// full-size model runs at a fraction of a sample per second here).
std::string format_rate(double per_s) {
  std::ostringstream out;
  if (per_s >= 100)
    out << std::fixed << std::setprecision(0) << per_s;
  else
    out << std::setprecision(3) << per_s;
  return out.str();
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

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

// Per IPU rank: the peak resident memory of the emulator's process beside the tile memory it
// emulates (from the memory reports; later stages' within their replica's first).
nlohmann::json host_memory_of_ranks(const nlohmann::json& memory) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& replica : memory) {
    const std::size_t first_ipu = replica.at("ipu");
    const auto add = [&](const nlohmann::json& r) {
      const std::size_t stage = r.at("stage");
      out.push_back(
          {{"ipu", first_ipu + stage},
           {"node", r.value("node", std::string())},
           {"host_peak_resident_bytes", r.value("host_peak_resident_bytes", std::uint64_t{0})},
           {"tile_bytes", r.at("total_bytes")}});
    };
    add(replica);
    if (replica.contains("later_stages"))
      for (const auto& later : replica.at("later_stages")) add(later);
  }
  return out;
}

// What the host gathers from every replica at the end of the run.
struct FinalReports {
  nlohmann::json memory = nlohmann::json::array();
  nlohmann::json trace = {{"displayTimeUnit", "ns"}, {"traceEvents", nlohmann::json::array()}};
  bool identical = true;
  std::size_t parameters = 0;
  std::vector<std::string> checksums;
};

// MPI tags of what the host instances send instance 0 (on the hosts' communicator).
constexpr int kEvaluationTag = 21, kReportTag = 22, kWeightTag = 23;

// A host rank's part of the job, step by step (run_host below reads as their sequence). With
// several host instances each serves its own replicas, and the first (rank 0) also receives
// from the others what it needs to write the run directory.
class HostRole {
 public:
  HostRole(const TrainConfig& config, MPI_Comm world)
      : c_(config),
        world_(world),
        arch_(ipu::ArchPreset::get(config.arch)),
        instance_(instance_of(config, rank_of(world))),
        first_replica_(instance_ * config.replicas_per_instance()),
        local_replicas_(config.replicas_per_instance()) {}

  // The host instances' communicator, once the job's groups are split.
  void join(MPI_Comm hosts) { hosts_ = hosts; }
  bool first_instance() const { return instance_ == 0; }

  // Opens the data, checks it against the model, starts the stream server, reads --resume;
  // the start-up record says what failed (status 2: bad input, 1: other).
  Startup prepare();
  int accept_stream_clients(std::string* message);
  void serve_resumed_tensors();
  void print_banner() const;
  void start_feeders();
  void train_and_evaluate();
  void join_feeders() {
    for (auto& f : feeders_) f.join();
  }
  // The signal on which the ranks agreed to stop, 0 if training ran to the end.
  int stopped() const { return stop_.signal; }
  // After a stop: ends the feeders (which would wait on credits no IPU will grant), closes the
  // streams and says what happened and how to continue; returns the exit code.
  int finish_stopped();
  FinalReports collect_reports();
  void write_run_files(const FinalReports& reports);
  void close() { server_->close(); }

 private:
  void open_data();
  void feed(std::size_t replica);
  void send_training_step(std::size_t replica, std::size_t epoch, std::size_t s,
                          std::uint64_t step);
  double train_epoch(std::size_t e, Clock::time_point t0);
  void predict_throughput(EpochMetrics& m, std::size_t e);
  void evaluate(EpochMetrics& m);
  void checkpoint(std::size_t e, std::size_t next_step, std::uint64_t host_step, double epoch_loss,
                  double seconds);

  static int rank_of(MPI_Comm world) {
    int rank = 0;
    MPI_Comm_rank(world, &rank);
    return rank;
  }
  std::size_t replica_of(std::size_t local) const { return first_replica_ + local; }

  const TrainConfig& c_;
  MPI_Comm world_;
  const ipu::ArchPreset& arch_;
  const std::size_t instance_, first_replica_, local_replicas_;
  MPI_Comm hosts_ = MPI_COMM_NULL;
  Startup startup_;
  std::unique_ptr<host::Loader> train_, test_;
  std::unique_ptr<host::StreamServer> server_;
  Progress progress_;
  Scoring scoring_;
  host::Checkpoint resume_;
  std::vector<std::thread> feeders_;
  std::ostringstream csv_;
  std::vector<EpochMetrics> epochs_;
  double train_seconds_ = 0;
  std::vector<std::uint64_t> cycle_parts_;  // the slowest replica's predicted cycles by kind
  std::deque<std::string> checkpoints_written_;
  // Where the ranks agreed to stop (stop_signal.hpp), and whether a checkpoint holds that point.
  struct Stop {
    int signal = 0;
    std::size_t epoch = 0, step = 0;  // the next step, as a checkpoint records it
    std::uint64_t host_step = 0;
    bool checkpointed = false;
  } stop_;
  std::atomic<bool> stopping_{false};
  bool stop_here(std::size_t e, std::size_t next_step, std::uint64_t host_step, double epoch_loss,
                 double seconds, bool checkpoint_written);
};

// Every float of the data, before the first step rather than when its batch streams; a clean
// verdict is remembered per unchanged file (host/data_scan.hpp), so a set is scanned once.
void scan_for_non_finite_values(const host::DatasetFile& file) {
  host::FiniteScanOptions options;
  options.cache_dir = host::default_scan_cache_dir();
  options.progress = [&file](std::uint64_t done, std::uint64_t total) {
    constexpr double kMiB = 1024.0 * 1024.0;
    std::ostringstream line;
    line << "ipupod: scanning " << file.path() << " for NaN and infinity: " << std::fixed
         << std::setprecision(0) << 100.0 * static_cast<double>(done) / static_cast<double>(total)
         << "% of " << static_cast<double>(total) / kMiB << " MiB";
    std::cout << line.str() << std::endl;
  };
  host::scan_finite(file, options);
}

void HostRole::open_data() {
  train_ = std::make_unique<host::Loader>(
      host::LoaderConfig{.path = c_.data,
                         .split = "train",
                         .replicas = c_.replicas,
                         .first_replica = first_replica_,
                         .served_replicas = local_replicas_,
                         .samples_per_step = c_.samples_per_replica_step(),
                         .shuffle = c_.shuffle,
                         .shuffle_window = c_.shuffle_window,
                         .seed = c_.seed,
                         .prefetch_steps = 2,
                         .check_finite = true});
  // The test split is read again every epoch by the feeders and the metrics loop, out of the
  // order a prefetching reader follows: read it synchronously.
  test_ = std::make_unique<host::Loader>(host::LoaderConfig{.path = c_.data,
                                                            .split = "test",
                                                            .replicas = c_.replicas,
                                                            .first_replica = first_replica_,
                                                            .served_replicas = local_replicas_,
                                                            .samples_per_step = c_.micro_batch,
                                                            .shuffle = false,
                                                            .seed = c_.seed,
                                                            .prefetch_steps = 0,
                                                            .check_finite = true});
  // The evaluation model (built here only to learn its task and shapes) says how the data
  // must look and how its outputs are scored; a classifier's class count comes from the data.
  startup_.sample_shape = train_->info().inputs.sample_shape;
  startup_.target_shape = train_->info().targets.sample_shape;
  DataShape probe = startup_.data_shape();
  probe.classes = 2;
  models::ModelOptions options = model_options(c_, probe, false);
  // A split by hand is made here too, so that blocks that name no op fail once, here.
  if (!c_.split_at.empty()) use_automatic_split(c_, options, nullptr);
  const models::Model model = models::build_model(c_.model, options);
  // More stages than the model's split marks make fails here, once, not on every IPU.
  if (split_by_marks(c_)) check_stage_count(c_, model);
  check_input_shape(train_->file(), model);
  if (model.task == models::Task::classification) {
    std::vector<std::string> warnings;
    startup_.classes =
        check_classification_data(train_->file(), models::ModelOptions{}.classes, warnings);
    if (first_instance())
      for (const std::string& warning : warnings)
        std::cerr << "ipupod train: warning: " << warning << "\n";
  } else {
    scoring_ = check_target_data(train_->file(), model);
  }
  // Once for the job, by the first instance (every instance's loader checks what it reads).
  if (first_instance()) scan_for_non_finite_values(train_->file());
  startup_.train_steps = train_->steps_per_epoch();
  startup_.test_steps = test_->steps_per_epoch();
}

Startup HostRole::prepare() {
  const auto timeout = std::chrono::milliseconds(static_cast<long>(c_.timeout_s * 1000));
  try {
    open_data();
    startup_.secret = host::make_secret();
    server_ = std::make_unique<host::StreamServer>(
        host::ServerConfig{.bind_address = c_.bind_address,
                           .port = 0,
                           .secret = startup_.secret,
                           .clients = local_replicas_,
                           .timeout = timeout,
                           .hello_timeout = std::min(timeout, host::ServerConfig{}.hello_timeout),
                           .log = {}});
    startup_.address = server_->announced_address();
    startup_.port = server_->port();
    if (!c_.resume.empty()) {
      resume_ = load_resume(c_, startup_, progress_);
      if (first_instance())
        std::cout << "ipupod: resuming from " << c_.resume << " at epoch " << progress_.epoch + 1
                  << ", step " << progress_.step << " (host step " << progress_.host_step << ")"
                  << std::endl;
    }
    if (first_instance()) {  // the run directory is the first instance's
      std::filesystem::create_directories(c_.run_dir);
      checkpoints_written_ = prepare_checkpoint_directory(c_, startup_);
    }
  } catch (const host::DatasetError& e) {
    startup_.status = 2;
    startup_.message = e.what();
  } catch (const std::invalid_argument& e) {  // the model cannot take this data's samples
    startup_.status = 2;
    startup_.message = "model " + c_.model + ": " + e.what();
  } catch (const host::CheckpointError& e) {
    startup_.status = 2;
    startup_.message = "cannot resume: " + std::string(e.what());
  } catch (const UsageError& e) {
    startup_.status = 2;
    startup_.message = e.what();
  } catch (const std::exception& e) {
    startup_.status = 1;
    startup_.message = e.what();
  }
  // Another node's instance may see other files than the first's: say which one failed.
  if (startup_.status != 0 && !first_instance())
    startup_.message = "host instance " + std::to_string(instance_) + " (node " +
                       boost::asio::ip::host_name() + "): " + startup_.message;
  return startup_;
}

// The stream timeouts start now: a compile of minutes was no stall. Every rank learns whether
// all replicas connected; when not, *message says why (an IPU's reason before a host's).
int HostRole::accept_stream_clients(std::string* message) {
  int status = 0;
  std::string own;
  try {
    server_->accept_clients();
  } catch (const std::exception& e) {
    status = 1;
    own = e.what();
  }
  const std::string listened =
      " listened on " + c_.bind_address + ", announced as '" + startup_.address + "')";
  if (c_.host_instances > 1 && status != 0)  // which instance: its own message says
    own += " (host instance " + std::to_string(instance_) + listened;
  const int verdict = start_verdict(world_, true, status, own, message);
  if (verdict != 0 && c_.host_instances == 1) *message += " (the host" + listened;
  return verdict;
}

void HostRole::serve_resumed_tensors() {
  if (!startup_.resume) return;
  for (std::size_t l = 0; l < local_replicas_; ++l) {
    std::uint64_t index = 0;
    for (const auto& [name, array] : resume_.tensors)
      server_->send(l, {kCheckpointFrames, index++, array});
  }
  resume_ = {};
}

void HostRole::print_banner() const {
  std::cout << "ipupod: " << c_.replicas << " replica(s) x " << c_.stages << " stage(s) on "
            << arch_.description << "; " << startup_.train_steps << " host steps/epoch of "
            << c_.samples_per_replica_step() * c_.replicas << " samples (micro-batch "
            << c_.micro_batch << ", gradient accumulation " << c_.gradient_accumulation
            << ", device iterations " << c_.device_iterations << "), "
            << startup_.test_steps * c_.micro_batch * c_.replicas << " test samples" << std::endl;
}

// One feeder per replica of this instance sends its shard ahead of the IPU, as far as its
// credits allow.
void HostRole::start_feeders() {
  for (std::size_t l = 0; l < local_replicas_; ++l) feeders_.emplace_back([this, l] { feed(l); });
}

// `l`: the replica's index among this instance's (its stream), the shard is replica_of(l)'s.
void HostRole::feed(std::size_t l) {
  const std::size_t r = replica_of(l);
  try {
    std::uint64_t step = startup_.resume_host_step;
    for (std::size_t e = startup_.resume_epoch; e < c_.epochs; ++e) {
      const std::size_t first = e == startup_.resume_epoch ? startup_.resume_step : 0;
      for (std::size_t s = first; s < startup_.train_steps; ++s, ++step)
        send_training_step(l, e, s, step);
      for (std::size_t t = 0; t < startup_.test_steps; ++t) {
        const host::Batch b = test_->batch(0, t, r);
        server_->send(l, {kInputFrames, step, b.inputs});
        server_->send(l, {kLabelFrames, step, b.targets});
      }
    }
  } catch (const std::exception& e) {
    if (stopping_) return;  // the host closed the streams after a stop signal
    // A closed stream usually means the IPU failed: give its own report time to arrive. Or
    // the IPUs stopped on a signal and the host has not yet seen the ranks agree on it.
    const auto until = Clock::now() + std::chrono::seconds(2);
    while (!stopping_ && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (stopping_) return;
    abort_job(world_, "host feeder of replica " + std::to_string(r) + ": " + e.what());
  }
}

// Uncompressed preloaded data goes from the file's pages into the socket (the file checked for
// truncation once each frame has its credit, just before its pages are read); other data is
// copied out of the file by the loader's readers first.
void HostRole::send_training_step(std::size_t l, std::size_t e, std::size_t s, std::uint64_t step) {
  const std::size_t r = replica_of(l);
  const std::size_t micro_batches = micro_batches_per_host_step(c_);
  const auto send = [&](const auto& inputs, const auto& targets,
                        const std::function<void()>& before_write) {
    std::vector<std::size_t> input_shape = inputs.shape, label_shape = targets.shape;
    input_shape[0] = label_shape[0] = c_.micro_batch;
    for (std::size_t m = 0; m < micro_batches; ++m) {
      server_->send(l, micro_batch_frame(kInputFrames, step, inputs, m, input_shape), before_write);
      server_->send(l, micro_batch_frame(kLabelFrames, step, targets, m, label_shape),
                    before_write);
    }
  };
  if (train_->serves_views()) {
    const host::BatchView b = train_->batch_view(e, s, r);
    send(b.inputs, b.targets, [&] { train_->check_views(); });
    return;
  }
  host::Batch b = train_->batch(e, s, r);
  send(b.inputs, b.targets, {});
  train_->recycle(std::move(b));
}

// Replica 0's tensors and the host's figures as they stand after `host_step` host steps (the
// first instance, which serves replica 0).
void HostRole::checkpoint(std::size_t e, std::size_t next_step, std::uint64_t host_step,
                          double epoch_loss, double seconds) {
  if (!first_instance()) return;
  Progress now;
  now.epoch = e;
  now.step = next_step;
  now.host_step = host_step;
  now.epoch_loss = epoch_loss;
  now.train_seconds = seconds;
  now.epochs = epochs_;
  now.csv = csv_.str();
  write_checkpoint(*server_, c_, startup_, std::move(now), checkpoints_written_);
}

// The training steps of epoch e: each replica's losses, progress lines, due checkpoints.
// Returns the epoch's summed step losses.
double HostRole::train_epoch(std::size_t e, Clock::time_point t0) {
  const std::size_t micro_batches = micro_batches_per_host_step(c_);
  const double samples_per_host_step =
      static_cast<double>(c_.samples_per_replica_step() * c_.replicas);
  const std::size_t progress_every = std::max<std::size_t>(1, startup_.train_steps / 5);
  const bool resumed_epoch = startup_.resume && e == startup_.resume_epoch;
  double epoch_loss = resumed_epoch ? progress_.epoch_loss : 0;
  for (std::size_t s = resumed_epoch ? startup_.resume_step : 0; s < startup_.train_steps; ++s) {
    // Every replica's micro-batch losses, summed in replica order whichever instance has them.
    std::vector<float> losses;
    for (std::size_t l = 0; l < local_replicas_; ++l)
      for (std::size_t k = 0; k < micro_batches; ++k)
        losses.push_back(expect_frame(*server_, l, kLossFrames).array.as<const float>()[0]);
    if (c_.host_instances > 1) losses = gather_to_first(hosts_, losses);
    double step_loss = 0;
    for (float loss : losses) step_loss += loss;
    step_loss /= static_cast<double>(c_.replicas * micro_batches);
    if (!std::isfinite(step_loss))  // the feeders are still running: end the whole job
      abort_job(world_, "the training loss is " + std::to_string(step_loss) + " at epoch " +
                            std::to_string(e + 1) + " step " + std::to_string(s + 1) + ": " +
                            (c_.precision == "fp16"
                                 ? "float16 overflowed (it holds at most 65504); lower "
                                   "--loss-scaling (now " +
                                       std::to_string(c_.loss_scaling) +
                                       ") or the learning rate, or train with --precision fp32"
                                 : std::string("lower the learning rate")));
    epoch_loss += step_loss;
    const double elapsed = train_seconds_ + seconds_since(t0);
    const std::uint64_t done_steps = e * startup_.train_steps + s + 1;
    const double done = static_cast<double>(done_steps) * samples_per_host_step;
    csv_ << e << "," << s << "," << step_loss << "," << done / elapsed << "\n";
    if (first_instance() && ((s + 1) % progress_every == 0 || s + 1 == startup_.train_steps))
      std::cout << "  epoch " << e + 1 << "/" << c_.epochs << " step " << s + 1 << "/"
                << startup_.train_steps << "  loss " << std::fixed << std::setprecision(4)
                << step_loss << "  " << format_rate(done / elapsed) << " samples/s (emulator), "
                << std::setprecision(0)
                << elapsed / static_cast<double>(done_steps) *
                       static_cast<double>(startup_.train_steps - s - 1)
                << " s left in the epoch" << std::endl;
    const bool due = checkpoint_due_within_epoch(c_, done_steps, s, startup_.train_steps);
    if (due) checkpoint(e, s + 1, done_steps, epoch_loss, train_seconds_ + seconds_since(t0));
    if (stop_boundary_within_epoch(s, startup_.train_steps) &&
        stop_here(e, s + 1, done_steps, epoch_loss, train_seconds_ + seconds_since(t0), due))
      break;
  }
  return epoch_loss;
}

// At a step boundary: true if the ranks agree to stop (a signal reached one of them), after a
// final checkpoint of this point when checkpoints are on and none was due here anyway.
bool HostRole::stop_here(std::size_t e, std::size_t next_step, std::uint64_t host_step,
                         double epoch_loss, double seconds, bool checkpoint_written) {
  const int signal = agree_to_stop(world_);
  if (signal == 0) return false;
  // The IPUs close their streams once they have sent what this stop needs, maybe before the
  // host has received it: the feeders must take a closed stream as the stop from now on.
  stopping_ = true;
  if (c_.checkpoint_every > 0 && !checkpoint_written) {
    checkpoint(e, next_step, host_step, epoch_loss, seconds);
    checkpoint_written = true;
  }
  stop_ = {signal, e, next_step, host_step, checkpoint_written};
  return true;
}

int HostRole::finish_stopped() {
  if (!first_instance()) {  // the first instance says what happened
    stopping_ = true;
    server_->close();
    join_feeders();
    return stopped_exit_code(stop_.signal);
  }
  // Said first: under mpirun the ranks have about a second after its SIGTERM before SIGKILL.
  std::ostringstream message;
  message << "ipupod train: stopped by " << signal_name(stop_.signal) << " after host step "
          << stop_.host_step << " (";
  if (stop_.step == 0) {
    message << "after epoch " << stop_.epoch << " and its evaluation";
  } else {
    message << "epoch " << stop_.epoch + 1 << ", step " << stop_.step << " of "
            << startup_.train_steps;
  }
  message << "); ";
  if (stop_.checkpointed) {
    const std::string& last = checkpoints_written_.back();
    message << "its checkpoint is " << last << ". To continue, run the same command with --resume "
            << last << " (and a new --run-dir if you want to keep this one's files apart)";
  } else {
    message << "no checkpoint holds this point, so the run cannot be continued; train with "
               "--checkpoint-every N to be able to resume after a stop";
  }
  // Under mpirun, a SIGTERM or SIGINT has stopped the relay of the ranks' output (the stop
  // made it non-blocking: stop_signal.cpp), so the notice is kept in the run directory too.
  // (In one write with its newline: the relay may put another rank's line after each write.)
  std::cerr.clear();
  std::cerr << message.str() + "\n" << std::flush;
  write_file_atomically(c_.run_dir, "stopped.txt", message.str() + "\n");
  stopping_ = true;
  server_->close();
  join_feeders();
  return stopped_exit_code(stop_.signal);
}

// Predicted cycles of the training so far: the slowest replica sets the pace.
void HostRole::predict_throughput(EpochMetrics& m, std::size_t e) {
  std::vector<std::uint64_t> all;  // every replica's cycles by kind, in replica order
  for (std::size_t l = 0; l < local_replicas_; ++l) {
    std::vector<std::uint64_t> parts;
    cycles_total(expect_frame(*server_, l, kCycleFrames).array, &parts);
    parts.resize(kCycleKinds);
    all.insert(all.end(), parts.begin(), parts.end());
  }
  if (c_.host_instances > 1) all = gather_to_first(hosts_, all);
  std::uint64_t max_cycles = 0;
  for (std::size_t at = 0; at < all.size(); at += kCycleKinds) {
    const std::vector<std::uint64_t> parts(all.begin() + at, all.begin() + at + kCycleKinds);
    std::uint64_t total = 0;
    for (std::uint64_t part : parts) total += part;
    if (total >= max_cycles) max_cycles = total, cycle_parts_ = parts;
  }
  const double trained = static_cast<double>((e + 1) * startup_.train_steps *
                                             c_.samples_per_replica_step() * c_.replicas);
  m.measured_samples_per_s = trained / train_seconds_;
  m.predicted_samples_per_s =
      max_cycles ? trained / (static_cast<double>(max_cycles) / arch_.clock_hz) : 0;
}

// Evaluation on each replica's shard of the test split, scored in replica order: the other
// instances send the first their replicas' outputs with the samples they are scored on.
void HostRole::evaluate(EpochMetrics& m) {
  TestScores scores = scoring_.scores();
  double test_loss = 0;
  for (std::size_t t = 0; t < startup_.test_steps; ++t) {
    // Per replica of this instance: outputs, loss, inputs, targets.
    std::vector<host::HostArray> own;
    for (std::size_t l = 0; l < local_replicas_; ++l) {
      own.push_back(std::move(expect_frame(*server_, l, kLogitsFrames).array));
      own.push_back(std::move(expect_frame(*server_, l, kLossFrames).array));
      host::Batch b = test_->batch(0, t, replica_of(l));
      own.push_back(std::move(b.inputs));
      own.push_back(std::move(b.targets));
    }
    if (!first_instance()) {
      std::vector<const host::HostArray*> arrays;
      for (const host::HostArray& a : own) arrays.push_back(&a);
      send_text(pack_arrays(arrays), 0, kEvaluationTag, hosts_);
      continue;
    }
    for (std::size_t i = 0; i < c_.host_instances; ++i) {
      const std::vector<host::HostArray> arrays =
          i == 0 ? std::move(own)
                 : unpack_arrays(receive_text(static_cast<int>(i), kEvaluationTag, hosts_));
      for (std::size_t a = 0; a + 3 < arrays.size(); a += 4) {
        test_loss += arrays[a + 1].as<const float>()[0];
        scores.add(arrays[a].as<const float>(), arrays[a + 2], arrays[a + 3]);
      }
    }
  }
  m.test_samples = startup_.test_steps * c_.replicas * c_.micro_batch;
  m.test_loss =
      test_loss / static_cast<double>(std::max<std::size_t>(startup_.test_steps * c_.replicas, 1));
  m.scores = scores.finish();
}

void HostRole::train_and_evaluate() {
  csv_ << (progress_.csv.empty() ? "epoch,step,loss,measured_samples_per_s\n" : progress_.csv);
  epochs_ = progress_.epochs;
  train_seconds_ = progress_.train_seconds;
  for (std::size_t e = startup_.resume_epoch; e < c_.epochs; ++e) {
    EpochMetrics m;
    m.epoch = e;
    const auto t0 = Clock::now();
    const double epoch_loss = train_epoch(e, t0);
    train_seconds_ += seconds_since(t0);
    if (stop_.signal != 0) return;
    m.train_loss = epoch_loss / static_cast<double>(std::max<std::size_t>(startup_.train_steps, 1));
    predict_throughput(m, e);
    evaluate(m);
    if (first_instance())
      std::cout << "epoch " << e + 1 << "/" << c_.epochs << ": train loss " << std::setprecision(4)
                << m.train_loss << ", test loss " << m.test_loss << ", "
                << TestScores::describe(scoring_.task, m.scores) << " (" << m.test_samples
                << " samples); " << format_rate(m.measured_samples_per_s) << " samples/s measured, "
                << std::fixed << std::setprecision(0) << m.predicted_samples_per_s
                << " samples/s predicted on " << arch_.name << std::endl;
    epochs_.push_back(m);
    const std::uint64_t done_steps = (e + 1) * startup_.train_steps;
    const bool due = checkpoint_due_after_epoch(c_, done_steps, e);
    if (due) checkpoint(e + 1, 0, done_steps, 0, train_seconds_);
    if (stop_boundary_after_epoch(e, c_.epochs) &&
        stop_here(e + 1, 0, done_steps, 0, train_seconds_, due))
      return;
  }
}

// Reports and final weights from every replica; the replicas must agree bit for bit. The other
// host instances pass theirs on to the first, which returns them all (the others: nothing).
FinalReports HostRole::collect_reports() {
  FinalReports out;
  std::vector<nlohmann::json> reports(c_.replicas);
  std::vector<std::vector<std::vector<std::byte>>> weights(c_.replicas);
  for (std::size_t l = 0; l < local_replicas_; ++l) {
    const std::size_t r = replica_of(l);
    reports[r] = parse_text_array(expect_frame(*server_, l, kReportFrames).array);
    reports[r]["host_node"] = boost::asio::ip::host_name();  // of the instance serving it
    const std::size_t tensors = reports[r].at("parameter_tensors");
    for (std::size_t p = 0; p < tensors; ++p)
      weights[r].push_back(std::move(expect_frame(*server_, l, kWeightFrames).array.bytes));
    if (first_instance()) continue;
    send_text(reports[r].dump(), 0, kReportTag, hosts_);
    for (const auto& tensor : weights[r]) send_bytes(tensor, 0, kWeightTag, hosts_);
  }
  if (!first_instance()) return out;
  for (std::size_t r = local_replicas_; r < c_.replicas; ++r) {
    const int from = static_cast<int>(r / local_replicas_);
    reports[r] = nlohmann::json::parse(receive_text(from, kReportTag, hosts_));
    const std::size_t tensors = reports[r].at("parameter_tensors");
    for (std::size_t p = 0; p < tensors; ++p)
      weights[r].push_back(receive_bytes(from, kWeightTag, hosts_));
  }
  for (std::size_t r = 0; r < c_.replicas; ++r) {
    nlohmann::json& j = reports[r];
    j["ipu"] = r * c_.stages;
    j["replica"] = r;
    // Every IPU of the job is a process of trace.json: the replica's stages side by side.
    const auto add_trace = [&](nlohmann::json& report, std::size_t stage) {
      const std::size_t ipu = r * c_.stages + stage;
      std::string label = "IPU " + std::to_string(ipu) + " (replica " + std::to_string(r);
      label += c_.stages > 1 ? ", stage " + std::to_string(stage) + ")" : ")";
      append_ipu_trace(out.trace["traceEvents"], std::move(report.at("trace")), ipu, label);
      report.erase("trace");
    };
    add_trace(j, 0);
    if (j.contains("later_stages"))
      for (auto& later : j.at("later_stages")) add_trace(later, later.at("stage"));
    j["host_instance"] = r / local_replicas_;
    out.memory.push_back(std::move(j));
  }
  for (std::size_t r = 0; r < c_.replicas; ++r) {
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a over every weight byte
    for (const auto& tensor : weights[r]) {
      for (std::byte b : tensor) h = (h ^ static_cast<std::uint8_t>(b)) * 1099511628211ull;
      if (r == 0) out.parameters += tensor.size() / sizeof(float);
    }
    std::ostringstream hex;
    hex << std::hex << std::setw(16) << std::setfill('0') << h;
    out.checksums.push_back(hex.str());
    out.identical = out.identical && weights[r] == weights[0];
  }
  return out;
}

void HostRole::write_run_files(const FinalReports& reports) {
  const auto breakdown_seconds = [&](std::size_t i) {
    return i < cycle_parts_.size() ? static_cast<double>(cycle_parts_[i]) / arch_.clock_hz : 0.0;
  };
  const double host_steps = static_cast<double>(c_.epochs * startup_.train_steps);
  nlohmann::json per_step = {{"compute", breakdown_seconds(0) / host_steps},
                             {"exchange", breakdown_seconds(1) / host_steps},
                             {"sync", breakdown_seconds(2) / host_steps},
                             {"host", breakdown_seconds(3) / host_steps},
                             {"fabric", breakdown_seconds(4) / host_steps}};
  nlohmann::json epoch_json = nlohmann::json::array();
  for (const auto& m : epochs_) epoch_json.push_back(metrics_json(m));
  const EpochMetrics& last = epochs_.back();
  nlohmann::json summary = {{"config", config_json(c_)},
                            {"samples_trained", static_cast<std::size_t>(host_steps) *
                                                    c_.samples_per_replica_step() * c_.replicas},
                            {"train_seconds", train_seconds_},
                            {"measured_samples_per_s", last.measured_samples_per_s},
                            {"predicted_ipu_samples_per_s", last.predicted_samples_per_s},
                            {"predicted_seconds_per_host_step", per_step},
                            {"task", models::task_name(scoring_.task)},
                            {"test_loss", last.test_loss},
                            {"epochs", epoch_json},
                            {"parameters", reports.parameters},
                            {"replica_weight_checksums", reports.checksums},
                            {"replica_weights_identical", reports.identical}};
  for (const auto& [name, value] : last.scores) summary[name] = value;
  summary["ipu_ranks_host_memory"] = host_memory_of_ranks(reports.memory);
  summary["host_node"] = boost::asio::ip::host_name();
  nlohmann::json instances = nlohmann::json::array();  // the node of each host instance
  for (std::size_t r = 0; r < c_.replicas; r += local_replicas_)
    instances.push_back({{"host_instance", r / local_replicas_},
                         {"node", reports.memory[r].value("host_node", std::string())},
                         {"replicas", {r, r + local_replicas_ - 1}}});
  summary["host_instances"] = instances;
  std::filesystem::remove(std::filesystem::path(c_.run_dir) / "stopped.txt");  // a resumed stop's
  write_file_atomically(c_.run_dir, "summary.json", summary.dump(2) + "\n");
  write_file_atomically(c_.run_dir, "metrics.csv", csv_.str());
  write_file_atomically(c_.run_dir, "memory.json", reports.memory.dump(1) + "\n");
  write_file_atomically(c_.run_dir, "trace.json", reports.trace.dump() + "\n");
  std::cout << "ipupod: replicas' final weights are "
            << (reports.identical ? "bitwise identical" : "DIFFERENT") << "; wrote " << c_.run_dir
            << "/{summary.json,metrics.csv,memory.json,trace.json}" << std::endl;
}

}  // namespace

int run_host(const TrainConfig& config, MPI_Comm world) {
  HostRole host(config, world);
  const bool first = host.first_instance();  // prints the job's messages
  // Every host instance opens the data (and a checkpoint to resume); one verdict for the job.
  const Startup startup = host.prepare();
  std::string message;
  const int prepared = start_verdict(world, true, startup.status, startup.message, &message);
  const IpuGroups groups(world, config, prepared == 0);  // collective: every rank splits
  if (prepared != 0) {
    if (first) std::cerr << "ipupod train: " << message << "\n";
    return prepared;
  }
  host.join(groups.hosts());
  broadcast_startup(startup, 0, groups.block());  // to this instance's IPUs
  // The IPUs compile, check that their programs fit and (resuming) the checkpoint's tensors
  // against their compiled model; the first IPU that found a fault says what. A rank that dies
  // meanwhile ends the job through MPI.
  if (const int verdict = start_verdict(world, true, 0, "", &message); verdict != 0) {
    const std::vector<nlohmann::json> reports = gather_unfit_reports(world, config, false);
    if (!first) return verdict;
    if (!reports.empty()) {
      write_file_atomically(config.run_dir, "memory.json", nlohmann::json(reports).dump(1) + "\n");
      message += (message.ends_with('.') ? " Every" : "; every") +
                 std::string(" IPU's memory report is in ") + config.run_dir + "/memory.json";
    }
    std::cerr << "ipupod train: " << message << "\n";
    return verdict;
  }
  if (const int verdict = host.accept_stream_clients(&message); verdict != 0) {
    if (first) std::cerr << "ipupod train: " << message << "\n";
    return verdict;
  }
  host.serve_resumed_tensors();
  if (first) host.print_banner();
  host.start_feeders();
  // A failure while the feeders run ends the job here, with its reason: unwinding past their
  // threads would end the process with std::terminate and no reason at all.
  try {
    host.train_and_evaluate();
  } catch (const std::exception& e) {
    abort_job(world, e.what());
  }
  if (host.stopped() != 0) return host.finish_stopped();
  host.join_feeders();
  const FinalReports reports = host.collect_reports();
  host.close();
  if (!first) return 0;  // the first instance writes the run directory
  host.write_run_files(reports);
  return reports.identical ? 0 : 1;
}

}  // namespace ipupod::pod
