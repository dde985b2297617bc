// What the host and IPU ranks of one training job agree on: the start-up record the host
// broadcasts over MPI, and the ids of the streams that travel over TCP.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

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
  std::size_t train_steps = 0;  // host steps per epoch, per replica
  std::size_t test_steps = 0;   // evaluation micro-batches per replica
  // Resuming: where the checkpoint stands (the next step to run) and what it holds.
  bool resume = false;
  std::size_t resume_epoch = 0, resume_step = 0;  // step within the epoch
  std::uint64_t resume_host_step = 0;             // host steps done
  std::vector<std::uint64_t> resume_cycles;       // predicted training cycles so far, by kind
  std::map<std::string, std::vector<std::size_t>> resume_shapes;  // tensor name -> shape
};

// Collective over `comm`: root fills `startup`, every rank returns the root's record.
Startup broadcast_startup(const Startup& startup, int root, MPI_Comm comm);

// A text (JSON reports, manifests) from one rank to another, its length found on arrival.
void send_text(const std::string& text, int to, int tag, MPI_Comm comm);
std::string receive_text(int from, int tag, MPI_Comm comm);

}  // namespace ipupod::pod
