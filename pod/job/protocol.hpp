// The one protocol of a training job that the host rank and the IPU ranks both call: where each
// rank sits, the start-up record and the start verdict over MPI, the ids and expected shapes of
// the frames that travel over TCP, the checkpoint schedule and the cycle records. Each side's
// half of a step lives here beside the other's, so the two cannot drift apart.
//
// The ranks come in blocks, one per host instance (--host-instances I, one per node in a real
// launch): host instance i, then the IPUs of its R/I replicas, stage by stage. With I = 1: the
// host is rank 0 and IPU (r, s) is rank 1 + r x S + s. Each instance streams to its own replicas;
// instance 0 (rank 0) also gathers what the others received and writes the run directory.
//
//   host instance (first rank of a block)      IPU ranks of its block (replica r, stage s)
//   start_verdict     <------------------------> start_verdict (a host's data or resume fault)
//   IpuGroups         <------------------------> IpuGroups (replica groups, hosts, blocks)
//   broadcast_startup ------------------------> (stream address, secret, data shape) per block
//                                               compile, initialise, check a resumed checkpoint
//   start_verdict     <------------------------> start_verdict (IPU 0 tells what failed)
//   accept stream clients <-------------------- stage 0 of each replica connects (TCP)
//   start_verdict     <------------------------> start_verdict (an IPU that could not connect
//                                                 tells why, before the host's own timeout)
//   [resume: checkpoint tensors] -------------> stage 0 (relayed to later stages)
//   per host step: input + label frames ------> per micro-batch; loss frames <------
//   [checkpoint due: manifest + tensors] <----- replica 0
//   per epoch: cycle frame <------------------- ; test inputs + labels ----> logits + loss <--
//   at the end: report frame, weight frames <-- stage 0 of each replica
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "host/stream_client.hpp"
#include "host/stream_server.hpp"
#include "ipu_process/engine.hpp"
#include "pod/compiler/model_options.hpp"
#include "pod/config.hpp"

namespace ipupod::pod {

enum StreamId : std::uint16_t {
  kInputFrames = 1,   // host -> IPU: one micro-batch of inputs
  kLabelFrames = 2,   // host -> IPU: its labels
  kLossFrames = 3,    // IPU -> host: mean loss of a micro-batch
  kLogitsFrames = 4,  // IPU -> host: evaluation outputs
  kCycleFrames = 5,   // IPU -> host: predicted cycles of training so far (per category)
  kReportFrames = 6,  // IPU -> host: the IPU's memory report (JSON text)
  kWeightFrames = 7,  // IPU -> host: final weights, one frame per parameter
  // IPU -> host (replica 0, when a checkpoint is due): a JSON manifest (tensor names in order,
  // predicted cycles so far), then one frame per tensor. Host -> IPU (on resume, before any
  // data): the checkpoint's tensors in name order.
  kCheckpointFrames = 8,
};

// Where an IPU rank sits in the job (the block layout above).
struct IpuPlace {
  int stage = 0, replica = 0;
  int ipu = 0;  // index among the IPUs: replica x stages + stage
};
IpuPlace ipu_place(const TrainConfig& config, int rank);
// The world rank of IPU (replica, stage), of the host instance that serves a replica's streams,
// and whether a rank is a host instance (and which).
int ipu_rank(const TrainConfig& config, std::size_t replica, std::size_t stage);
int host_rank_of(const TrainConfig& config, std::size_t replica);
bool is_host_rank(const TrainConfig& config, int rank);
std::size_t instance_of(const TrainConfig& config, int rank);
// "host", "host instance i" or "IPU n" (error messages).
std::string rank_role(const TrainConfig& config, int rank);

// Sent by the host (rank 0) to every rank before anything else. A non-zero status means the
// job cannot start: every rank exits with that status, the host prints the message.
struct Startup {
  int status = 0;
  std::string message;
  std::string address;
  std::uint16_t port = 0;
  std::string secret;
  std::vector<std::size_t> sample_shape;
  std::size_t classes = 0;
  std::vector<std::size_t> target_shape;  // one sample's targets (labels: empty)
  std::size_t train_steps = 0;            // host steps per epoch, per replica
  std::size_t test_steps = 0;             // evaluation micro-batches per replica
  // Resuming: where the checkpoint stands (the next step to run) and what it holds.
  bool resume = false;
  std::size_t resume_epoch = 0, resume_step = 0;  // step within the epoch
  std::uint64_t resume_host_step = 0;             // host steps done
  std::vector<std::uint64_t> resume_cycles;       // predicted training cycles so far, by kind
  std::map<std::string, std::vector<std::size_t>> resume_shapes;  // tensor name -> shape

