// The IPU ranks of a training job: compile the model onto the emulated IPU, take batches from
// the host's TCP streams, all-reduce gradients over the fabric, send losses and reports back.
#include <malloc.h>

#include <boost/asio/ip/host_name.hpp>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "host/checkpoint.hpp"
#include "host/stream_client.hpp"
#include "ipu_process/engine.hpp"
#include "models/interpreter.hpp"
#include "pod/compiler/compiler.hpp"
#include "pod/host_memory.hpp"
#include "pod/job/device_fabric.hpp"
#include "pod/job/protocol.hpp"
#include "pod/job/stage_relay.hpp"
#include "pod/job/stop_signal.hpp"
#include "pod/job/train.hpp"
#include "pod/report.hpp"

namespace ipupod::pod {
namespace {

host::DType host_dtype(ipu::DType dtype) {
  switch (dtype) {
    case ipu::DType::f32:
      return host::DType::f32;
    case ipu::DType::f16:
      return host::DType::f16;
    case ipu::DType::i32:
      return host::DType::i32;
    case ipu::DType::u32:
      return host::DType::u32;
    case ipu::DType::u8:
      return host::DType::u8;
  }
  throw std::logic_error("no host dtype for device dtype " +
                         std::to_string(static_cast<int>(dtype)));
}

host::HostArray array_of(host::DType dtype, std::vector<std::size_t> shape,
                         std::span<const std::byte> bytes) {
  host::HostArray a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.bytes.assign(bytes.begin(), bytes.end());
  return a;
}

std::string kib(std::size_t bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / 1024 << " KiB";
  return os.str();
}

std::size_t bytes_of(const ipu::Tensor& tensor) {
  return tensor.elements() * ipu::dtype_size(tensor.dtype());
}

// One IPU rank's part of the job, step by step (run_ipu below reads as their sequence).
class IpuRole {
 public:
  IpuRole(const TrainConfig& config, MPI_Comm world, const Startup& startup,
          const IpuGroups& groups)
      : config_(config),
        world_(world),
        startup_(startup),
        place_(ipu_place(config, rank_of(world))),
        arch_(ipu::ArchPreset::get(config.arch)),
        fabric_(config, place_, world, groups.replicas()),
        relay_(fabric_.pipeline()) {}

  void compile();
  void construct_engine();
  // Whether the compiled program fits the tiles: with --allow-out-of-memory a program that
  // does not is compiled and reported, but no tile memory backs it and it cannot run.
  bool fits() const { return engine_ && engine_->memory().tiles_over() == 0; }
  void initialise_weights();
  void exchange_checkpoint_manifests();
  int start_verdict_after_resume_check();
  nlohmann::json memory_report() const;
  // False when a first stage could not connect (the host says why; every rank returns 1).
  bool connect_host_streams();
  void receive_resumed_tensors();
  int train_and_evaluate();
  void send_reports_and_weights();
  void close() {
    if (client_) client_->close();
  }

 private:
  static int rank_of(MPI_Comm world) {
    int rank = 0;
    MPI_Comm_rank(world, &rank);
    return rank;
  }
  bool first_stage() const { return place_.stage == 0; }
  void send_checkpoint();
  void send_own_checkpoint_tensors();
  void relay_later_checkpoint_tensors(std::set<std::string>& saved);

