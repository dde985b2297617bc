// The IPU ranks of a training job: compile the model onto the emulated IPU, take batches from
// the host's TCP streams, all-reduce gradients over the fabric, send losses and reports back.
#include <cstring>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "fabric/collectives.hpp"
#include "fabric/mpi_transport.hpp"
#include "fabric/topology.hpp"
#include "host/checkpoint.hpp"
#include "host/stream_client.hpp"
#include "ipu_process/engine.hpp"
#include "models/interpreter.hpp"
#include "pod/compiler.hpp"
#include "pod/report.hpp"
#include "pod/train.hpp"
#include "pod/wire.hpp"

namespace ipupod::pod {
namespace {

// Tags of what later pipeline stages exchange with the first besides transfers (above every
// transfer's): memory reports, the tensors each checkpoints (names, shapes, dtypes), their bytes
// when a checkpoint is due, and the checkpoint's bytes on resume.
constexpr int kStageReportTag = 32000, kStageManifestTag = 32001, kStageCheckpointTag = 32002,
              kStageResumeTag = 32003;

// A pipelined stage's checkpointed tensors as JSON: [[name, shape, dtype], ...].
nlohmann::json checkpoint_manifest(
    const std::vector<std::pair<std::string, ipu::Tensor>>& tensors) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [name, tensor] : tensors)
    j.push_back({name, tensor.shape(), static_cast<int>(tensor.dtype())});
  return j;
}

host::HostArray array_of(host::DType dtype, std::vector<std::size_t> shape,
                         std::span<const std::byte> bytes) {
  host::HostArray a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.bytes.assign(bytes.begin(), bytes.end());
  return a;
}

// Takes the next host frame into a device stream buffer, checking it is the one expected.
// `f` is kept between calls so that its payload buffer is reused for later frames.
void take_frame(host::StreamClient& client, StreamId expected, std::span<std::byte> dst,
                host::Frame& f) {
  client.receive(f);
  if (f.stream != expected || f.array.bytes.size() != dst.size())
    throw std::runtime_error("host stream out of step: expected stream " +
                             std::to_string(expected) + " with " + std::to_string(dst.size()) +
                             " bytes, got stream " + std::to_string(f.stream) + " with " +
                             std::to_string(f.array.bytes.size()) + " bytes");
  std::memcpy(dst.data(), f.array.bytes.data(), dst.size());
}

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

host::HostArray cycles_array(const ipu::CycleBreakdown& c) {
  const std::uint64_t values[] = {c.compute, c.exchange, c.sync, c.host, c.fabric};
  host::HostArray a = host::HostArray::zeros(host::DType::u32, {5, 2});
  auto out = a.as<std::uint32_t>();
  for (std::size_t i = 0; i < 5; ++i) {
    out[2 * i] = static_cast<std::uint32_t>(values[i] >> 32);
    out[2 * i + 1] = static_cast<std::uint32_t>(values[i] & 0xffffffffu);
  }
  return a;
}

}  // namespace

