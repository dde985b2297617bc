// The host/IPU protocol of a training job: start-up record, start verdict, frames, schedule.
#include "pod/job/protocol.hpp"

#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace ipupod::pod {
namespace {

// MPI tags of the start-up texts (the world communicator carries nothing else then).
constexpr int kVerdictTag = 11;
constexpr int kUnfitReportTag = 12;

}  // namespace

Startup broadcast_startup(const Startup& s, int root, MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string text;
  if (rank == root)
    text = nlohmann::json{{"status", s.status},
                          {"message", s.message},
                          {"address", s.address},
                          {"port", s.port},
                          {"secret", s.secret},
                          {"sample_shape", s.sample_shape},
                          {"classes", s.classes},
                          {"target_shape", s.target_shape},
                          {"train_steps", s.train_steps},
                          {"test_steps", s.test_steps},
                          {"resume", s.resume},
                          {"resume_epoch", s.resume_epoch},
                          {"resume_step", s.resume_step},
                          {"resume_host_step", s.resume_host_step},
                          {"resume_cycles", s.resume_cycles},
                          {"resume_shapes", s.resume_shapes}}
               .dump();
  unsigned long long length = text.size();
  MPI_Bcast(&length, 1, MPI_UNSIGNED_LONG_LONG, root, comm);
  text.resize(length);
  MPI_Bcast(text.data(), static_cast<int>(length), MPI_CHAR, root, comm);
  const auto j = nlohmann::json::parse(text);
  Startup out;
  out.status = j.at("status");
  out.message = j.at("message");
  out.address = j.at("address");
  out.port = j.at("port");
  out.secret = j.at("secret");
  out.sample_shape = j.at("sample_shape").get<std::vector<std::size_t>>();
  out.classes = j.at("classes");
  out.target_shape = j.at("target_shape").get<std::vector<std::size_t>>();
  out.train_steps = j.at("train_steps");
  out.test_steps = j.at("test_steps");
  out.resume = j.at("resume");
  out.resume_epoch = j.at("resume_epoch");
  out.resume_step = j.at("resume_step");
  out.resume_host_step = j.at("resume_host_step");
  out.resume_cycles = j.at("resume_cycles").get<std::vector<std::uint64_t>>();
  out.resume_shapes = j.at("resume_shapes").get<std::map<std::string, std::vector<std::size_t>>>();
  return out;
}

void send_text(const std::string& text, int to, int tag, MPI_Comm comm) {
  MPI_Send(text.data(), static_cast<int>(text.size()), MPI_CHAR, to, tag, comm);
}

std::string receive_text(int from, int tag, MPI_Comm comm) {
  MPI_Status status;
  MPI_Probe(from, tag, comm, &status);
  int n = 0;
  MPI_Get_count(&status, MPI_CHAR, &n);
  std::string text(static_cast<std::size_t>(n), '\0');
  MPI_Recv(text.data(), n, MPI_CHAR, from, tag, comm, MPI_STATUS_IGNORE);
  return text;
}

namespace {
// Ranks per block: a host instance and the IPUs of its replicas.
std::size_t block_size(const TrainConfig& config) {
  return 1 + config.replicas_per_instance() * config.stages;
}
}  // namespace

IpuPlace ipu_place(const TrainConfig& config, int rank) {
  const std::size_t block = static_cast<std::size_t>(rank) / block_size(config);
  const std::size_t local = static_cast<std::size_t>(rank) % block_size(config) - 1;
  IpuPlace place;
  place.stage = static_cast<int>(local % config.stages);
  place.replica = static_cast<int>(block * config.replicas_per_instance() + local / config.stages);
  place.ipu = place.replica * static_cast<int>(config.stages) + place.stage;
  return place;
}

int ipu_rank(const TrainConfig& config, std::size_t replica, std::size_t stage) {
  const std::size_t local = replica % config.replicas_per_instance();
  return host_rank_of(config, replica) + 1 + static_cast<int>(local * config.stages + stage);
}

int host_rank_of(const TrainConfig& config, std::size_t replica) {
  return static_cast<int>(replica / config.replicas_per_instance() * block_size(config));
}

bool is_host_rank(const TrainConfig& config, int rank) {
  return static_cast<std::size_t>(rank) % block_size(config) == 0;
}

std::size_t instance_of(const TrainConfig& config, int rank) {
  return static_cast<std::size_t>(rank) / block_size(config);
}

std::string rank_role(const TrainConfig& config, int rank) {
  if (!is_host_rank(config, rank)) return "IPU " + std::to_string(ipu_place(config, rank).ipu);
  if (config.host_instances == 1) return "host";
  return "host instance " + std::to_string(instance_of(config, rank));
}

IpuGroups::IpuGroups(MPI_Comm world, const TrainConfig& config, bool starts) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  const bool host = is_host_rank(config, rank);
  // Replica group of each stage (the gradient all-reduce); the hosts take no part.
  const int colour = starts && !host ? ipu_place(config, rank).stage : MPI_UNDEFINED;
  MPI_Comm_split(world, colour, rank, &replicas_);
  MPI_Comm_split(world, starts && host ? 0 : MPI_UNDEFINED, rank, &hosts_);
  const int block = starts ? static_cast<int>(instance_of(config, rank)) : MPI_UNDEFINED;
  MPI_Comm_split(world, block, rank, &block_);
}

