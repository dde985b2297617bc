// Role dispatch and the failure policy of a training job: bad input exits 2 on every rank,
// a runtime failure after start-up aborts the whole MPI job with the message on stderr.
#include "pod/job/train.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "pod/job/protocol.hpp"
#include "pod/job/stop_signal.hpp"

namespace ipupod::pod {
namespace {
// The running job's options: abort_job names the failing rank's role with them.
const TrainConfig* running_job = nullptr;
}  // namespace

int run_train(const TrainConfig& config, MPI_Comm world) {
  int rank = 0, size = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  try {
    validate(config, size);
  } catch (const UsageError& e) {
    if (rank == 0) std::cerr << "ipupod train: " << e.what() << "\n";
    return 2;
  }
  install_stop_signals();  // every rank stops at the same step boundary (stop_signal.hpp)
  try {
    running_job = &config;
    return is_host_rank(config, rank) ? run_host(config, world) : run_ipu(config, world);
  } catch (const std::exception& e) {
    abort_job(world, e.what());
  }
}

void abort_job(MPI_Comm world, const std::string& what) {
  // Several threads of a rank (the host's feeders) can fail at once: the first says why and
  // ends the job; the others wait for the end instead of calling MPI_Abort again.
  static std::atomic<bool> aborting{false};
  if (aborting.exchange(true))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  // One write: mpirun forwards a rank's stderr in the pieces it was written in, and its own
  // MPI_ABORT notice can land between them.
  const std::string role = running_job ? rank_role(*running_job, rank) : "";
  const std::string message = "ipupod train: error on rank " + std::to_string(rank) +
                              (role.empty() ? "" : " (" + role + ")") + ": " + what + "\n";
  std::cerr << message << std::flush;
  MPI_Abort(world, 1);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

}  // namespace ipupod::pod