  const TrainConfig& config_;
  MPI_Comm world_;
  const Startup& startup_;
  IpuPlace place_;
  const ipu::ArchPreset& arch_;
  DeviceFabric fabric_;
  StageRelay relay_;
  models::Model model_, eval_model_;
  CompiledModel compiled_;
  std::optional<ipu::Engine> engine_;
  // A program that does not fit (without --allow-out-of-memory): no engine, the reason and the
  // memory report, for the host to print once (start_verdict) and write to memory.json.
  std::string out_of_memory_;
  std::optional<ipu::MemoryReport> unfit_memory_;
  std::map<std::string, ipu::Tensor> checkpointed_by_name_;
  // On the first stage: the tensors each later stage checkpoints ([name, shape, dtype]).
  std::vector<nlohmann::json> stage_tensors_;
  std::optional<host::StreamClient> client_;  // the first stage of each replica only
  host::Frame incoming_;
  std::uint64_t step_ = 0;  // host steps done
  ipu::CycleBreakdown training_;
};

void IpuRole::compile() {
  models::SplitPlan split_plan;
  JobModels models = build_job_models(config_, startup_.data_shape(), &split_plan);
  model_ = std::move(models.training);
  // Evaluation uses the inference-mode model (running statistics, no dropout), same weights.
  eval_model_ = std::move(models.eval);
  if (place_.ipu == 0 && !split_plan.stages.empty())
    std::cout << "ipupod: " << describe_split(split_plan) << std::endl;
  compiled_ = compile_for_ipu(model_, arch_,
                              {.gradient_accumulation = config_.gradient_accumulation,
                               .device_iterations = config_.device_iterations,
                               .replicas = config_.replicas,
                               .stages = config_.stages,
                               .stage = static_cast<std::size_t>(place_.stage),
                               .grouped = config_.pipeline_schedule == "grouped",
                               .recompute = config_.recompute,
                               .float16 = config_.precision == "fp16",
                               .replicated_tensor_sharding = config_.replicated_tensor_sharding,
                               .replica = static_cast<std::size_t>(place_.replica),
                               .available_memory_proportion = config_.available_memory_proportion,
                               .half_partials = config_.partials_type == "half"},
                              &eval_model_);
  // The engine takes the programs: their copy runs go once it has compiled its exchanges.
  try {
    construct_engine();
  } catch (const ipu::OutOfMemoryError& e) {
    out_of_memory_ = "IPU " + std::to_string(place_.ipu) + " (replica " +
                     std::to_string(place_.replica) + ", stage " + std::to_string(place_.stage) +
                     "): " + e.what();
    unfit_memory_ = e.report();
    return;
  }
#if defined(__GLIBC__)
  // The graph's vertex tables and the lowering's working sets are freed but stay resident in
  // the heap's free lists; give those pages back before the run touches its tile memory.
  malloc_trim(0);
#endif
  checkpointed_by_name_.insert(compiled_.checkpointed.begin(), compiled_.checkpointed.end());
  engine_->set_tracing(config_.trace_from_step == 0);  // the window may begin later
}

void IpuRole::construct_engine() {
  engine_.emplace(
      *compiled_.graph, std::move(compiled_.programs),
      ipu::EngineOptions{.allow_out_of_memory = config_.allow_out_of_memory,
                         .threads = 1,
                         .trace_events = config_.trace_events,
                         .float16_stores = {.rounding = config_.stochastic_rounding == "on"
                                                            ? ipu::Rounding::stochastic
                                                            : ipu::Rounding::nearest_even,
                                            .seed = config_.seed}},
      ipu::Engine::ReleaseGraphTables{});
}

// Every replica starts from the same weights: the initialiser is keyed by the seed only.
void IpuRole::initialise_weights() {
  for (const auto& [id, tensor] : compiled_.initial_values) {
    const models::Buffer init = models::initial_parameter(model_.graph, id, config_.seed);
    engine_->write_values(tensor, init.f);
  }
  for (const auto& [tensor, value] : compiled_.constants) {
    std::vector<float> fill(tensor.elements(), value);
    engine_->write(tensor, std::as_bytes(std::span(fill)));
  }
}

// A pipelined replica's checkpoint holds every stage's tensors: the first stage learns which
// tensors the later ones keep (a tensor several stages keep, like the optimizer's step
// counter, is the same on each and saved once) and relays them to and from the host.
void IpuRole::exchange_checkpoint_manifests() {
  stage_tensors_.assign(config_.stages, nlohmann::json());
  const bool checkpoints = config_.checkpoint_every > 0 || startup_.resume;
  if (checkpoints && config_.stages > 1) {
    std::vector<nlohmann::json> all =
        relay_.gather_manifests(StageRelay::manifest(compiled_.checkpointed));
    if (first_stage()) stage_tensors_ = std::move(all);
  }
}

// Every IPU has compiled (minutes for a large model) before the host starts timing its
// streams: the host waits here with them. Resuming, the first IPU of each replica checks the
// checkpoint holds exactly the tensors its pipeline checkpoints; IPU 0 tells the host.
int IpuRole::start_verdict_after_resume_check() {
  int status = 0;
  std::string message;
  if (!engine_) {
    status = 1;  // as `ipupod compile` does for a stage that does not fit
    message = out_of_memory_;
  } else if (!fits()) {
    const ipu::MemoryReport& memory = engine_->memory();
    const ipu::TileMemory* worst = &memory.tiles.front();
    for (const auto& tile : memory.tiles)
      if (tile.total() > worst->total()) worst = &tile;
    status = 2;
    message = "the model does not fit IPU " + std::to_string(place_.ipu) + " (replica " +
              std::to_string(place_.replica) + ", stage " + std::to_string(place_.stage) +
              "): " + std::to_string(memory.tiles_over()) + " of " + std::to_string(arch_.tiles) +
              " tiles of '" + arch_.name + "' exceed their " + kib(arch_.bytes_per_tile) +
              " (the worst, tile " + std::to_string(worst->tile) + ", needs " +
              kib(worst->total()) +
              "). --allow-out-of-memory finishes the compile and reports the memory, but an IPU "
              "runs only a program that fits. Try: more pipeline stages or a different split, a "
              "smaller micro-batch, --recompute (with 2 or more stages), or an architecture with "
              "more memory per tile";
  } else if (startup_.resume && first_stage()) {
    std::map<std::string, std::vector<std::size_t>> expected;
    for (const auto& [name, tensor] : compiled_.checkpointed) expected[name] = tensor.shape();
    for (const auto& later : stage_tensors_)
      for (const auto& t : later) expected[t[0]] = t[1].get<std::vector<std::size_t>>();
    try {
      host::check_compatible(startup_.resume_shapes, startup_.resume_host_step, expected);
    } catch (const host::CheckpointError& e) {
      status = 2;
      message = "cannot resume from '" + config_.resume + "': " + e.what();
    }
  }
  return start_verdict(world_, false, status, message);
}

// The host streams to and from the first stage of each replica only.
bool IpuRole::connect_host_streams() {
  step_ = startup_.resume_host_step;
  training_ = cycles_from(startup_.resume_cycles);
  int status = 0;
  std::string message;
  if (first_stage()) {
    const auto timeout = std::chrono::milliseconds(static_cast<long>(config_.timeout_s * 1000));
    try {
      client_.emplace(host::ClientConfig{
          .address = startup_.address,
          .port = startup_.port,
          .secret = startup_.secret,
          // among its host instance's replicas
          .client_id = static_cast<std::size_t>(place_.replica) % config_.replicas_per_instance(),
          .credits = 8,
          .timeout = timeout});
    } catch (const std::exception& e) {
      status = 1;
      message = "IPU " + std::to_string(place_.ipu) + " (rank " + std::to_string(rank_of(world_)) +
                ", node " + boost::asio::ip::host_name() + "): " + e.what();
    }
  }
  // One message for the job, from the host, whichever ranks could not connect.
  if (start_verdict(world_, false, status, message) != 0) return false;
  ipu::Engine& engine = *engine_;
  engine.connect_input_stream(kInputStream, [this](std::span<std::byte> dst) {
    take_frame(*client_, kInputFrames, dst, incoming_);
  });
  engine.connect_input_stream(kLabelStream, [this](std::span<std::byte> dst) {
    take_frame(*client_, kLabelFrames, dst, incoming_);
  });
  engine.connect_output_stream(kLossStream, [this](std::span<const std::byte> src) {
    client_->send({kLossFrames, step_, array_of(host::DType::f32, {}, src)});
  });
  engine.connect_output_stream(kLogitsStream, [this](std::span<const std::byte> src) {
    client_->send(
        {kLogitsFrames, step_, array_of(host::DType::f32, compiled_.eval_logits.shape(), src)});
  });
  engine.bind_collectives(fabric_.binding());
  return true;
}

// Resuming: the first stage takes the checkpoint's tensors from the host in name order and
// hands each later stage those it keeps; a later stage takes its own from the first.
void IpuRole::receive_resumed_tensors() {
  if (!startup_.resume) return;
  if (!first_stage()) {
    for (const auto& [name, tensor] : checkpointed_by_name_) {
      std::vector<std::byte> bytes(bytes_of(tensor));
      try {
        relay_.receive_resume(bytes);
      } catch (const std::exception& e) {
        throw std::runtime_error("resuming: checkpoint tensor '" + name + "': " + e.what());
      }
      engine_->write(tensor, bytes);
    }
    return;
  }
  host::Frame frame;
  for (const auto& [name, shape] : startup_.resume_shapes) {
    client_->receive(frame);
    const std::size_t bytes = frame.array.bytes.size();
    if (frame.stream != kCheckpointFrames)
      throw std::runtime_error("resuming: expected checkpoint tensor '" + name +
                               "' from the host, got stream " + std::to_string(frame.stream));
    if (auto it = checkpointed_by_name_.find(name); it != checkpointed_by_name_.end()) {
      if (bytes != bytes_of(it->second))
        throw std::runtime_error("resuming: checkpoint tensor '" + name + "' has " +
                                 std::to_string(bytes) + " bytes, the IPU's " +
                                 std::to_string(bytes_of(it->second)));
      engine_->write(it->second, frame.array.bytes);
    }
    for (std::size_t s = 1; s < config_.stages; ++s)  // then to the later stages that keep it
      for (const auto& t : stage_tensors_[s])
        if (t[0] == name) relay_.send_resume_to(static_cast<int>(s), frame.array.bytes);
  }
}

// Returns 0 when every epoch ran, else the signal on which every rank agreed to stop (after a
// final checkpoint when checkpoints are on).
int IpuRole::train_and_evaluate() {
  const bool checkpoints = config_.checkpoint_every > 0;
  for (std::size_t epoch = startup_.resume_epoch; epoch < config_.epochs; ++epoch) {
    const std::size_t first = epoch == startup_.resume_epoch ? startup_.resume_step : 0;
    for (std::size_t s = first; s < startup_.train_steps; ++s, ++step_) {
      const ipu::CycleBreakdown before = engine_->cycles();
      engine_->set_tracing(step_ >= config_.trace_from_step);  // trace.json's window
      engine_->run("train");
      training_ += engine_->cycles() - before;
      const bool due = checkpoint_due_within_epoch(config_, step_ + 1, s, startup_.train_steps);
      if (due) send_checkpoint();
      if (!stop_boundary_within_epoch(s, startup_.train_steps)) continue;
      if (const int signal = agree_to_stop(world_); signal != 0) {
        if (checkpoints && !due) send_checkpoint();
        fabric_.finish_sends();
        return signal;
      }
    }
    if (client_) client_->send({kCycleFrames, step_, cycles_array(training_)});
    for (std::size_t t = 0; t < startup_.test_steps; ++t) engine_->run("eval");
    const bool due = checkpoint_due_after_epoch(config_, step_, epoch);
    if (due) send_checkpoint();
    if (!stop_boundary_after_epoch(epoch, config_.epochs)) continue;
    if (const int signal = agree_to_stop(world_); signal != 0) {
      if (checkpoints && !due) send_checkpoint();
      fabric_.finish_sends();
      return signal;
    }
  }
  fabric_.finish_sends();
  return 0;
}

// Replica 0 sends the host what a checkpoint holds: a manifest, then each tensor; its later
// stages send theirs through the first.
void IpuRole::send_checkpoint() {
  if (place_.replica != 0) return;
  if (!first_stage()) {
    for (const auto& [name, tensor] : compiled_.checkpointed)
      relay_.send_to_first(engine_->read(tensor));
    return;
  }
  nlohmann::json names = nlohmann::json::array();
  std::set<std::string> saved;
  for (const auto& [name, tensor] : compiled_.checkpointed) {
    names.push_back(name);
    saved.insert(name);
  }
  for (const auto& later : stage_tensors_)
    for (const auto& t : later)
      if (saved.insert(t[0].get<std::string>()).second) names.push_back(t[0]);
  const nlohmann::json manifest = {{"names", names}, {"cycles", cycle_parts(training_)}};
  client_->send({kCheckpointFrames, step_, text_array(manifest.dump())});
  send_own_checkpoint_tensors();
  saved.clear();
  for (const auto& [name, tensor] : compiled_.checkpointed) saved.insert(name);
  relay_later_checkpoint_tensors(saved);
}

void IpuRole::send_own_checkpoint_tensors() {
  for (const auto& [name, tensor] : compiled_.checkpointed) {
    const std::vector<std::byte> bytes = engine_->read(tensor);
    const std::vector<std::size_t> shape = tensor.shape();
    client_->send(
        host::FrameView(kCheckpointFrames, step_, host_dtype(tensor.dtype()), shape, bytes));
  }
}

// The later stages' tensors, in stage order, each sent on to the host unless already saved.
void IpuRole::relay_later_checkpoint_tensors(std::set<std::string>& saved) {
  for (std::size_t s = 1; s < config_.stages; ++s)
    for (const auto& t : stage_tensors_[s]) {
      const auto shape = t[1].get<std::vector<std::size_t>>();
      const auto dtype = static_cast<ipu::DType>(t[2].get<int>());
      std::vector<std::byte> bytes(host::shape_elements(shape) * ipu::dtype_size(dtype));
      relay_.receive_from(static_cast<int>(s), bytes);
      if (saved.insert(t[0].get<std::string>()).second)
        client_->send(host::FrameView(kCheckpointFrames, step_, host_dtype(dtype), shape, bytes));
    }
}

// Later stages report their memory through the first one, which sends the replica's report,
// its predicted timeline and its final weights to the host.
nlohmann::json IpuRole::memory_report() const {
  nlohmann::json report = memory_report_json(engine_ ? engine_->memory() : *unfit_memory_, arch_);
  report["stage"] = place_.stage;
  report["stash_slots"] = compiled_.stash_slots;
  report["parameter_tensors"] = compiled_.parameters.size();
  // The emulator's own memory beside the tile memory it emulates.
  report["host_peak_resident_bytes"] = peak_resident_bytes();
  report["node"] = boost::asio::ip::host_name();  // where this IPU ran (a multi-node job's map)
  return report;
}

// Every stage's final weights go to the host (which counts them and checks that the replicas
// agree), a later stage's through the first: its report lists their ids and shapes, then it
// sends their values.
void IpuRole::send_reports_and_weights() {
  nlohmann::json report = memory_report();
  report["trace"] = trace_json(engine_->trace(), arch_);  // every stage's, for trace.json
  if (!first_stage()) {
    nlohmann::json shapes = nlohmann::json::array();
    for (const auto& [id, tensor] : compiled_.parameters) {
      const ipu::Shape& shape = tensor.shape();
      shapes.push_back(
          {{"id", id}, {"shape", std::vector<std::size_t>(shape.begin(), shape.end())}});
    }
    report["parameter_shapes"] = std::move(shapes);
  }
  std::vector<nlohmann::json> later = relay_.gather_reports(report);
  if (!first_stage()) {
    for (const auto& [id, tensor] : compiled_.parameters) {
      const std::vector<float> values = engine_->read_values(tensor);  // float32 for the host
      relay_.send_to_first(std::as_bytes(std::span(values)));
    }
    return;
  }
  std::vector<nlohmann::json> later_shapes;
  std::size_t tensors = compiled_.parameters.size();
  for (nlohmann::json& stage : later) {
    later_shapes.push_back(std::move(stage.at("parameter_shapes")));
    stage.erase("parameter_shapes");
    tensors += later_shapes.back().size();
  }
  report["parameter_tensors"] = tensors;
  if (!later.empty()) report["later_stages"] = std::move(later);
  client_->send({kReportFrames, step_, text_array(report.dump())});
  const auto send_weight = [&](std::uint64_t id, const std::vector<std::size_t>& shape,
                               const std::vector<float>& values) {
    client_->send(
        {kWeightFrames, id, array_of(host::DType::f32, shape, std::as_bytes(std::span(values)))});
  };
  for (const auto& [id, tensor] : compiled_.parameters) {
    const ipu::Shape& shape = tensor.shape();
    send_weight(static_cast<std::uint64_t>(id), {shape.begin(), shape.end()},
                engine_->read_values(tensor));
  }
  for (std::size_t s = 0; s < later_shapes.size(); ++s)
    for (const nlohmann::json& p : later_shapes[s]) {
      const auto shape = p.at("shape").get<std::vector<std::size_t>>();
      std::size_t elements = 1;
      for (std::size_t d : shape) elements *= d;
      std::vector<float> values(elements);
      relay_.receive_from(static_cast<int>(s + 1), std::as_writable_bytes(std::span(values)));
      send_weight(p.at("id").get<std::uint64_t>(), shape, values);
    }
}

}  // namespace

int run_ipu(const TrainConfig& config, MPI_Comm world) {
  // The host instances' data and resume checks first (one verdict for the job), then the
  // start-up record of this rank's own host instance.
  const int prepared = start_verdict(world, false, 0, "");
  const IpuGroups groups(world, config, prepared == 0);
  if (prepared != 0) return prepared;
  const Startup startup = broadcast_startup({}, 0, groups.block());
  IpuRole ipu(config, world, startup, groups);
  ipu.compile();
  if (ipu.fits()) ipu.initialise_weights();
  ipu.exchange_checkpoint_manifests();
  if (const int verdict = ipu.start_verdict_after_resume_check(); verdict != 0) {
    gather_unfit_reports(world, config, !ipu.fits(), ipu.memory_report());
    return verdict;
  }
  if (!ipu.connect_host_streams()) return 1;
  // Failures from here on are reported before the stream client closes (which would make the
  // host fail first with a less useful message).
  try {
    ipu.receive_resumed_tensors();
    if (const int signal = ipu.train_and_evaluate(); signal != 0) {
      ipu.close();  // the host reports the stop
      return stopped_exit_code(signal);
    }
    ipu.send_reports_and_weights();
  } catch (const std::exception& e) {
    abort_job(world, e.what());
  }
  ipu.close();
  return 0;
}

}  // namespace ipupod::pod