IpuGroups::~IpuGroups() {
  for (MPI_Comm* comm : {&replicas_, &hosts_, &block_})
    if (*comm != MPI_COMM_NULL) MPI_Comm_free(comm);
}

int start_verdict(MPI_Comm world, bool host, int status, const std::string& message,
                  std::string* host_message) {
  int rank = 0, verdict = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Allreduce(&status, &verdict, 1, MPI_INT, MPI_MAX, world);
  if (verdict == 0) return 0;
  // The lowest IPU rank with the worst status, else the lowest such host, says why: rank 0
  // prints one message, whichever rank found the fault.
  struct {
    int kind, rank;  // 0: IPU, 1: host, 2: nobody (not the worst status)
  } candidate{status != verdict ? 2 : host ? 1 : 0, rank}, teller{};
  MPI_Allreduce(&candidate, &teller, 1, MPI_2INT, MPI_MINLOC, world);
  if (rank == teller.rank && rank != 0) send_text(message, 0, kVerdictTag, world);
  if (rank == 0 && host_message)
    *host_message = teller.rank == 0 ? message : receive_text(teller.rank, kVerdictTag, world);
  return verdict;
}

std::vector<nlohmann::json> gather_unfit_reports(MPI_Comm world, const TrainConfig& config,
                                                 bool unfit, const nlohmann::json& report) {
  int rank = 0, own = unfit ? 1 : 0, any = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Allreduce(&own, &any, 1, MPI_INT, MPI_MAX, world);
  std::vector<nlohmann::json> reports;
  if (any == 0) return reports;
  if (!is_host_rank(config, rank)) {
    send_text(report.dump(), 0, kUnfitReportTag, world);
    return reports;
  }
  if (rank != 0) return reports;
  for (std::size_t ipu = 0; ipu < config.ipus(); ++ipu) {
    const int from = ipu_rank(config, ipu / config.stages, ipu % config.stages);
    reports.push_back(nlohmann::json::parse(receive_text(from, kUnfitReportTag, world)));
  }
  return reports;
}

std::size_t micro_batches_per_host_step(const TrainConfig& config) {
  return config.gradient_accumulation * config.device_iterations;
}

bool checkpoint_due_within_epoch(const TrainConfig& config, std::uint64_t steps_done,
                                 std::size_t step_in_epoch, std::size_t train_steps) {
  const std::size_t every = config.checkpoint_every;
  return every > 0 && steps_done % every == 0 && step_in_epoch + 1 < train_steps;
}

bool checkpoint_due_after_epoch(const TrainConfig& config, std::uint64_t steps_done,
                                std::size_t epoch) {
  const std::size_t every = config.checkpoint_every;
  return every > 0 && (steps_done % every == 0 || epoch + 1 == config.epochs);
}

bool stop_boundary_within_epoch(std::size_t step_in_epoch, std::size_t train_steps) {
  return step_in_epoch + 1 < train_steps;
}

bool stop_boundary_after_epoch(std::size_t epoch, std::size_t epochs) {
  return epoch + 1 < epochs;
}

host::Frame expect_frame(host::StreamServer& server, std::size_t replica, StreamId id) {
  host::Frame f = server.receive(replica);
  if (f.stream != id)
    throw std::runtime_error("replica " + std::to_string(replica) + " sent stream " +
                             std::to_string(f.stream) + " where stream " + std::to_string(id) +
                             " was expected");
  return f;
}

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

std::vector<std::uint64_t> cycle_parts(const ipu::CycleBreakdown& c) {
  return {c.compute, c.exchange, c.sync, c.host, c.fabric};
}

ipu::CycleBreakdown cycles_from(const std::vector<std::uint64_t>& c) {
  ipu::CycleBreakdown out;
  if (c.size() != kCycleKinds) return out;
  out.compute = c[0], out.exchange = c[1], out.sync = c[2];
  out.host = c[3], out.fabric = c[4];
  return out;
}

host::HostArray cycles_array(const ipu::CycleBreakdown& c) {
  const std::vector<std::uint64_t> values = cycle_parts(c);
  host::HostArray a = host::HostArray::zeros(host::DType::u32, {kCycleKinds, 2});
  auto out = a.as<std::uint32_t>();
  for (std::size_t i = 0; i < kCycleKinds; ++i) {
    out[2 * i] = static_cast<std::uint32_t>(values[i] >> 32);
    out[2 * i + 1] = static_cast<std::uint32_t>(values[i] & 0xffffffffu);
  }
  return a;
}

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

host::HostArray text_array(const std::string& text) {
  host::HostArray a;
  a.dtype = host::DType::u8;
  a.shape = {text.size()};
  const auto bytes = std::as_bytes(std::span(text));
  a.bytes.assign(bytes.begin(), bytes.end());
  return a;
}

nlohmann::json parse_text_array(const host::HostArray& array) {
  const auto text = array.as<const std::uint8_t>();
  return nlohmann::json::parse(text.begin(), text.end());
}

}  // namespace ipupod::pod