int run_ipu(const TrainConfig& config, MPI_Comm world) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  const Startup startup = broadcast_startup({}, 0, world);
  // Replica group of this stage (the gradient all-reduce); the host takes no part.
  const int stage = static_cast<int>((rank - 1) % config.stages);
  const int replica = static_cast<int>((rank - 1) / config.stages);
  MPI_Comm replicas_comm = MPI_COMM_NULL;
  MPI_Comm_split(world, startup.status == 0 ? stage : MPI_UNDEFINED, rank, &replicas_comm);
  // This replica's pipeline, ranked by stage (activations, gradients, cross-IPU syncs).
  MPI_Comm pipeline_comm = MPI_COMM_NULL;
  MPI_Comm_split(world, startup.status == 0 ? replica : MPI_UNDEFINED, stage, &pipeline_comm);
  if (startup.status != 0) return startup.status;

  const ipu::ArchPreset& arch = ipu::ArchPreset::get(config.arch);
  models::ModelOptions training_options = model_options(config, startup, true);
  models::SplitPlan split_plan;
  use_automatic_split(config, training_options, &split_plan);
  const models::Model model = models::build_model(config.model, training_options);
  if (rank == 1 && !split_plan.stages.empty())
    std::cout << "ipupod: " << describe_split(split_plan) << std::endl;
  // Evaluation uses the inference-mode model (running statistics, no dropout), same weights.
  models::ModelOptions eval_options = model_options(config, startup, false);
  follow_automatic_split(config, model, eval_options);
  const models::Model eval_model = models::build_model(config.model, eval_options);
  CompiledModel compiled =
      compile_for_ipu(model, arch,
                      {.gradient_accumulation = config.gradient_accumulation,
                       .device_iterations = config.device_iterations,
                       .replicas = config.replicas,
                       .stages = config.stages,
                       .stage = static_cast<std::size_t>(stage),
                       .grouped = config.pipeline_schedule == "grouped",
                       .recompute = config.recompute,
                       .float16 = config.precision == "fp16",
                       .replicated_tensor_sharding = config.replicated_tensor_sharding,
                       .replica = static_cast<std::size_t>(replica),
                       .available_memory_proportion = config.available_memory_proportion},
                      &eval_model);
  ipu::Engine engine(*compiled.graph, compiled.programs,
                     {.allow_out_of_memory = config.allow_out_of_memory,
                      .threads = 1,
                      .trace_events = config.trace_events,
                      .float16_stores = {.rounding = config.stochastic_rounding == "on"
                                                         ? ipu::Rounding::stochastic
                                                         : ipu::Rounding::nearest_even,
                                         .seed = config.seed}});

  // Every replica starts from the same weights: the initialiser is keyed by the seed only.
  for (const auto& [id, tensor] : compiled.initial_values) {
    const models::Buffer init = models::initial_parameter(model.graph, id, config.seed);
    engine.write_values(tensor, init.f);
  }
  for (const auto& [tensor, value] : compiled.constants) {
    std::vector<float> fill(tensor.elements(), value);
    engine.write(tensor, std::as_bytes(std::span(fill)));
  }

  // A pipelined replica's checkpoint holds every stage's tensors: the first stage learns which
  // tensors the later ones keep (a tensor several stages keep, like the optimizer's step
  // counter, is the same on each and saved once) and relays them to and from the host.
  const bool checkpoints = config.checkpoint_every > 0 || startup.resume;
  std::vector<nlohmann::json> stage_tensors(config.stages);  // on the first stage
  if (checkpoints && config.stages > 1) {
    if (stage > 0)
      send_text(checkpoint_manifest(compiled.checkpointed).dump(), 0, kStageManifestTag,
                pipeline_comm);
    else
      for (std::size_t s = 1; s < config.stages; ++s)
        stage_tensors[s] = nlohmann::json::parse(
            receive_text(static_cast<int>(s), kStageManifestTag, pipeline_comm));
  }

  // Every IPU has compiled (minutes for a large model) before the host starts timing its
  // streams: the host waits here with them. Resuming, the host has read the checkpoint; the
  // first IPU of each replica checks it holds exactly the tensors its pipeline checkpoints,
  // and IPU 0 tells the host what does not fit.
  {
    int status = 0, verdict = 0;
    std::string message;
    if (startup.resume) {
      std::map<std::string, std::vector<std::size_t>> expected;
      for (const auto& [name, tensor] : compiled.checkpointed) expected[name] = tensor.shape();
      for (const auto& later : stage_tensors)
        for (const auto& t : later) expected[t[0]] = t[1].get<std::vector<std::size_t>>();
      try {
        if (stage == 0)
          host::check_compatible(startup.resume_shapes, startup.resume_host_step, expected);
      } catch (const host::CheckpointError& e) {
        status = 2;
        message = e.what();
      }
    }
    MPI_Allreduce(&status, &verdict, 1, MPI_INT, MPI_MAX, world);
    if (verdict != 0) {
      if (rank == 1) {
        int length = static_cast<int>(message.size());
        MPI_Send(&length, 1, MPI_INT, 0, 0, world);
        MPI_Send(message.data(), length, MPI_CHAR, 0, 0, world);
      }
      MPI_Comm_free(&pipeline_comm);
      MPI_Comm_free(&replicas_comm);
      return verdict;
    }
  }

  const auto timeout = std::chrono::milliseconds(static_cast<long>(config.timeout_s * 1000));
  // The host streams to and from the first stage of each replica only.
  std::optional<host::StreamClient> client;
  if (stage == 0)
    client.emplace(host::ClientConfig{.address = startup.address,
                                      .port = startup.port,
                                      .secret = startup.secret,
                                      .client_id = static_cast<std::size_t>(replica),
                                      .credits = 8,
                                      .timeout = timeout});
  std::uint64_t step = startup.resume_host_step;
  const std::map<std::string, ipu::Tensor> checkpointed_by_name(compiled.checkpointed.begin(),
                                                                compiled.checkpointed.end());
  if (startup.resume && stage == 0) {  // the checkpoint's tensors come first, in name order
    host::Frame frame;
    for (const auto& [name, shape] : startup.resume_shapes) {
      client->receive(frame);
      const std::size_t bytes = frame.array.bytes.size();
      if (frame.stream != kCheckpointFrames)
        throw std::runtime_error("resuming: expected checkpoint tensor '" + name +
                                 "' from the host, got stream " + std::to_string(frame.stream));
      if (auto it = checkpointed_by_name.find(name); it != checkpointed_by_name.end()) {
        const ipu::Tensor& tensor = it->second;
        if (bytes != tensor.elements() * ipu::dtype_size(tensor.dtype()))
          throw std::runtime_error(
              "resuming: checkpoint tensor '" + name + "' has " + std::to_string(bytes) +
              " bytes, the IPU's " +
              std::to_string(tensor.elements() * ipu::dtype_size(tensor.dtype())));
        engine.write(tensor, frame.array.bytes);
      }
      for (std::size_t s = 1; s < config.stages; ++s)  // then to the later stages that keep it
        for (const auto& t : stage_tensors[s])
          if (t[0] == name)
            MPI_Send(frame.array.bytes.data(), static_cast<int>(bytes), MPI_BYTE,
                     static_cast<int>(s), kStageResumeTag, pipeline_comm);
    }
  } else if (startup.resume) {  // a later stage: its own tensors from the first, in name order
    for (const auto& [name, tensor] : checkpointed_by_name) {
      std::vector<std::byte> bytes(tensor.elements() * ipu::dtype_size(tensor.dtype()));
      MPI_Status status;
      MPI_Recv(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, 0, kStageResumeTag,
               pipeline_comm, &status);
      int got = 0;
      MPI_Get_count(&status, MPI_BYTE, &got);
      if (static_cast<std::size_t>(got) != bytes.size())
        throw std::runtime_error("resuming: checkpoint tensor '" + name + "' arrived with " +
                                 std::to_string(got) + " bytes, expected " +
                                 std::to_string(bytes.size()));
      engine.write(tensor, bytes);
    }
  }
  host::Frame incoming;
  engine.connect_input_stream(kInputStream, [&](std::span<std::byte> dst) {
    take_frame(*client, kInputFrames, dst, incoming);
  });
  engine.connect_input_stream(kLabelStream, [&](std::span<std::byte> dst) {
    take_frame(*client, kLabelFrames, dst, incoming);
  });
  engine.connect_output_stream(kLossStream, [&](std::span<const std::byte> src) {
    client->send({kLossFrames, step, array_of(host::DType::f32, {}, src)});
  });
  engine.connect_output_stream(kLogitsStream, [&](std::span<const std::byte> src) {
    client->send(
        {kLogitsFrames, step, array_of(host::DType::f32, compiled.eval_logits.shape(), src)});
  });

  fabric::MpiTransport transport(replicas_comm);
  const fabric::Topology topology = fabric::Topology::preset(config.topology);
  std::vector<int> ring;  // IPUs of this stage's replicas, in replica order
  for (std::size_t r = 0; r < config.replicas; ++r)
    ring.push_back(static_cast<int>(r * config.stages) + stage);
  // The fabric picks the algorithm for the topology (ring, bidirectional ring, hierarchical)
  // and the device is charged that algorithm's predicted time on the real links.
  fabric::CollectiveOptions collective_options;
  collective_options.topology = &topology;
  collective_options.ipus = ring;
  ipu::CollectiveBinding collectives;
  collectives.all_reduce = [&](std::span<float> data, ipu::CollectiveOp op) {
    fabric::all_reduce(
        transport, data,
        op == ipu::CollectiveOp::mean ? fabric::ReduceOp::mean : fabric::ReduceOp::sum,
        collective_options);
  };
  const auto predict = [&](fabric::Collective collective, std::size_t bytes) {
    return fabric::predict(collective, fabric::DataType::float32, bytes / sizeof(float),
                           static_cast<int>(config.replicas), collective_options)
        .predicted_seconds;
  };
  collectives.predict_seconds = [&](std::size_t bytes) {
    return predict(fabric::Collective::all_reduce, bytes);
  };
  // Replicated tensor sharding: block r of the buffer is replica r's (transport rank r).
  collectives.reduce_scatter = [&](std::span<const float> input, std::span<float> block,
                                   ipu::CollectiveOp op) {
    fabric::reduce_scatter(
        transport, input, block,
        op == ipu::CollectiveOp::mean ? fabric::ReduceOp::mean : fabric::ReduceOp::sum,
        collective_options);
  };
  collectives.all_gather = [&](std::span<const float> block, std::span<float> output) {
    fabric::all_gather(transport, block, output, collective_options);
  };
  collectives.predict_reduce_scatter_seconds = [&](std::size_t bytes) {
    return predict(fabric::Collective::reduce_scatter, bytes);
  };
  collectives.predict_all_gather_seconds = [&](std::size_t bytes) {
    return predict(fabric::Collective::all_gather, bytes);
  };
  // Pipeline transfers: sends copy their bytes and complete in the background (a stage never
  // waits on its successor to post a receive); receives block; each slot of the grouped
  // schedule ends with a sync that releases when the replica's slowest stage arrives.
  struct PendingSend {
    std::vector<std::byte> bytes;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  std::deque<PendingSend> pending;
  const auto finish_sends = [&](bool all) {
    while (!pending.empty()) {
      int done = 0;
      if (all)
        MPI_Wait(&pending.front().request, MPI_STATUS_IGNORE), done = 1;
      else
        MPI_Test(&pending.front().request, &done, MPI_STATUS_IGNORE);
      if (!done) break;
      pending.pop_front();
    }
  };
  const int my_ipu = replica * static_cast<int>(config.stages) + stage;
  collectives.send = [&](unsigned peer, unsigned tag, std::span<const std::byte> bytes) {
    finish_sends(false);
    pending.push_back({std::vector<std::byte>(bytes.begin(), bytes.end())});
    MPI_Isend(pending.back().bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE,
              static_cast<int>(peer), static_cast<int>(tag), pipeline_comm,
              &pending.back().request);
  };
  collectives.receive = [&](unsigned peer, unsigned tag, std::span<std::byte> bytes) {
    MPI_Status status;
    MPI_Recv(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, static_cast<int>(peer),
             static_cast<int>(tag), pipeline_comm, &status);
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if (static_cast<std::size_t>(got) != bytes.size())
      throw std::runtime_error("pipeline transfer " + std::to_string(tag) + " from stage " +
                               std::to_string(peer) + ": expected " + std::to_string(bytes.size()) +
                               " bytes, got " + std::to_string(got));
  };
  collectives.predict_transfer_seconds = [&](unsigned peer, std::size_t bytes) {
    const int peer_ipu = replica * static_cast<int>(config.stages) + static_cast<int>(peer);
    if (peer_ipu == my_ipu) return 0.0;
    const fabric::LinkClass& link = topology.link(my_ipu, peer_ipu);
    return link.latency_s + static_cast<double>(bytes) / link.bandwidth_bytes_per_s;
  };
  collectives.external_sync = [&](std::uint64_t cycles) {
    std::uint64_t latest = cycles;
    if (config.stages > 1) MPI_Allreduce(&cycles, &latest, 1, MPI_UINT64_T, MPI_MAX, pipeline_comm);
    return latest;
  };
  engine.bind_collectives(std::move(collectives));

  // Failures from here on are reported before the stream client closes (which would make the
  // host fail first with a less useful message).
  try {
    ipu::CycleBreakdown training;
    if (startup.resume && startup.resume_cycles.size() == 5) {
      const auto& c = startup.resume_cycles;
      training.compute = c[0], training.exchange = c[1], training.sync = c[2];
      training.host = c[3], training.fabric = c[4];
    }
    // Replica 0 sends the host what a checkpoint holds: a manifest, then each tensor; its later
    // stages send theirs through the first.
    const auto send_checkpoint = [&] {
      if (replica != 0) return;
      if (stage > 0) {
        for (const auto& [name, tensor] : compiled.checkpointed) {
          const std::vector<std::byte> bytes = engine.read(tensor);
          MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, 0, kStageCheckpointTag,
                   pipeline_comm);
        }
        return;
      }
      nlohmann::json names = nlohmann::json::array();
      std::set<std::string> saved;
      for (const auto& [name, tensor] : compiled.checkpointed) {
        names.push_back(name);
        saved.insert(name);
      }
      for (const auto& later : stage_tensors)
        for (const auto& t : later)
          if (saved.insert(t[0].get<std::string>()).second) names.push_back(t[0]);
      const std::string manifest = nlohmann::json{
          {"names", names},
          {"cycles",
           {training.compute, training.exchange, training.sync, training.host,
            training.fabric}}}.dump();
      client->send(
          {kCheckpointFrames, step,
           array_of(host::DType::u8, {manifest.size()}, std::as_bytes(std::span(manifest)))});
      for (const auto& [name, tensor] : compiled.checkpointed) {
        const std::vector<std::byte> bytes = engine.read(tensor);
        client->send(host::FrameView(kCheckpointFrames, step, host_dtype(tensor.dtype()),
                                     tensor.shape(), bytes));
      }
      saved.clear();
      for (const auto& [name, tensor] : compiled.checkpointed) saved.insert(name);
      for (std::size_t s = 1; s < config.stages; ++s)
        for (const auto& t : stage_tensors[s]) {
          const auto shape = t[1].get<std::vector<std::size_t>>();
          const auto dtype = static_cast<ipu::DType>(t[2].get<int>());
          std::vector<std::byte> bytes(host::shape_elements(shape) * ipu::dtype_size(dtype));
          MPI_Recv(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, static_cast<int>(s),
                   kStageCheckpointTag, pipeline_comm, MPI_STATUS_IGNORE);
          if (saved.insert(t[0].get<std::string>()).second)
            client->send(host::FrameView(kCheckpointFrames, step, host_dtype(dtype), shape, bytes));
        }
    };
    const std::size_t every = config.checkpoint_every;
    for (std::size_t epoch = startup.resume_epoch; epoch < config.epochs; ++epoch) {
      const std::size_t first = epoch == startup.resume_epoch ? startup.resume_step : 0;
      for (std::size_t s = first; s < startup.train_steps; ++s, ++step) {
        const ipu::CycleBreakdown before = engine.cycles();
        engine.run("train");
        training += engine.cycles() - before;
        // The host mirrors these conditions (host_role.cpp); one due at the end of an epoch
        // waits for the evaluation.
        if (every > 0 && (step + 1) % every == 0 && s + 1 < startup.train_steps) send_checkpoint();
      }
      if (client) client->send({kCycleFrames, step, cycles_array(training)});
      for (std::size_t t = 0; t < startup.test_steps; ++t) engine.run("eval");
      if (every > 0 && (step % every == 0 || epoch + 1 == config.epochs)) send_checkpoint();
    }

    finish_sends(true);
    nlohmann::json report_json = memory_report_json(engine.memory(), arch);
    report_json["stage"] = stage;
    report_json["stash_slots"] = compiled.stash_slots;
    report_json["parameter_tensors"] = compiled.parameters.size();
    if (stage > 0) {  // later stages report their memory through the first one
      send_text(report_json.dump(), 0, kStageReportTag, pipeline_comm);
    } else {
      nlohmann::json later = nlohmann::json::array();
      for (std::size_t s = 1; s < config.stages; ++s)
        later.push_back(nlohmann::json::parse(
            receive_text(static_cast<int>(s), kStageReportTag, pipeline_comm)));
      if (!later.empty()) report_json["later_stages"] = std::move(later);
      report_json["trace"] = trace_json(engine.trace(), arch);
      const std::string report = report_json.dump();
      client->send({kReportFrames, step,
                    array_of(host::DType::u8, {report.size()}, std::as_bytes(std::span(report)))});
      for (const auto& [id, tensor] : compiled.parameters) {
        const std::vector<float> values = engine.read_values(tensor);  // float32 for the host
        client->send(
            {kWeightFrames, static_cast<std::uint64_t>(id),
             array_of(host::DType::f32, tensor.shape(), std::as_bytes(std::span(values)))});
      }
    }
  } catch (const std::exception& e) {
    abort_job(world, e.what());
  }
  if (client) client->close();
  MPI_Comm_free(&pipeline_comm);
  MPI_Comm_free(&replicas_comm);
  return 0;
}

}  // namespace ipupod::pod