  DataShape data_shape() const { return {sample_shape, classes, train_steps, target_shape}; }
};

// Collective over `comm`: root fills `startup`, every rank returns the root's record.
Startup broadcast_startup(const Startup& startup, int root, MPI_Comm comm);

// The job's communicators, split from the world by every rank at once (collective): for an
// IPU, the replicas of its stage (the gradient all-reduce); for a host instance, the host
// instances (rank i is instance i); for every rank, its block (the host instance is rank 0).
// Every rank of a job that cannot start gets MPI_COMM_NULL. Freed with the object.
class IpuGroups {
 public:
  IpuGroups(MPI_Comm world, const TrainConfig& config, bool starts);
  ~IpuGroups();
  IpuGroups(const IpuGroups&) = delete;
  IpuGroups& operator=(const IpuGroups&) = delete;
  MPI_Comm replicas() const { return replicas_; }
  MPI_Comm hosts() const { return hosts_; }
  MPI_Comm block() const { return block_; }

 private:
  MPI_Comm replicas_ = MPI_COMM_NULL, hosts_ = MPI_COMM_NULL, block_ = MPI_COMM_NULL;
};

// Before anything else (the host instances' data and resume checks), after every IPU compiled
// (and checked a resumed checkpoint), and again once the streams are connected: the worst
// status of all ranks (collective over the world). Each rank gives its own; the message of the
// lowest IPU rank with the worst status (a host's only when no IPU has one: an IPU's fault is
// the cause, the host's the consequence; then the lowest such host's) reaches rank 0, which
// returns it in *host_message.
int start_verdict(MPI_Comm world, bool host, int status, const std::string& message,
                  std::string* host_message = nullptr);
// After a start verdict against the job (collective over the world): when some IPU's program
// does not fit its tiles (compiled with --allow-out-of-memory), every IPU sends the host its
// memory report and rank 0 returns them in IPU order; otherwise nothing is sent and the
// result is empty. The host instances pass unfit = false and no report.
std::vector<nlohmann::json> gather_unfit_reports(MPI_Comm world, const TrainConfig& config,
                                                 bool unfit, const nlohmann::json& report = {});

// A text (JSON reports, manifests) from one rank to another, its length found on arrival.
void send_text(const std::string& text, int to, int tag, MPI_Comm comm);
std::string receive_text(int from, int tag, MPI_Comm comm);

// Micro-batches a replica runs per host step (one run of the training program): it takes an
// input and a label frame for each and sends a loss frame for each.
std::size_t micro_batches_per_host_step(const TrainConfig& config);

// The checkpoint schedule, by host steps done (counted over the whole run): every
// --checkpoint-every steps within an epoch, except that one due at the end of an epoch waits for
// the evaluation; and at the end of the run.
bool checkpoint_due_within_epoch(const TrainConfig& config, std::uint64_t steps_done,
                                 std::size_t step_in_epoch, std::size_t train_steps);
bool checkpoint_due_after_epoch(const TrainConfig& config, std::uint64_t steps_done,
                                std::size_t epoch);

// The step boundaries at which every rank asks whether to stop (agree_to_stop), after the
// checkpoint due there if any: after each training step but an epoch's last, and after each
// epoch's evaluation but the run's last.
bool stop_boundary_within_epoch(std::size_t step_in_epoch, std::size_t train_steps);
bool stop_boundary_after_epoch(std::size_t epoch, std::size_t epochs);

// The frame a host receives from a replica, checked to be of the stream expected.
host::Frame expect_frame(host::StreamServer& server, std::size_t replica, StreamId id);
// The next frame an IPU takes into a device stream buffer, checked to be of the stream and size
// expected. `f` is kept between calls so that its payload buffer is reused for later frames.
void take_frame(host::StreamClient& client, StreamId expected, std::span<std::byte> dst,
                host::Frame& f);

// Predicted cycles by category (compute, exchange, sync, host, fabric) as a frame's array, and back
// (their sum; the parts to *parts).
constexpr std::size_t kCycleKinds = 5;
host::HostArray cycles_array(const ipu::CycleBreakdown& cycles);
std::uint64_t cycles_total(const host::HostArray& array, std::vector<std::uint64_t>* parts);
ipu::CycleBreakdown cycles_from(const std::vector<std::uint64_t>& parts);
std::vector<std::uint64_t> cycle_parts(const ipu::CycleBreakdown& cycles);

// A JSON text (report, manifest) as a frame's array of bytes, and back.
host::HostArray text_array(const std::string& text);
nlohmann::json parse_text_array(const host::HostArray& array);

}  // namespace ipupod::pod
